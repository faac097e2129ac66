"""The Gradients row: the global and the largest layer gradient norms, loss scale and overflows, LayerNorm drift."""

from __future__ import annotations

from ms_exporter.core import catalogue as c
from ms_exporter.core.thresholds import Thresholds
from ms_exporter.generate.panels.panel import RATE, SELECTOR, Query, Row, TimeSeries


def row(t: Thresholds) -> Row:
    return Row(
        "Gradients",
        (
            TimeSeries(
                "Global gradient norm",
                "none",
                (Query(f"{c.GRAD_NORM.name}{{{SELECTOR}}}", "rank {{rank}}"),),
                width=6,
                height=8,
                above=t.grad_norm_high,
            ),
            TimeSeries(
                "Top layer gradient norms",
                "none",
                (Query(f"topk(5, {c.LAYER_GRAD_NORM.name}{{{SELECTOR}}})", "{{layer}} rank {{rank}}"),),
                width=6,
                height=8,
            ),
            TimeSeries(
                "Loss scale and overflows",
                "none",
                (
                    Query(f"{c.LOSS_SCALE.name}{{{SELECTOR}}}", "scale rank {{rank}}"),
                    Query(f"increase({c.OVERFLOW_STEPS.name}{{{SELECTOR}}}[{RATE}])", "overflows rank {{rank}}"),
                ),
                width=6,
                height=8,
            ),
            TimeSeries(
                "LayerNorm scale drift",
                "percentunit",
                (Query(f"{c.LAYERNORM_DRIFT.name}{{{SELECTOR}}}", "{{layer}} rank {{rank}}"),),
                width=6,
                height=8,
                above=t.layernorm_drift,
            ),
        ),
    )
