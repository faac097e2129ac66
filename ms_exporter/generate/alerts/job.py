"""Alerts on the job as a whole, read from recorded series: too little of its time training, a rank whose weights
left its replica group, too little of the accelerators' peak used."""

from __future__ import annotations

from ms_exporter.core import catalogue as c
from ms_exporter.core.thresholds import Thresholds
from ms_exporter.generate.alerts.alert import WHO, Alert, number
from ms_exporter.generate.timing import Timing


def alerts(t: Thresholds, w: Timing) -> tuple[Alert, ...]:
    agreeing = c.RANK_REPLICAS_AGREEING
    return (
        # Only for a project that already reported an hour ago: a job's first minutes, all startup and compilation,
        # are not an hour of low goodput. A crash loop that keeps restarting still pages.
        Alert(
            "MindSporeTrainingGoodputLow",
            expr=f"({c.PROJECT_GOODPUT_1H} < {number(t.goodput_low)}) and on (project) "
            f"(count by (project) (present_over_time({c.RUN_TIME_SECONDS.name}"
            f'{{bucket="{c.PRODUCTIVE}"}}[10m] offset 55m)))',
            for_=w.goodput_for,
            severity="warning",
            summary="The job spends too little of its time training",
            description=f"Only {{{{ $value | humanizePercentage }}}} of the last hour of project "
            f"{{{{ $labels.project }}}} (all ranks) advanced training, below {number(t.goodput_low)}; "
            f"{c.TIME_SECONDS.name} says where the rest went.",
        ),
        # A rank held by fewer of its group than the most common fingerprint, or, where no fingerprint has a
        # majority (two ranks that differ), every rank of the group (core/analysis/replicas.py's disagreeing, in
        # Python).
        Alert(
            "MindSporeTrainingReplicaDivergence",
            expr=_named_in_group(agreeing, "project, replica_group"),
            for_=w.spike_for,
            severity="critical",
            summary="A rank's weights left its replica group",
            description=f"The parameters of {WHO} (replica group {{{{ $labels.replica_group }}}}) are no longer "
            f"those of its replicas: its fingerprint {{{{ $labels.verdict }}}} (it is shared by "
            f"{{{{ $value | humanizePercentage }}}} of the group).",
        ),
        # The replica checks' buckets, compared the same way (docs/sdc.md): the kind (weights, optimizer) and the
        # bucket that differ. Alertmanager's inhibition keeps ReplicaDivergence quiet for the same rank meanwhile.
        Alert(
            "MindSporeTrainingSilentDataCorruption",
            expr=_named_in_group(c.RANK_CHECKSUMS_AGREEING, "project, replica_group, kind, bucket"),
            for_=w.spike_for,
            severity="critical",
            summary="A rank's weights or optimizer state held other bits than its replicas",
            description=f"Bucket {{{{ $labels.bucket }}}} of the {{{{ $labels.kind }}}} of {WHO} (replica group "
            f"{{{{ $labels.replica_group }}}}) held other bits than its replicas at some step up to the last "
            f"fingerprint step: it {{{{ $labels.verdict }}}} (its checksum is shared by "
            f"{{{{ $value | humanizePercentage }}}} of the group). GET /debug/checksums on the group's ranks names "
            f"the step and the tensor.",
        ),
        # A corrupted local gradient reaches every replica through the all-reduce: no checksum differs, only the
        # norm of the rank it happened on was an outlier (docs/sdc.md#local-gradients). One outlier pages.
        Alert(
            "MindSporeTrainingSilentDataCorruption",
            expr=f'label_replace(increase({c.LOCAL_GRAD_OUTLIERS.name}[15m]) > 0, "kind", "local_gradients", "", "")',
            for_=w.spike_for,
            severity="critical",
            summary="A rank's local gradient was corrupted before the all-reduce",
            description=f"The norm of the gradients {WHO} (replica group {{{{ $labels.replica_group }}}}) computed "
            f"was an outlier against its own history at {{{{ $value | humanize }}}} step(s) of the last 15 minutes "
            f"(the last: {c.LOCAL_GRAD_OUTLIER_STEP.name}): every replica applied it. The rank's log names the step.",
        ),
        # Only where flops.alert_below is set.
        *(
            ()
            if t.mfu_low is None
            else (
                Alert(
                    "MindSporeTrainingMfuLow",
                    expr=f"{c.PROJECT_MFU} < {number(t.mfu_low)}",
                    for_=w.slow_for,
                    severity="warning",
                    summary="The job uses too little of its accelerators' peak",
                    description=f"Project {{{{ $labels.project }}}} runs at {{{{ $value | humanizePercentage }}}} "
                    f"model FLOPs utilisation (its ranks' model FLOPs per second over their devices' peak), below "
                    f"{number(t.mfu_low)} for {w.slow_for}.",
                ),
            )
        ),
    )


def _named_in_group(agreeing: str, group: str) -> str:
    """The ranks core/analysis/replicas.py's `disagreeing` names, from a share of the group that agrees with each: a
    rank held by fewer of its group than the most common value, or, where no value has a majority (two ranks that
    differ), every rank of the group; the `verdict` label says which."""
    return (
        f"label_replace({agreeing} < on ({group}) group_left () max by ({group}) ({agreeing}), "
        f'"verdict", "differs from the majority of its group", "", "")'
        f" or label_replace({agreeing} <= 0.5 and on ({group}) (max by ({group}) ({agreeing}) <= 0.5), "
        f'"verdict", "has no majority in its group: its ranks disagree, so each of them is named", "", "")'
    )
