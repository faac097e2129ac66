"""The Throughput row: tokens and samples per second, step time and data wait quantiles, MFU and model FLOPs."""

from __future__ import annotations

from ms_exporter.core import catalogue as c
from ms_exporter.core.thresholds import Thresholds
from ms_exporter.generate.panels.panel import RATE, SELECTOR, Query, Row, TimeSeries

_STEP_BUCKETS = f"sum by (le, rank) (rate({c.STEP_DURATION.bucket}{{{SELECTOR}}}[{RATE}]))"
_WAIT_BUCKETS = f"sum by (le, rank) (rate({c.DATA_WAIT.bucket}{{{SELECTOR}}}[{RATE}]))"


def row(t: Thresholds) -> Row:
    return Row(
        "Throughput",
        (
            TimeSeries(
                "Tokens per second",
                "suffix: tokens/s",
                (Query(f"{c.TOKENS_PER_SECOND.name}{{{SELECTOR}}}", "rank {{rank}}"),),
                width=6,
                height=8,
                below=t.tokens_per_second_low,
            ),
            TimeSeries(
                "Samples per second",
                "suffix: samples/s",
                (Query(f"{c.SAMPLES_PER_SECOND.name}{{{SELECTOR}}}", "rank {{rank}}"),),
                width=6,
                height=8,
            ),
            TimeSeries(
                "Step time p50 / p95",
                "s",
                (
                    Query(f"histogram_quantile(0.5, {_STEP_BUCKETS})", "p50 rank {{rank}}"),
                    Query(f"histogram_quantile(0.95, {_STEP_BUCKETS})", "p95 rank {{rank}}"),
                ),
                width=6,
                height=8,
            ),
            TimeSeries(
                "Data wait p95",
                "s",
                (Query(f"histogram_quantile(0.95, {_WAIT_BUCKETS})", "rank {{rank}}"),),
                width=6,
                height=8,
                description="Time between steps: a stalled data loader shows here first.",
            ),
            TimeSeries(
                "Model FLOPs utilisation",
                "percentunit",
                (
                    Query(f"{c.MFU.name}{{{SELECTOR}}}", "rank {{rank}}"),
                    Query(f'{c.PROJECT_MFU}{{project=~"$project"}}', "job {{project}}"),
                ),
                width=12,
                height=8,
                description="Model FLOPs per second over the device's peak (docs/mfu.md): FLOPs per token from "
                "monitor_config.flops (a model description, a stated figure, or 6N of the parameters: "
                f"{c.FLOPS_INFO.name} says which), the peak from flops.peak_flops_per_device. Padding and "
                "recomputation are not counted as work.",
                below=t.mfu_low,
            ),
            TimeSeries(
                "Model FLOPs per second",
                "flops",
                (
                    Query(f"{c.MODEL_FLOPS_PER_SECOND.name}{{{SELECTOR}}}", "rank {{rank}}"),
                    Query(f'{c.PROJECT_MODEL_FLOPS}{{project=~"$project"}}', "job {{project}}"),
                ),
                width=12,
                height=8,
                description="Tokens per second times model FLOPs per token (forward and backward).",
            ),
        ),
    )
