"""The Ranks row: which rank the job waits for, replica agreement, and what the monitor itself costs and absorbs."""

from __future__ import annotations

from ms_exporter.core import catalogue as c
from ms_exporter.generate.panels.panel import RATE, SELECTOR, Query, Row, TimeSeries

_STEP, _WAIT, _CYCLE = c.RANK_STEP_MEAN, c.RANK_WAIT_MEAN, c.RANK_CYCLE_MEAN

ROW = Row(
    "Ranks",
    (
        # In synchronous data parallel every rank's step cycle is the same and the ranks that wait for a slow one
        # show the long steps: the rank to look at is the one whose data wait is a large part of its cycle.
        TimeSeries(
            "Data wait share of the step cycle",
            "percentunit",
            (Query(f"{_WAIT}{{{SELECTOR}}} / {_CYCLE}{{{SELECTOR}}}", "rank {{rank}}"),),
            width=8,
            height=8,
            description="The rank a synchronous job waits for has the high share (MindSporeTrainingStraggler).",
        ),
        TimeSeries(
            "Step cycle per rank (step + data wait)",
            "s",
            (Query(f"{_CYCLE}{{{SELECTOR}}}", "rank {{rank}}"),),
            width=8,
            height=8,
            description="Equal on every rank of a synchronous job; a rank above the rest runs at its own, slower pace.",
        ),
        TimeSeries(
            "Mean step time and data wait per rank",
            "s",
            (
                Query(f"{_STEP}{{{SELECTOR}}}", "step rank {{rank}}"),
                Query(f"{_WAIT}{{{SELECTOR}}}", "data wait rank {{rank}}"),
            ),
            width=8,
            height=8,
            description="A long step can be time spent waiting in a collective for another rank.",
        ),
        TimeSeries(
            "Replicas holding the same weights",
            "percentunit",
            (
                Query(f"{c.RANK_REPLICAS_AGREEING}{{{SELECTOR}}}", "rank {{rank}} group {{replica_group}}"),
                Query(
                    f"min by (project, rank, replica_group, kind) ({c.RANK_CHECKSUMS_AGREEING}{{{SELECTOR}}})",
                    "rank {{rank}} group {{replica_group}} {{kind}}, every step",
                ),
            ),
            width=24,
            height=6,
            description="Per rank, the share of its replica group whose parameter fingerprint equals its own at the "
            "group's latest fingerprint step (docs/divergence.md), and the least such share of the buckets of its "
            "weights and of its optimizer state, checked at every step since the comparison before (docs/sdc.md): "
            "100% while the replicas agree; the rank below the rest left its group "
            "(MindSporeTrainingReplicaDivergence, MindSporeTrainingSilentDataCorruption). Jobs of one rank have no "
            "replicas and no series here.",
            below=1.0,
        ),
        TimeSeries(
            "Monitor cost p99 per hook",
            "s",
            (
                Query(
                    f"histogram_quantile(0.99, sum by (le, hook) (rate({c.HOOK_DURATION.bucket}{{{SELECTOR}}}"
                    f"[{RATE}])))",
                    "{{hook}}",
                ),
            ),
            width=12,
            height=7,
        ),
        TimeSeries(
            "Monitor errors absorbed",
            "none",
            (Query(f"increase({c.ERRORS.name}{{{SELECTOR}}}[{RATE}])", "{{component}} rank {{rank}}"),),
            width=12,
            height=7,
        ),
    ),
)
