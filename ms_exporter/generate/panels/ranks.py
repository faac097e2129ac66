"""The Ranks row: which rank the job waits for, replica agreement, and what the monitor itself costs and absorbs."""

from __future__ import annotations

from ms_exporter.core import catalogue as c
from ms_exporter.core.thresholds import Thresholds
from ms_exporter.generate.panels.panel import RATE, SELECTOR, Query, Row, TimeSeries

_STEP, _WAIT, _CYCLE = c.RANK_STEP_MEAN, c.RANK_WAIT_MEAN, c.RANK_CYCLE_MEAN


def row(t: Thresholds) -> Row:
    return Row(
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
                description="Equal on every rank of a synchronous job; a rank above the rest runs at its own, slower "
                "pace.",
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
                "Slowness scores",
                "percentunit",
                (
                    Query(f"{c.RANK_RELATIVE_SLOWNESS}{{{SELECTOR}}}", "relative rank {{rank}}"),
                    Query(f"{c.SLOWNESS_SCORE.name}{{{SELECTOR}}}", "individual rank {{rank}}"),
                ),
                width=12,
                height=8,
                description="Per rank (docs/failslow.md): relative, the job's cycle over the one it would have were "
                "this rank's own work (data wait, host hooks) the best rank's; individual, its clean cycle over the "
                "one its own work makes now. 1 is as fast as can be; the rank the job waits for falls "
                "(MindSporeTrainingFailSlow under 0.95, where its detector flagged the slowdown).",
                below=t.failslow_relative,
            ),
            TimeSeries(
                "Fail-slow: flagged ranks and their onset step",
                "none",
                (
                    Query(
                        f"{c.FAILSLOW_ONSET_STEP.name}{{{SELECTOR}}} and on (job, instance) ({c.FAILSLOW.name} == 1)",
                        "onset step rank {{rank}}",
                    ),
                    Query(
                        f"{c.FAILSLOW_SIZE.name}{{{SELECTOR}}} and on (job, instance) ({c.FAILSLOW.name} == 1)",
                        "size rank {{rank}}",
                    ),
                    Query(f'{c.PROJECT_GROUP_FAILSLOW}{{project=~"$project"}} > 0', "flagged share {{kind}} {{group}}"),
                ),
                width=12,
                height=8,
                description="While a rank's detector flags a slowdown of its own work: the step it began (the change "
                "point) and its size as a share of the rank's clean cycle; and the share of each group of ranks "
                "(node, pipeline stage, model copy) flagged, 1 where the whole group slowed. Empty while no rank is "
                "flagged.",
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
                description="Per rank, the share of its replica group whose parameter fingerprint equals its own at "
                "the group's latest fingerprint step (docs/divergence.md), and the least such share of the buckets of "
                "its weights and of its optimizer state, checked at every step since the comparison before "
                "(docs/sdc.md): 100% while the replicas agree; the rank below the rest left its group "
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
