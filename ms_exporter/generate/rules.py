"""Prometheus recording and alerting rules, rendered from thresholds that follow the user's monitor_config.

`ms-exporter rules --config monitor.yaml > rules.yml`; the committed
deploy/prometheus/rules/mindspore-training.rules.yml is exactly what the defaults render.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

import yaml

from ms_exporter.core import catalogue as c
from ms_exporter.core.thresholds import Thresholds

RULES_FILE = "deploy/prometheus/rules/mindspore-training.rules.yml"
# Where runbook_url points when no --runbook-url or monitor_config.runbook_url is given: the repository's own copy.
RUNBOOK = "docs/alerts.md"


@dataclass(frozen=True)
class Timing:
    """Evaluation interval, windows and `for:` durations (docs/alerts.md#how-fast-an-alert-arrives gives each its
    reason). `TEST_TIMING` shrinks them so that integration tests fire in seconds."""

    evaluation: str = "10s"
    event_for: str = "0s"  # a counted event (a NaN loss): real the moment it is counted
    spike_for: str = "10s"  # an exploding gradient norm: two evaluations, so that one odd step does not page
    gone_for: str = "20s"  # a rank gone: several failed scrapes, not one slow one
    # Trends already measured over a window (loss scale: the overflow fraction of a minute; memory: the growth slope
    # of the last memory_window samples, 50 s by default): 30 s more of them is enough.
    trend_for: str = "30s"
    short_for: str = "1m"  # levels that are real once they last a minute (loss high, loss rising)
    long_for: str = "5m"  # warnings nobody need act on at once (gradient norm high, LR flat, LayerNorm drift)
    slow_for: str = "10m"  # throughput low and stragglers: a checkpoint or an evaluation pauses training briefly
    rate_window: str = "5m"
    events_window: str = "5m"  # how long a non-finite loss keeps its alert
    errors_window: str = "10m"
    overflow_window: str = "1m"
    # A rank that reported within this window, does not now and did not end normally is gone.
    reported_window: str = "1h"
    # ThroughputDrop: the last `drop_recent` against the best `drop_smooth` average of the `drop_baseline` before
    # it (the recent window left out, so the slow period never lowers its own baseline), for `drop_for`.
    drop_recent: str = "2m"
    drop_smooth: str = "5m"
    drop_baseline: str = "1h"
    drop_for: str = "1m"
    lr_flat_window: str = "30m"
    # GoodputLow: a whole hour's goodput below the threshold for this long (an hour that began with compilation
    # is low for a while at every start: the alert waits for the hour to be mostly training).
    goodput_for: str = "15m"


TEST_TIMING = Timing(
    evaluation="1s",
    event_for="0s",
    spike_for="1s",
    gone_for="2s",
    trend_for="2s",
    short_for="2s",
    long_for="3s",
    slow_for="3s",
    rate_window="10s",
    events_window="30s",
    errors_window="30s",
    overflow_window="20s",
    reported_window="10m",
    drop_recent="4s",
    drop_smooth="6s",
    drop_baseline="40s",
    drop_for="2s",
    lr_flat_window="20s",
    goodput_for="2s",
)

# Loss-scale collapse by overflow fraction needs this many steps in its window: a dynamic scaler overflows on its
# first steps by design (it starts high and halves), and with slow steps those few would be most of a minute.
OVERFLOW_MIN_STEPS = 20


def heading_anchor(heading: str) -> str:
    """The anchor GitHub, GitLab and Gitea give a Markdown heading (lower case; letters, digits, '-' and '_' kept,
    spaces to '-'): docs/alerts.md has a `## <alert name>` section per alert, so a page of it on any of them is a
    runbook whose links land on the alert's section."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def _number(value: float) -> str:
    # Short where that is exact (1.5, 10), every digit where it is not: the rule compares with the very number the
    # Python verdicts (`ms-exporter top`) use, and 2**20 / 60 is not 17476.3.
    short = f"{value:g}"
    return short if float(short) == value else repr(float(value))


# What the Pushgateway holds (monitor_config.pushgateway, scraped with honor_labels as shipped) has no `instance`
# and never goes stale: a job's last pushed numbers would keep alerts firing, and count as live ranks, long after
# the job ended. The rules read only series scraped from a rank's own endpoint, which always have an instance.
LIVE = 'instance!=""'
_RAW_METRIC = re.compile(rf"(?<![:\w])((?:{c.TRAIN_PREFIX}|{c.EXPORTER_PREFIX})\w+)(?![:\w])(\{{)?")


def live(expr: str) -> str:
    """`expr` with every raw mindspore_* selector limited to scraped series (recorded rule names stay as they are)."""
    return _RAW_METRIC.sub(
        lambda match: match.group(1) + ("{" + LIVE + "," if match.group(2) else "{" + LIVE + "}"), expr
    )


def _alert(
    name: str, expr: str, for_: str, severity: str, summary: str, description: str, runbook_base: str
) -> dict[str, Any]:
    return {
        "alert": name,
        "expr": expr,
        "for": for_,
        "labels": {"severity": severity},
        "annotations": {
            "summary": summary,
            "description": description,
            "runbook_url": f"{runbook_base}#{heading_anchor(name)}",
        },
    }


# Who and where, for every description; rank is missing only on `up`, which has the instance instead.
_WHO = "rank {{ $labels.rank }} of project {{ $labels.project }}"


def render_rules(
    thresholds: Thresholds | None = None,
    timing: Timing | None = None,
    job_regex: str = ".*mindspore.*",
    runbook_base: str = RUNBOOK,
) -> dict[str, Any]:
    """The rules file as data: one recording group and one alerting group."""
    t = thresholds or Thresholds()
    w = timing or Timing()
    step_mean = c.RANK_STEP_MEAN
    wait_mean = c.RANK_WAIT_MEAN
    cycle_mean = c.RANK_CYCLE_MEAN
    factor = _number(t.straggler_factor)
    recording = [
        {"record": c.PROJECT_LOSS_MEAN, "expr": f"avg by (project) ({c.LOSS.name})"},
        {"record": c.PROJECT_LOSS_MIN, "expr": f"min by (project) ({c.LOSS.name})"},
        {"record": c.PROJECT_LOSS_MAX, "expr": f"max by (project) ({c.LOSS.name})"},
        {"record": c.PROJECT_TOKENS_PER_SECOND, "expr": f"sum by (project) ({c.TOKENS_PER_SECOND.name})"},
        {"record": c.PROJECT_SAMPLES_PER_SECOND, "expr": f"sum by (project) ({c.SAMPLES_PER_SECOND.name})"},
        {
            "record": step_mean,
            "expr": f"rate({c.STEP_DURATION.sum}[{w.rate_window}]) / rate({c.STEP_DURATION.count}[{w.rate_window}])",
        },
        {"record": c.PROJECT_STEP_MAX, "expr": f"max by (project) ({step_mean})"},
        {"record": c.PROJECT_STEP_MEDIAN, "expr": f"quantile by (project) (0.5, {step_mean})"},
        {"record": c.PROJECT_RANKS_REPORTING, "expr": f"count by (project) ({c.INFO.name})"},
        # Per step, not per wait: in sink mode one wait covers a whole sink of steps.
        {
            "record": wait_mean,
            "expr": f"rate({c.DATA_WAIT.sum}[{w.rate_window}]) / rate({c.STEP_DURATION.count}[{w.rate_window}])",
        },
        # Step plus data wait: a rank's whole time per step. Equal on every rank of a synchronous job.
        {"record": cycle_mean, "expr": f"{step_mean} + {wait_mean}"},
        {"record": c.PROJECT_WAIT_MEDIAN, "expr": f"quantile by (project) (0.5, {wait_mean})"},
        {"record": c.PROJECT_CYCLE_MEDIAN, "expr": f"quantile by (project) (0.5, {cycle_mean})"},
        # From the run's totals, which go on across a restart where the process's own counters start again: the
        # time between a process's last scrape and its end, and the next one's start, is in the next reading.
        *(
            {
                "record": record,
                "expr": f"sum by (project) (increase({c.RUN_TIME_SECONDS.name}"
                f'{{bucket="{c.PRODUCTIVE}"}}[{window}]))'
                f" / sum by (project) (increase({c.RUN_TIME_SECONDS.name}[{window}]))",
            }
            for record, window in ((c.PROJECT_GOODPUT_1H, "1h"), (c.PROJECT_GOODPUT_24H, "24h"))
        ),
        {"record": c.RANK_REPLICAS_AGREEING, "expr": _agreeing()},
        {"record": c.PROJECT_MODEL_FLOPS, "expr": f"sum by (project) ({c.MODEL_FLOPS_PER_SECOND.name})"},
        # The job's MFU: the model FLOPs of the ranks that know their peak, over the sum of those peaks.
        {
            "record": c.PROJECT_MFU,
            "expr": f"sum by (project) ({c.MODEL_FLOPS_PER_SECOND.name} and on (job, instance) {c.MFU.name})"
            f" / sum by (project) ({c.PEAK_FLOPS.name} and on (job, instance) {c.MFU.name})",
        },
        {"record": c.PROJECT_MFU_MEAN, "expr": f"avg by (project) ({c.MFU.name})"},
    ]
    b = runbook_base
    # A rank past its hang deadline, valued in seconds, with the phase it is in as a label...
    past = (
        f"(({c.PHASE_SECONDS.name} > {c.HANG_DEADLINE.name})"
        f" * on (job, instance) group_left (phase) topk by (job, instance) (1, {c.PHASE.name} == 1))"
    )
    # ...unless it waits in `step` (in the collective) for a rank of its project that is in another phase within
    # that phase's deadline: rank 0 saving a checkpoint for 5 minutes holds the others in the next step's
    # all-reduce, past their learned deadline but not stopped. Once the rank they wait for is past its own
    # deadline, they count again.
    busy_elsewhere = (
        f"(({c.PHASE_SECONDS.name} <= {c.HANG_DEADLINE.name}) and on (job, instance) "
        f'({c.PHASE.name}{{phase!~"{c.STEP_PHASE}|{c.ENDED}"}} == 1))'
    )
    stopped = (
        f'({past} unless on (job, instance) (({c.PHASE.name}{{phase="{c.STEP_PHASE}"}} == 1)'
        f" and on (project) {busy_elsewhere}))"
    )
    # Each rank's current phase (ranks that ended left out), as a label.
    current = (
        f"(topk by (job, instance) (1, {c.PHASE.name} == 1)"
        f' unless on (job, instance) ({c.PHASE.name}{{phase="{c.ENDED}"}} == 1))'
    )
    # How many ranks of a project are in each phase now (all of them: ranks scraped a few seconds apart cross their
    # deadlines a few seconds apart, and the ones not yet past it still say where they are); `step` counts half a
    # rank more (ties).
    weights = (
        f"((count by (project, phase) ({current} and on (job, instance) "
        f'({c.PHASE.name}{{phase="{c.STEP_PHASE}"}} == 1)) + 0.5) or count by (project, phase) ({current}))'
    )
    # A rank that reported: any process of it served its always-present step counter within the window.
    reported = f"max by (job, instance, project, rank) (last_over_time({c.STEPS.name}[{w.reported_window}]))"
    # ...and one that ended normally: it served phase="ended" (it keeps serving until two scrapes read it).
    ended = (
        f"on (job, instance, project, rank) "
        f'(last_over_time({c.PHASE.name}{{phase="{c.ENDED}"}}[{w.reported_window}]) == 1)'
    )
    alerts = [
        _alert(
            "MindSporeTrainingLossNonFinite",
            f"increase({c.NONFINITE_LOSS.name}[{w.events_window}]) > 0",
            w.event_for,
            "critical",
            "Training loss became NaN or Inf",
            # increase() extrapolates to the window's edges: a count of steps is shown whole, never "619.8".
            f'{_WHO} had {{{{ printf "%.0f" $value }}}} steps with a NaN/Inf loss in the last {w.events_window}.',
            b,
        ),
        _alert(
            "MindSporeTrainingLossHigh",
            f"{c.LOSS.name} > {_number(t.loss_high)}",
            w.short_for,
            "warning",
            "Training loss is above its threshold",
            f"Loss of {_WHO} is {{{{ $value | humanize }}}}, above {_number(t.loss_high)}.",
            b,
        ),
        _alert(
            "MindSporeTrainingLossRising",
            f"{c.LOSS_RISING.name} >= {t.loss_rising_steps}",
            w.short_for,
            "warning",
            "Training loss keeps rising",
            f"Loss of {_WHO} rose {{{{ $value }}}} steps in a row.",
            b,
        ),
        _alert(
            "MindSporeTrainingGradNormHigh",
            f"{c.GRAD_NORM.name} > {_number(t.grad_norm_high)}",
            w.long_for,
            "warning",
            "Gradient norm is high",
            f"Gradient norm of {_WHO} is {{{{ $value | humanize }}}}, above {_number(t.grad_norm_high)}.",
            b,
        ),
        _alert(
            "MindSporeTrainingGradNormExploding",
            f"{c.GRAD_NORM.name} > {_number(t.grad_norm_exploding)}",
            w.spike_for,
            "critical",
            "Gradient norm is exploding",
            f"Gradient norm of {_WHO} is {{{{ $value | humanize }}}}, above {_number(t.grad_norm_exploding)}.",
            b,
        ),
        _alert(
            "MindSporeTrainingThroughputLow",
            f"{c.TOKENS_PER_SECOND.name} < {_number(t.tokens_per_second_low)}",
            w.slow_for,
            "warning",
            "Training throughput is low",
            f"{_WHO} processes {{{{ $value | humanize }}}} tokens/s, below {_number(t.tokens_per_second_low)}.",
            b,
        ),
        _alert(
            "MindSporeTrainingThroughputDrop",
            f"avg_over_time({c.TOKENS_PER_SECOND.name}[{w.drop_recent}]) < {_number(t.throughput_drop_ratio)}"
            f" * max_over_time(avg_over_time({c.TOKENS_PER_SECOND.name}[{w.drop_smooth}])"
            f"[{w.drop_baseline}:{w.drop_recent}] offset {w.drop_recent})",
            w.drop_for,
            "warning",
            "Training throughput dropped",
            f"{_WHO} processed {{{{ $value | humanize }}}} tokens/s over the last {w.drop_recent}, less than "
            f"{_number(t.throughput_drop_ratio)} of its best {w.drop_smooth} average in the {w.drop_baseline} "
            f"before.",
            b,
        ),
        # The phase a rank is stuck in comes along as a label: one phase series is 1 per rank (topk keeps one should a
        # scrape ever catch the hook between two of them).
        _alert(
            "MindSporeTrainingStalled",
            stopped,
            w.event_for,
            "critical",
            "Training has stalled",
            f"{_WHO} has been in phase {{{{ $labels.phase }}}} for {{{{ $value | humanizeDuration }}}}, longer "
            f"than its deadline ({c.HANG_DEADLINE.name}: hang.factor x its recent step cycle, "
            f"at least hang.min_seconds).",
            b,
        ),
        # The job's verdict (ms_exporter/tools/hangs.py says the same in Python): a rank past its deadline in a
        # phase fewer of its project's ranks are in (a tie goes against the ranks outside `step`, where the
        # collective is), or every rank when all the project's ranks are in one phase and all are past their
        # deadline. "All" matters: ranks are scraped seconds apart, and a rank whose last scrape predates the
        # block still shows the step it was in then, not yet the data wait it is stuck in.
        _alert(
            "MindSporeTrainingHang",
            f"label_replace({stopped} and on (project, phase) ({weights} < on (project) group_left () "
            f'max by (project) ({weights})), "verdict", "never arrived", "", "")'
            f" or label_replace({stopped} and on (project) (count by (project) ({weights}) == 1)"
            f" and on (project) (count by (project) ({stopped}) == count by (project) ({current})),"
            f' "verdict", "every rank stopped", "", "")',
            w.event_for,
            "critical",
            "Training hangs: the rank the job waits for",
            f"{_WHO} has been in phase {{{{ $labels.phase }}}} for {{{{ $value | humanizeDuration }}}}, past its "
            f'hang deadline: {{{{ if eq $labels.verdict "never arrived" }}}}the other ranks of its job are in '
            f"another phase, waiting for it{{{{ else }}}}every rank of its job is in this phase, so no rank "
            f"stands out{{{{ end }}}}.",
            b,
        ),
        _alert(
            "MindSporeTrainingMemoryGrowth",
            f"({c.MEMORY_GROWTH_RATIO.name} > {_number(t.memory_growth_ratio)})"
            f" and ({c.MEMORY_GROWTH_RATE.name} > {_number(t.memory_growth_rate)})",
            w.trend_for,
            "warning",
            "Memory keeps growing",
            f"{{{{ $labels.kind }}}} memory of {_WHO} is {{{{ $value | humanizePercentage }}}} above its "
            f"baseline and still growing.",
            b,
        ),
        _alert(
            "MindSporeTrainingLearningRateFlat",
            f"({c.LEARNING_RATE_SCHEDULED.name} == 1)"
            f" and (changes({c.LEARNING_RATE.name}[{w.lr_flat_window}]) == 0)"
            f" and on (job, instance) (increase({c.STEPS.name}[{w.lr_flat_window}]) > 0)",
            w.long_for,
            "warning",
            "The learning-rate schedule is not moving",
            f"The learning rate of {_WHO} is a schedule but has not changed for {w.lr_flat_window} "
            f"while training went on.",
            b,
        ),
        _alert(
            "MindSporeTrainingLossScaleCollapse",
            f"(increase({c.OVERFLOW_STEPS.name}[{w.overflow_window}])"
            f" / (increase({c.STEPS.name}[{w.overflow_window}])"
            f" >= {OVERFLOW_MIN_STEPS}) > {_number(t.overflow_fraction)}) or ({c.LOSS_SCALE.name} < 1)",
            w.trend_for,
            "warning",
            "Loss scaling is collapsing",
            f"{_WHO}: overflow on more than {_number(t.overflow_fraction)} of recent steps, or a loss scale "
            f'below 1 (value {{{{ printf "%.3g" $value }}}}).',
            b,
        ),
        _alert(
            "MindSporeTrainingLayerNormDrift",
            f"abs({c.LAYERNORM_DRIFT.name}) > {_number(t.layernorm_drift)}",
            w.long_for,
            "warning",
            "A LayerNorm scale is drifting",
            f"LayerNorm {{{{ $labels.layer }}}} of {_WHO} moved its scale mean by "
            f"{{{{ $value | humanizePercentage }}}} within its window.",
            b,
        ),
        # Only ranks that reported (any series in the last hour) and did not end normally: an unused port of a
        # static scrape config, a rank still importing MindSpore and a finished job page nothing.
        _alert(
            "MindSporeTrainingRankDown",
            f'{reported} and on (job, instance) (up{{job=~"{job_regex}"}} == 0) unless {ended}',
            w.gone_for,
            "critical",
            "A training rank's metrics endpoint is down",
            f"Endpoint {{{{ $labels.instance }}}} of {_WHO} cannot be scraped; it reported until recently and "
            f"did not end normally.",
            b,
        ),
        # The same where the target itself went (file_sd, Kubernetes): the rank's series stopped and its endpoint
        # is no longer scraped at all.
        _alert(
            "MindSporeTrainingRankMissing",
            f"{reported} unless on (project, rank) {c.STEPS.name} unless {ended}"
            f" unless on (project, rank) ({reported} and on (job, instance) up)",
            w.gone_for,
            "critical",
            "A training rank stopped reporting",
            f"{_WHO} reported within the last {w.reported_window} and no longer does, without ending normally "
            f"(its target left service discovery).",
            b,
        ),
        # Synchronous ranks (a collective in every step) all take the same time per step: the one the others
        # wait for has a short step and a long data wait, while theirs grows by the wait. So the step time
        # names the wrong rank; the data wait, where it is a real part of the step cycle, names the right one.
        # Ranks that do not synchronise run at their own pace: there the slow rank's whole cycle is longer.
        _alert(
            "MindSporeTrainingStraggler",
            f"(({wait_mean} > on (project) group_left ()"
            f" ({factor} * {c.PROJECT_WAIT_MEDIAN}))"
            f" and ({wait_mean} > {_number(t.straggler_wait_fraction)} * {cycle_mean}))"
            f" or ({cycle_mean} > on (project) group_left ()"
            f" ({factor} * {c.PROJECT_CYCLE_MEDIAN}))",
            w.slow_for,
            "warning",
            "A rank is much slower than the rest of its job",
            f"The job waits for {_WHO}: {{{{ $value | humanizeDuration }}}} per step of data wait (or of whole "
            f"step cycle, where ranks do not synchronise), over {factor} times the median of the job.",
            b,
        ),
        # Only for a project that already reported an hour ago: a job's first minutes, all startup and compilation,
        # are not an hour of low goodput. A crash loop that keeps restarting still pages.
        _alert(
            "MindSporeTrainingGoodputLow",
            f"({c.PROJECT_GOODPUT_1H} < {_number(t.goodput_low)}) and on (project) "
            f"(count by (project) (present_over_time({c.RUN_TIME_SECONDS.name}"
            f'{{bucket="{c.PRODUCTIVE}"}}[10m] offset 55m)))',
            w.goodput_for,
            "warning",
            "The job spends too little of its time training",
            f"Only {{{{ $value | humanizePercentage }}}} of the last hour of project {{{{ $labels.project }}}} "
            f"(all ranks) advanced training, below {_number(t.goodput_low)}; "
            f"{c.TIME_SECONDS.name} says where the rest went.",
            b,
        ),
        # A rank held by fewer of its group than the most common fingerprint, or, where no fingerprint has a
        # majority (two ranks that differ), every rank of the group.
        _alert(
            "MindSporeTrainingReplicaDivergence",
            f"label_replace({c.RANK_REPLICAS_AGREEING} < on (project, replica_group) group_left () "
            f'max by (project, replica_group) ({c.RANK_REPLICAS_AGREEING}), "verdict", '
            f'"differs from the majority of its group", "", "")'
            f" or label_replace({c.RANK_REPLICAS_AGREEING} <= 0.5 and on (project, replica_group) "
            f'(max by (project, replica_group) ({c.RANK_REPLICAS_AGREEING}) <= 0.5), "verdict", '
            f'"has no majority in its group: its ranks disagree, so each of them is named", "", "")',
            w.spike_for,
            "critical",
            "A rank's weights left its replica group",
            f"The parameters of {_WHO} (replica group {{{{ $labels.replica_group }}}}) are no longer those of "
            f"its replicas: its fingerprint {{{{ $labels.verdict }}}} (it is shared by "
            f"{{{{ $value | humanizePercentage }}}} of the group).",
            b,
        ),
        *(
            [
                _alert(
                    "MindSporeTrainingMfuLow",
                    f"{c.PROJECT_MFU} < {_number(t.mfu_low)}",
                    w.slow_for,
                    "warning",
                    "The job uses too little of its accelerators' peak",
                    f"Project {{{{ $labels.project }}}} runs at {{{{ $value | humanizePercentage }}}} model FLOPs "
                    f"utilisation (its ranks' model FLOPs per second over their devices' peak), below "
                    f"{_number(t.mfu_low)} for {w.slow_for}.",
                    b,
                )
            ]
            if t.mfu_low is not None
            else []
        ),
        # The action label keeps the rank apart from another action's series; the count is shown whole.
        _alert(
            "MindSporeTrainingRolledBack",
            f'increase({c.ACTIONS_TAKEN.name}{{action="rollback"}}[{w.events_window}]) > 0',
            w.event_for,
            "warning",
            "The monitor rolled the training back to its last good state",
            f'{_WHO} diverged and was rolled back {{{{ printf "%.0f" $value }}}} times in the last '
            f"{w.events_window}; {c.ROLLBACK_LOST_STEPS.name} counts the steps undone and "
            f"save_dir/skipped-batches.json lists the batches.",
            b,
        ),
        _alert(
            "MindSporeTrainingRollbackLoop",
            f'increase({c.ACTIONS_TAKEN.name}{{action="rollback_stop"}}[{w.events_window}]) > 0',
            w.event_for,
            "critical",
            "Rollbacks did not stop the divergence: the monitor ended the training",
            f"{_WHO} diverged again after actions.rollback.max_rollbacks rollbacks within window_steps; the "
            f"monitor stopped the training (the reason is in the log and the JSON Lines file).",
            b,
        ),
        _alert(
            "MindSporeExporterErrors",
            f"increase({c.ERRORS.name}[{w.errors_window}]) > 0",
            w.short_for,
            "warning",
            "The training monitor is absorbing errors",
            f"Component {{{{ $labels.component }}}} of the monitor on {_WHO} failed {{{{ $value | humanize }}}} "
            f"times in {w.errors_window}; training goes on, but its metrics may be incomplete.",
            b,
        ),
    ]
    for rule in (*recording, *alerts):
        rule["expr"] = live(rule["expr"])
    return {
        "groups": [
            {"name": "mindspore-training.recording", "interval": w.evaluation, "rules": recording},
            {"name": "mindspore-training.alerts", "interval": w.evaluation, "rules": alerts},
        ]
    }


def _agreeing() -> str:
    """Per rank, the share of its replica group whose fingerprint equals its own, at the group's latest fingerprint
    step, and only while every rank of the group reports that step (a rank still at an earlier step is not
    compared with ranks past it). count_values turns the fingerprint into a label, so that ranks can be matched by
    it; the recorded series drop it again (a new value every comparison would be a new series)."""
    fingerprint, step = c.PARAM_FINGERPRINT.name, c.PARAM_FINGERPRINT_STEP.name
    group = "project, replica_group"
    at_latest = (
        f"({fingerprint} and on (job, instance) ({step} == on ({group}) group_left () max by ({group}) ({step})))"
    )
    compared = (
        f"({at_latest} and on ({group}) (count by ({group}) ({at_latest}) == count by ({group}) ({fingerprint})))"
    )
    return (
        f'sum without (fingerprint) (count_values without () ("fingerprint", {compared}) * on ({group}, '
        f'fingerprint) group_left () count_values by ({group}) ("fingerprint", {compared}))'
        f" / on ({group}) group_left () count by ({group}) ({compared})"
    )


def render_yaml(rules: dict[str, Any]) -> str:
    header = (
        "# Generated by `ms-exporter rules` from the default thresholds (docs/alerts.md explains each).\n"
        "# Do not edit: change monitor_config and run `ms-exporter rules --config monitor.yaml` instead.\n"
    )
    return header + yaml.safe_dump(rules, sort_keys=False, width=120)
