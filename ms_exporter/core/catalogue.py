"""Every metric family the monitor exports, the closed sets of label values, and the recording-rule names.

This is the one place a name is written. Probes register their families from it, and the readers (threshold
watching, the live page's history, the JSON Lines columns, `top`, the report, the rules and the dashboard) take
their names from it too. Each family's `row` is its docs: `make generate` writes docs/metrics.md's tables from them.
A family only its own part reads may instead be declared in the part's module: `make generate` collects it
(PART_FAMILIES), and it is in FAMILIES as one declared here is.

Importing this module costs nothing: no MindSpore, no numpy (the operator tools use it).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, cast

from ms_exporter.core import builtin_parts

MetricType = Literal["gauge", "counter", "histogram"]

TRAIN_PREFIX = "mindspore_train_"
USER_PREFIX = TRAIN_PREFIX + "user_"  # a user's strategy's numbers: <USER_PREFIX><strategy>_<key> (docs/strategies.md)
EXPORTER_PREFIX = "mindspore_exporter_"  # the monitor's own health
# Labels every series of a rank carries (MetricStore's constant labels).
CONSTANT_LABELS = ("rank", "project")


@dataclass(frozen=True)
class Row:
    """A family's row of docs/metrics.md, which `make generate` writes (ms_exporter/generate/metrics_tables.py): the
    table it is in, when it is updated, and a column's words where they say more than the family's declaration."""

    table: str  # the docs table (its marker names it): training, gradients, activations, data, hardware, exporter
    updated: str  # when a value is set, from what
    group: str = ""  # the `metrics` group or section that switches it on (in the tables that show one)
    sink_mode: str = "same"  # what dataset sink mode changes (in the tables that show it)
    type: str = ""  # the type column, where it says more than the type ("gauge (=1)")
    labels: str = ""  # the labels column, where it says more than the label names
    unit: str = ""  # the unit column, where it says more than the unit
    # A histogram's `_bucket`, `_sum` and `_count` in words: its rows of the histogram-series table.
    series: tuple[str, ...] = ()


@dataclass(frozen=True)
class MetricFamily:
    """One exported family. `labels` are its own label names (the constant ones come on top); `row` its docs."""

    name: str
    type: MetricType
    help: str
    unit: str
    labels: tuple[str, ...] = ()
    buckets: tuple[float, ...] = ()
    row: Row | None = None

    @property
    def short(self) -> str:
        """The name without `mindspore_train_`: the JSON Lines key and the live page's column stem."""
        return self.name.removeprefix(TRAIN_PREFIX)

    @property
    def sum(self) -> str:
        return self.name + "_sum"

    @property
    def count(self) -> str:
        return self.name + "_count"

    @property
    def bucket(self) -> str:
        return self.name + "_bucket"


def jsonl_key(family_name: str, labels: tuple[tuple[str, str], ...] = ()) -> str:
    """A series' key in JSON Lines records: the short name, with its own labels in Prometheus' notation."""
    short = family_name.removeprefix(TRAIN_PREFIX)
    if not labels:
        return short
    return short + "{" + ",".join(f'{k}="{v}"' for k, v in labels) + "}"


# -- closed label values -----------------------------------------------------------------------------------------

# mindspore_train_memory_bytes{kind}: host RSS (psutil) and MindSpore's runtime memory API on Ascend/GPU.
HOST_RSS = "host_rss"
DEVICE_ALLOCATED = "device_allocated"  # runtime.memory_allocated(): tensors in use
DEVICE_RESERVED = "device_reserved"  # runtime.memory_reserved(): what the allocator holds
DEVICE_PEAK = "device_peak"  # runtime.max_memory_allocated()
MEMORY_KINDS = (HOST_RSS, DEVICE_ALLOCATED, DEVICE_RESERVED, DEVICE_PEAK)
# A view with room for one memory figure shows the first kind present: memory in use on the device, else what
# the device's allocator holds, else the host's. A peak is never shown as memory in use.
MEMORY_IN_USE_ORDER = (DEVICE_ALLOCATED, DEVICE_RESERVED, HOST_RSS)

# mindspore_exporter_callback_duration_seconds{hook}
HOOKS = ("train_begin", "step_begin", "step_end", "train_end", "eval_end")

# mindspore_train_phase{phase}: where a rank is (ms_exporter/core/phases.py says when each begins and ends).
COMPILE, DATA_WAIT_PHASE, STEP_PHASE, EVAL_PHASE, CHECKPOINT, CALLBACKS, ENDED = (
    "compile",
    "data_wait",
    "step",
    "eval",
    "checkpoint",
    "callbacks",
    "ended",
)
PHASES = (COMPILE, DATA_WAIT_PHASE, STEP_PHASE, EVAL_PHASE, CHECKPOINT, CALLBACKS, ENDED)

# mindspore_train_time_seconds_total{bucket}: where a process's wall time went (ms_exporter/core/analysis/ledger.py and
# docs/goodput.md say which bucket a second goes to when two apply).
STARTUP, PRODUCTIVE, STALLED, REDO, OTHER = "startup", "productive", "stalled", "redo", "other"
TIME_BUCKETS = (STARTUP, COMPILE, PRODUCTIVE, DATA_WAIT_PHASE, CHECKPOINT, EVAL_PHASE, STALLED, REDO, OTHER)

# mindspore_train_actions_total{action}
# rollback_stop: the rollback loop guard ended training (max_rollbacks within window_steps).
ACTIONS = ("early_stop", "lr_backoff", "snapshot", "rollback", "rollback_stop")

# mindspore_exporter_errors_total{component} and mindspore_exporter_component_disabled{component}: the
# monitor's own parts, the probes and the sinks, by their names in core/registry.py (registry.components()).
# A component that fails this many times in a row is switched off (mindspore_exporter_component_disabled).
FAILURES_BEFORE_DISABLE = 3

# -- buckets -------------------------------------------------------------------------------------------------------

# 1 ms to 10 min for a step; the wait starts lower because a healthy loader hides in microseconds.
STEP_BUCKETS = (
    0.001,
    0.0025,
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1.0,
    2.5,
    5.0,
    10.0,
    30.0,
    60.0,
    120.0,
    300.0,
    600.0,
)
WAIT_BUCKETS = (0.0001, 0.00025, 0.0005, *STEP_BUCKETS)
NORM_BUCKETS = tuple(10.0 ** (k / 2) for k in range(-8, 9))  # 1e-4 to 1e4 in half-decades
HOOK_BUCKETS = (1e-6, 2.5e-6, 5e-6, 1e-5, 2.5e-5, 5e-5, 1e-4, 2.5e-4, 5e-4, 1e-3, 2.5e-3, 5e-3, 1e-2, 0.1, 1.0)

# -- families ------------------------------------------------------------------------------------------------------

INFO = MetricFamily(
    "mindspore_train_info",
    "gauge",
    "Identity of this rank; always 1.",
    "1",
    ("world_size", "local_rank", "node", "device_target", "mindspore_version", "exporter_version"),
    row=Row(
        "training",
        updated="at construction",
        group="global_rank",
        type="gauge (=1)",
        labels=(
            "`world_size`, `local_rank`, `node` (host name), `device_target`, `mindspore_version`, "
            "`exporter_version`, and every `tags` key"
        ),
        unit="-",
    ),
)
PARALLEL_GROUP_INFO = MetricFamily(
    "mindspore_train_parallel_group_info",
    "gauge",
    "A group of ranks this rank works in (its node; its pipeline stage and model copy where the parallel layout "
    "says); always 1.",
    "1",
    ("kind", "group"),
    row=Row(
        "training",
        updated=(
            "first training call: 1 for each group of ranks this rank works in, its `node`, and where the "
            "parallel layout says its pipeline `stage` and model copy (`replica`) "
            "([failslow.md](failslow.md#groups))"
        ),
        group="failslow.enable",
        sink_mode="only `node` (stand_alone, or no model-parallel size)",
    ),
)
WORLD_SIZE = MetricFamily(
    "mindspore_train_world_size",
    "gauge",
    "Number of ranks in the job.",
    "ranks",
    row=Row("training", updated="at construction", group="global_rank"),
)

GLOBAL_STEP = MetricFamily(
    "mindspore_train_global_step",
    "gauge",
    "Current global step (cb_params.cur_step_num).",
    "steps",
    row=Row(
        "training",
        updated="train begin (the step it starts from), then step end (`cb_params.cur_step_num`)",
        group="progress",
        sink_mode="last step of the sink",
    ),
)
EPOCH = MetricFamily(
    "mindspore_train_epoch",
    "gauge",
    "Current epoch (cb_params.cur_epoch_num).",
    "epochs",
    row=Row("training", updated="train begin, then step end (`cur_epoch_num`)", group="progress"),
)
STEPS = MetricFamily(
    "mindspore_train_steps_total",
    "counter",
    "Steps this process completed.",
    "steps",
    row=Row("training", updated="step end", group="progress", sink_mode="adds the sink size (the step delta)"),
)
LAST_STEP_TIMESTAMP = MetricFamily(
    "mindspore_train_last_step_timestamp_seconds",
    "gauge",
    "Unix time the last step ended (train begin, before the first step).",
    "seconds",
    row=Row(
        "training",
        updated=(
            "step end; set to the train-begin time before the first step, so that a hang in the first step is"
            " a stall too"
        ),
        group="progress",
        sink_mode="end of the sink",
        unit="unix seconds",
    ),
)
PLANNED_STEPS = MetricFamily(
    "mindspore_train_planned_steps",
    "gauge",
    "Global step at which the current training call ends, when known.",
    "steps",
    row=Row(
        "training",
        updated=(
            "train begin: the global step at which this `Model.train` call ends (start step + epochs × steps "
            "per epoch); for an ETA. Where a `sink_size` is given but the device trains without sinking "
            "(CPU), an epoch is the whole dataset, as it is trained"
        ),
        group="progress",
        sink_mode="counts sinks × sink size",
    ),
)

PHASE = MetricFamily(
    "mindspore_train_phase",
    "gauge",
    "1 for the phase this rank is in, 0 for the others (ended: training ended normally or was stopped as asked).",
    "1",
    ("phase",),
    row=Row(
        "training",
        updated=(
            "read at scrape time: 1 for the phase the rank is in, 0 for the other six (`compile`, "
            "`data_wait`, `step`, `eval`, `checkpoint`, `callbacks`, `ended`; [hangs.md](hangs.md#phases)); "
            "from train begin on"
        ),
        group="phases",
        sink_mode="`step` spans the whole sink",
    ),
)
PHASE_SECONDS = MetricFamily(
    "mindspore_train_phase_seconds",
    "gauge",
    "Seconds since the current phase began.",
    "seconds",
    row=Row("training", updated="read at scrape time: seconds since the current phase began", group="phases"),
)
HANG_SUSPECTED = MetricFamily(
    "mindspore_train_hang_suspected",
    "gauge",
    "1 while the current phase has outlasted its hang deadline, else 0.",
    "1",
    row=Row(
        "training",
        updated=(
            "the watchdog thread (every 0.5 s): 1 while the current phase has outlasted its deadline, 0 once "
            "it moves on; from train begin"
        ),
        group="hang",
    ),
)
HANG_DUMPS = MetricFamily(
    "mindspore_train_hang_dumps_total",
    "counter",
    "Stack dumps the hang watchdog wrote to save_dir.",
    "dumps",
    row=Row(
        "training",
        updated=(
            "one per hang episode: the stacks of every thread written to `save_dir/hang-rank{r}-{UTC}.txt` "
            "([hangs.md](hangs.md#the-dump))"
        ),
        group="hang",
    ),
)
HANG_DEADLINE = MetricFamily(
    "mindspore_train_hang_deadline_seconds",
    "gauge",
    "Seconds the current phase may last before it counts as a hang (learned from the "
    "run's own step cycles in step, data_wait and callbacks).",
    "seconds",
    row=Row(
        "training",
        updated=(
            "read at scrape time: how long the current phase may last ([hangs.md](hangs.md#the-deadline)); "
            "NaN once training ended; off with `hang.enable: false`"
        ),
        group="hang",
        sink_mode="learned per sink cycle",
    ),
)

TIME_SECONDS = MetricFamily(
    "mindspore_train_time_seconds_total",
    "counter",
    "This process's wall time by where it went; the buckets sum to its age.",
    "seconds",
    ("bucket",),
    row=Row(
        "training",
        updated=(
            "read at scrape time: this process's wall time since it started, in nine buckets (`startup`, "
            "`compile`, `productive`, `data_wait`, `checkpoint`, `eval`, `stalled`, `redo`, `other`) that sum"
            " to its age ([goodput.md](goodput.md)); off with `goodput.enable: false`"
        ),
        group="goodput",
        sink_mode="`step` time of a sink is one step's",
    ),
)
RUN_TIME_SECONDS = MetricFamily(
    "mindspore_train_run_time_seconds_total",
    "counter",
    "The run's time by bucket over all its processes, as of the last save of the run "
    "state (never lower than what an earlier process exported).",
    "seconds",
    ("bucket",),
    row=Row(
        "training",
        updated=(
            "every `goodput.save_seconds` (5 s), as saved to the run state file: the run's time over all its "
            "processes, which goes on across a restart where the counter above starts again"
        ),
        group="goodput",
    ),
)
RESTARTS = MetricFamily(
    "mindspore_train_restarts_total",
    "counter",
    "Processes of this run that came before this one.",
    "restarts",
    row=Row("training", updated="at construction: processes of this run before this one", group="goodput"),
)
RUN_INFO = MetricFamily(
    "mindspore_train_run_info",
    "gauge",
    "The run this process belongs to; always 1.",
    "1",
    ("run_id",),
    row=Row(
        "training",
        updated=(
            "at construction: the run this process belongs to (`run_id`, or the one derived from project and save_dir)"
        ),
        group="goodput",
        type="gauge (=1)",
        unit="-",
    ),
)
# The checkpoint interval advisor (core/analysis/checkpoint_interval.py, docs/failslow.md#checkpoint-interval).
CHECKPOINT_SAVE_SECONDS = MetricFamily(
    "mindspore_train_checkpoint_save_seconds",
    "gauge",
    "Seconds a checkpoint save holds training, the mean of this process's saves.",
    "seconds",
    row=Row(
        "training",
        updated=(
            "each run state save (goodput.save_seconds), once this process saved a checkpoint: the mean time "
            "a save held training (a checkpoint hook of 1 ms or more) "
            "([failslow.md](failslow.md#checkpoint-interval))"
        ),
        group="goodput",
    ),
)
CHECKPOINT_INTERVAL = MetricFamily(
    "mindspore_train_checkpoint_interval_seconds",
    "gauge",
    "Seconds of training between two checkpoint saves, as this process saves (the mean, a save's time left out).",
    "seconds",
    row=Row("training", updated="same, once it saved twice: training time between two saves", group="goodput"),
)
MTBF = MetricFamily(
    "mindspore_train_mtbf_seconds",
    "gauge",
    "The run's mean time between failures: its wall time over its restarts (processes that did not end normally).",
    "seconds",
    row=Row("training", updated="same, in a restarted run: the run's wall time over its restarts", group="goodput"),
)
FAILURE_COST = MetricFamily(
    "mindspore_train_failure_cost_seconds",
    "gauge",
    "What a failure costs the run besides the work since the last save: from the failed process's last sign of "
    "life to this process's first step (detection, rescheduling, start-up, compilation).",
    "seconds",
    row=Row(
        "training",
        updated=(
            "same, in a restarted run: the previous process's last state save to this one's start, plus this "
            "one's start-up and compilation"
        ),
        group="goodput",
    ),
)
CHECKPOINT_INTERVAL_ADVISED = MetricFamily(
    "mindspore_train_checkpoint_interval_advised_seconds",
    "gauge",
    "The checkpoint interval of highest expected goodput given the run's failures, save time and failure cost "
    "(Daly's model, over the MTBF's uncertainty); `bound` low and high: at the ends of the MTBF's 90% interval.",
    "seconds",
    ("bound",),
    row=Row(
        "training",
        updated=(
            "same, in a restarted run that saved: the interval of highest expected goodput; `low` and `high` "
            "at the ends of the MTBF's 90% interval"
        ),
        group="goodput",
        labels="`bound` (`best`, `low`, `high`)",
    ),
)
CHECKPOINT_GOODPUT_LOSS = MetricFamily(
    "mindspore_train_checkpoint_interval_goodput_loss_ratio",
    "gauge",
    "The share of wall time the run's current checkpoint interval loses against the advised one (Daly's model).",
    "1",
    row=Row(
        "training",
        updated=(
            "same, once it saved twice: the share of wall time the current interval loses against the advised one"
        ),
        group="goodput",
    ),
)
ADVISED_BOUNDS = ("best", "low", "high")

PARAM_FINGERPRINT = MetricFamily(
    "mindspore_train_param_fingerprint",
    "gauge",
    "CRC-32 of this rank's trainable parameters at the last fingerprint step: equal on "
    "every replica of its group while they hold the same weights.",
    "1",
    ("replica_group",),
    row=Row(
        "training",
        updated=(
            "every `divergence.every_n_steps` (100) steps, at the step's end: a checksum of the bytes of "
            "every trainable parameter, equal on the replicas of a group while they hold the same weights "
            "([divergence.md](divergence.md)); only in jobs with replicas"
        ),
        group="divergence",
        sink_mode="at the first sink end past each multiple",
        unit="1 (a CRC-32, 0 to 2^32 - 1)",
    ),
)
PARAM_CHECKSUM = MetricFamily(
    "mindspore_train_param_checksum",
    "gauge",
    "CRC-32 of one bucket of this rank's weights or optimizer state, folded over the bit sums of every step since the "
    "fingerprint step before: equal on every replica of its group while they hold the same bits at every step.",
    "1",
    ("replica_group", "kind", "bucket"),
    row=Row(
        "training",
        updated=(
            "with the fingerprint, where `divergence.check_every_step`: one bucket of the weights "
            '(`kind="weights"`) or the optimizer\'s state (`kind="optimizer"`), folded over the bit sums of '
            "every step since the fingerprint before, equal on the replicas of a group while they held the "
            "same bits at every step ([sdc.md](sdc.md))"
        ),
        group="divergence",
        unit="1 (a CRC-32)",
    ),
)
LOCAL_GRAD_NORM = MetricFamily(
    "mindspore_train_local_grad_norm",
    "gauge",
    "This rank's global L2 norm of its own gradients before the all-reduce, at the last step (a train cell that "
    "measures it: GradNormTrainOneStepCell).",
    "1",
    ("replica_group",),
    row=Row(
        "training",
        updated=(
            "where replica checks run and the train cell measures it (GradNormTrainOneStepCell, or "
            "`step_end(local_grad_norm=...)`): this rank's global L2 norm of its own gradients before the "
            "all-reduce, at the last step ([sdc.md](sdc.md#local-gradients))"
        ),
        group="divergence",
    ),
)
LOCAL_GRAD_OUTLIERS = MetricFamily(
    "mindspore_train_local_grad_outliers_total",
    "counter",
    "Steps whose local gradient norm was not finite or more than divergence.local_grad_factor times the median of "
    "this rank's recent ones: a corrupted local gradient, which every replica then applies.",
    "steps",
    ("replica_group",),
    row=Row(
        "training",
        updated=(
            "steps whose local gradient norm was not finite or more than `divergence.local_grad_factor` times"
            " the median of this rank's recent ones: a corrupted local gradient, which every replica then "
            "applied ([sdc.md](sdc.md#local-gradients))"
        ),
        group="divergence",
    ),
)
LOCAL_GRAD_SKIPPED = MetricFamily(
    "mindspore_train_local_grad_skipped_steps_total",
    "counter",
    "Steps this rank skipped (no update applied) because a replica's local gradient norm was an outlier "
    "(divergence.skip_local_grad_outliers): the same steps on every replica.",
    "steps",
    ("replica_group",),
    row=Row(
        "training",
        updated=(
            "with `divergence.skip_local_grad_outliers`: steps this rank applied no update because a "
            "replica's local gradient norm was an outlier (the same steps on every replica, "
            "[sdc.md](sdc.md#skipping-the-step))"
        ),
        group="divergence",
    ),
)
LOCAL_GRAD_OUTLIER_STEP = MetricFamily(
    "mindspore_train_local_grad_outlier_step",
    "gauge",
    "The step of this rank's last local gradient norm outlier.",
    "steps",
    ("replica_group",),
    row=Row("training", updated="the step of this rank's last local gradient norm outlier", group="divergence"),
)
PARAM_FINGERPRINT_STEP = MetricFamily(
    "mindspore_train_param_fingerprint_step",
    "gauge",
    "The step the fingerprint was taken at.",
    "steps",
    ("replica_group",),
    row=Row(
        "training",
        updated="with the fingerprint: the step it was taken at (the rules compare only fingerprints of one step)",
        group="divergence",
    ),
)
PARAM_FINGERPRINT_OVERFLOW = MetricFamily(
    "mindspore_train_param_fingerprint_overflow",
    "gauge",
    "1 if the fingerprint step overflowed, as the train cell reported it.",
    "1",
    ("replica_group",),
    row=Row(
        "training",
        updated="with the fingerprint: that step's overflow flag, where the train cell returns one",
        group="divergence",
    ),
)
PARAM_FINGERPRINT_GRAD_NORM = MetricFamily(
    "mindspore_train_param_fingerprint_grad_norm",
    "gauge",
    "Global gradient norm of the fingerprint step after the all-reduce, as the "
    "train cell reported it (NaN: not reported that step).",
    "1",
    ("replica_group",),
    row=Row(
        "training",
        updated=(
            "with the fingerprint: that step's global gradient norm after the all-reduce, where the train "
            "cell returns one (NaN on a fingerprint step it did not measure)"
        ),
        group="divergence",
    ),
)

LOSS = MetricFamily(
    "mindspore_train_loss",
    "gauge",
    "Loss of the last step.",
    "loss",
    row=Row(
        "training", updated="step end; NaN/Inf exported as is", group="loss", sink_mode="loss of the sink's last step"
    ),
)
LOSS_SMOOTHED = MetricFamily(
    "mindspore_train_loss_smoothed",
    "gauge",
    "Mean of the last loss_window finite losses.",
    "loss",
    row=Row(
        "training",
        updated="step end: mean of the last `loss_window` finite losses",
        group="loss",
        sink_mode="one value per sink",
    ),
)
LOSS_RISING = MetricFamily(
    "mindspore_train_loss_consecutive_increases",
    "gauge",
    "Steps in a row the loss went up.",
    "steps",
    row=Row(
        "training",
        updated="step end: finite losses in a row that went up; a NaN neither extends nor breaks the streak",
        group="loss",
        sink_mode="counts sinks",
    ),
)
NONFINITE_LOSS = MetricFamily(
    "mindspore_train_nonfinite_loss_total",
    "counter",
    "Steps whose loss was NaN or Inf.",
    "steps",
    row=Row("training", updated="step end", group="loss", sink_mode="adds the sink size"),
)

LEARNING_RATE = MetricFamily(
    "mindspore_train_learning_rate",
    "gauge",
    "Learning rate the optimizer used for the last step.",
    "1",
    ("group",),
    row=Row(
        "training",
        updated="step end: the LR used for the step that just ended",
        group="lr",
        sink_mode="LR of the sink's last step",
        labels="`group` (only with several parameter groups)",
        unit="LR",
    ),
)
LEARNING_RATE_SCHEDULED = MetricFamily(
    "mindspore_train_learning_rate_scheduled",
    "gauge",
    "1 when the learning rate is a schedule (it should change), 0 when fixed.",
    "1",
    ("group",),
    row=Row(
        "training",
        updated="train begin: 1 when the LR is a schedule or a list (it is meant to change), 0 for a fixed LR",
        group="lr",
        labels="`group` (likewise)",
        unit="1 or 0",
    ),
)

STEP_DURATION = MetricFamily(
    "mindspore_train_step_duration_seconds",
    "histogram",
    "Wall time per step, measured after the loss was read.",
    "seconds",
    buckets=STEP_BUCKETS,
    row=Row(
        "training",
        updated=(
            "step end, measured after the loss read, less the time other callbacks' hooks took inside it "
            "([hangs.md](hangs.md#phases))"
        ),
        group="step_time",
        sink_mode="sink time / sink size, counted sink-size times",
        series=(
            "steps that took at most `le` seconds",
            "seconds spent in steps",
            "steps timed (equals the steps counted in `mindspore_train_steps_total` while `step_time` is on)",
        ),
    ),
)
DATA_WAIT = MetricFamily(
    "mindspore_train_data_wait_seconds",
    "histogram",
    "Time from one step's end to the next step's begin (data loading, host work).",
    "seconds",
    buckets=WAIT_BUCKETS,
    row=Row(
        "training",
        updated=(
            "step begin: time since the previous step's end (data loading, host work), less the other "
            "callbacks' hooks and evaluations in between"
        ),
        group="step_time",
        sink_mode="gap between sinks",
        series=(
            "gaps between steps of at most `le` seconds",
            "seconds between steps (data loading, host work)",
            "gaps measured (every step but the first of each training call, which has no previous step)",
        ),
    ),
)

# Fail-slow (core/analysis/slowness.py, docs/failslow.md): a rank's own work per step, scored and watched for
# the step a slowdown starts.
OWN_WORK = MetricFamily(
    "mindspore_train_own_work_seconds",
    "gauge",
    "This rank's own work per step, averaged over about the last 10 steps: its data wait (and, in the loop API, the "
    "time up to the collective where the loop marks it), the part of the step cycle no other rank waits in.",
    "seconds",
    row=Row(
        "training",
        updated=(
            "step end, from the 83rd step of a training call (50 settling, 32 for the baseline): this rank's "
            "own work per step (data wait, other callbacks' hooks, checkpoints and evaluations in the cycle, "
            "and in the loop API the time up to `collective_begin()`), averaged over about 10 steps "
            "([failslow.md](failslow.md))"
        ),
        group="failslow.enable",
        sink_mode="absent (no step of its own)",
    ),
)
CLEAN_CYCLE = MetricFamily(
    "mindspore_train_clean_cycle_seconds",
    "gauge",
    "This rank's step cycle (step and data wait) before any slowdown: the fail-slow detector's baseline.",
    "seconds",
    row=Row(
        "training",
        updated="same: the rank's step cycle before any slowdown (the detector's baseline)",
        group="failslow.enable",
        sink_mode="absent",
    ),
)
SLOWNESS_SCORE = MetricFamily(
    "mindspore_train_slowness_score",
    "gauge",
    "This rank's individual slowness score: its clean cycle over the cycle its own work makes now (1: as fast as "
    "its own best; 0.8: its own work adds a quarter to the cycle), or its slowest device's clock over its best where "
    "that is lower.",
    "1",
    row=Row(
        "training",
        updated=(
            "same: the individual score, clean cycle over the cycle this rank's own work makes now (1 / (1 + "
            "recent excess)), or the slowest device's clock over its best where a hardware reader gives "
            "clocks and that is lower"
        ),
        group="failslow.enable",
        sink_mode="absent",
    ),
)
FAILSLOW = MetricFamily(
    "mindspore_train_failslow",
    "gauge",
    "1 while this rank's own work is flagged as slowed (a CUSUM over its excess crossed the threshold), else 0.",
    "1",
    row=Row(
        "training",
        updated="same: 1 while a slowdown of this rank's own work is flagged, else 0",
        group="failslow.enable",
        sink_mode="absent",
    ),
)
FAILSLOW_ONSET_STEP = MetricFamily(
    "mindspore_train_failslow_onset_step",
    "gauge",
    "The first step of this rank's current (or last) flagged slowdown: the change-point estimate.",
    "steps",
    row=Row(
        "training",
        updated="once a slowdown was flagged: its first step (the change-point estimate)",
        group="failslow.enable",
        sink_mode="absent",
    ),
)
FAILSLOW_SIZE = MetricFamily(
    "mindspore_train_failslow_size_ratio",
    "gauge",
    "How much this rank's current (or last) flagged slowdown adds per step, as a share of its clean cycle.",
    "1",
    row=Row(
        "training",
        updated="once a slowdown was flagged: what it adds per step, as a share of the clean cycle",
        group="failslow.enable",
        sink_mode="absent",
    ),
)
FAILSLOW_ONSETS = MetricFamily(
    "mindspore_train_failslow_onsets_total",
    "counter",
    "Slowdowns flagged on this rank.",
    "slowdowns",
    row=Row("training", updated="each slowdown flagged", group="failslow.enable", sink_mode="absent"),
)
FAILSLOW_SECONDS = MetricFamily(
    "mindspore_train_failslow_seconds_total",
    "counter",
    "Seconds of step cycle this rank's flagged slowdowns added (the job waited as long): part of the goodput "
    "ledger's data_wait and productive time, not a bucket of its own.",
    "seconds",
    row=Row(
        "training",
        updated=(
            "each step of a flagged slowdown: the cycle time it added (inside the ledger's `data_wait` and "
            "`productive`, not a bucket of its own)"
        ),
        group="failslow.enable",
        sink_mode="absent",
    ),
)

SAMPLES = MetricFamily(
    "mindspore_train_samples_total",
    "counter",
    "Samples consumed.",
    "samples",
    row=Row(
        "training",
        updated="step end",
        group="samples_per_second or tokens_per_second",
        sink_mode="batch size × sink size",
    ),
)
TOKENS = MetricFamily(
    "mindspore_train_tokens_total",
    "counter",
    "Non-padding tokens consumed.",
    "tokens",
    row=Row(
        "training",
        updated="step end; only for token data",
        group="same",
        sink_mode="batch × sequence length × sink size (padding included)",
    ),
)
SAMPLES_PER_SECOND = MetricFamily(
    "mindspore_train_samples_per_second",
    "gauge",
    "Samples per second over a short recent window.",
    "samples/s",
    row=Row("training", updated="step end, over the last ~10 s", group="samples_per_second"),
)
TOKENS_PER_SECOND = MetricFamily(
    "mindspore_train_tokens_per_second",
    "gauge",
    "Tokens per second over a short recent window.",
    "tokens/s",
    row=Row("training", updated="step end, over the last ~10 s; only for token data", group="tokens_per_second"),
)

FLOPS_PER_TOKEN = MetricFamily(
    "mindspore_train_flops_per_token",
    "gauge",
    "Model FLOPs (forward and backward) per token over the recent window, the attention "
    "term from the batches' real sequence lengths.",
    "FLOPs/token",
    row=Row(
        "training",
        updated=(
            "step end, over the same ~10 s as tokens/s: model FLOPs (forward and backward) over the tokens of"
            " those steps, the attention term from their real sequence lengths ([mfu.md](mfu.md)); only for "
            "token data"
        ),
        group="flops",
        sink_mode="the dataset's static shape (padding included)",
    ),
)
MODEL_FLOPS_PER_SECOND = MetricFamily(
    "mindspore_train_model_flops_per_second",
    "gauge",
    "Model FLOPs per second of this rank: tokens per second times FLOPs per token "
    "(padding is not counted as work), over the ranks that compute each batch "
    "together.",
    "FLOPs/s",
    row=Row(
        "training",
        updated=(
            "with FLOPs per token: `mindspore_train_tokens_per_second` × `mindspore_train_flops_per_token` ÷ "
            "the ranks that compute each batch together (`ranks_per_batch`: 1 in data parallel; "
            "[mfu.md](mfu.md#parallel-layouts))"
        ),
        group="flops",
    ),
)
PEAK_FLOPS = MetricFamily(
    "mindspore_train_peak_flops_per_device",
    "gauge",
    "The device's peak FLOPs per second, as configured (flops.peak_flops_per_device).",
    "FLOPs/s",
    row=Row(
        "training",
        updated=(
            "with the first FLOPs, when `flops.peak_flops_per_device` is set (a number or a preset's cited figure)"
        ),
        group="flops",
    ),
)
MFU = MetricFamily(
    "mindspore_train_mfu",
    "gauge",
    "Model FLOPs utilisation: model FLOPs per second over the device's peak (0-1).",
    "ratio",
    row=Row(
        "training",
        updated="with FLOPs per second, when a peak is set: model FLOPs per second over the peak",
        group="flops",
        unit="ratio (0-1)",
    ),
)
FLOPS_INFO = MetricFamily(
    "mindspore_train_flops_info",
    "gauge",
    "Where FLOPs per token come from (source: per_token, model or parameters; attention: "
    "causal, full, none or in_per_token), the peak's preset (or number, none) and the ranks "
    "that compute each batch together; always 1.",
    "1",
    ("source", "attention", "peak", "ranks_per_batch"),
    row=Row(
        "training",
        updated=(
            "with the first FLOPs: where FLOPs per token come from (`parameters`: 6N of the trainable "
            "parameters, no description given)"
        ),
        group="flops",
        type="gauge (=1)",
        labels=(
            "`source` (`per_token`, `model`, `parameters`), `attention` (`causal`, `full`, `none`, "
            "`in_per_token`), `peak` (a preset's name, `number` or `none`), `ranks_per_batch`"
        ),
        unit="-",
    ),
)

EVAL_METRIC = MetricFamily(
    "mindspore_train_eval_metric",
    "gauge",
    "Each metric of the latest evaluation.",
    "1",
    ("name",),
    row=Row(
        "training", updated="evaluation end (`Model.fit` with `valid_dataset`)", group="eval", unit="the metric's own"
    ),
)

MEMORY_BYTES = MetricFamily(
    "mindspore_train_memory_bytes",
    "gauge",
    "Memory in use, by kind.",
    "bytes",
    ("kind",),
    row=Row(
        "training",
        updated=(
            "every `min(interval, 5)` s: `host_rss` off the training thread, device kinds when steps are published"
        ),
        group="memory_usage",
    ),
)
MEMORY_GROWTH_RATIO = MetricFamily(
    "mindspore_train_memory_growth_ratio",
    "gauge",
    "(current - baseline) / baseline, baseline taken after warm-up.",
    "ratio",
    ("kind",),
    row=Row("training", updated="every `min(interval, 5)` s, after warm-up", group="memory_usage"),
)
MEMORY_GROWTH_RATE = MetricFamily(
    "mindspore_train_memory_growth_bytes_per_second",
    "gauge",
    "Memory growth rate over the recent samples.",
    "bytes/s",
    ("kind",),
    row=Row("training", updated="every `min(interval, 5)` s, after warm-up", group="memory_usage"),
)
MEMORY_RISING = MetricFamily(
    "mindspore_train_memory_consecutive_increases",
    "gauge",
    "Samples in a row that grew by more than 1 MiB.",
    "samples",
    ("kind",),
    row=Row("training", updated="every `min(interval, 5)` s, after warm-up", group="memory_usage"),
)

BREACHES = MetricFamily(
    "mindspore_train_threshold_breaches_total",
    "counter",
    "warn_on_value breach episodes, by metric.",
    "episodes",
    ("metric",),
    row=Row("training", updated="when a `warn_on_value` bound is crossed", group="-"),
)

GRAD_NORM = MetricFamily(
    "mindspore_train_grad_norm",
    "gauge",
    "Global L2 norm of the gradients (before clipping) at the last sampled step.",
    "1",
    row=Row(
        "gradients",
        updated=(
            "every `grad_norm.every_n_steps` steps (at steps that are multiples of it): the global norm of "
            "the gradients of that step, before clipping"
        ),
        unit="L2 norm",
    ),
)
GRAD_NORM_DISTRIBUTION = MetricFamily(
    "mindspore_train_grad_norm_distribution",
    "histogram",
    "Global gradient norm at sampled steps.",
    "1",
    buckets=NORM_BUCKETS,
    row=Row(
        "gradients",
        updated="the same sampled values",
        unit="L2 norm; buckets 1e-4 to 1e4 in half-decades",
        series=("sampled norms of at most `le`", "the sampled norms added up", "steps sampled"),
    ),
)
GRAD_NORM_CLIPPED = MetricFamily(
    "mindspore_train_grad_norm_clipped_total",
    "counter",
    "Sampled steps whose gradient norm exceeded the clip threshold.",
    "steps",
    row=Row(
        "gradients",
        updated=(
            "a sampled norm above the clip threshold (`grad_norm.clip`, else the train cell's `clip_norm`); "
            "absent when clipping is off"
        ),
        unit="sampled steps",
    ),
)
LAYER_GRAD_NORM = MetricFamily(
    "mindspore_train_layer_grad_norm",
    "gauge",
    "L2 norm of a layer's gradients at the last sampled step.",
    "1",
    ("layer",),
    row=Row(
        "gradients",
        updated=(
            "sampled steps: the layers `grad_norm.layers` watches, plus the `top_k` largest others; a layer "
            "that drops out of the top k loses its series"
        ),
        unit="L2 norm",
    ),
)
LAYER_GRAD_ZERO = MetricFamily(
    "mindspore_train_layer_grad_zero_total",
    "counter",
    "Sampled steps where a watched layer's gradient norm was exactly zero.",
    "steps",
    ("layer",),
    row=Row(
        "gradients",
        updated="a watched layer's norm was exactly 0 (frozen by accident, masked, dead)",
        unit="sampled steps",
    ),
)
LOSS_SCALE = MetricFamily(
    "mindspore_train_loss_scale",
    "gauge",
    "Current loss scale.",
    "1",
    row=Row(
        "gradients",
        updated=(
            "with a loss-scale cell: at overflow steps and every `every_n_steps` steps; with only a "
            "loss-scale manager: its `get_loss_scale()` at train begin"
        ),
        unit="scale factor",
    ),
)
OVERFLOW_STEPS = MetricFamily(
    "mindspore_train_overflow_steps_total",
    "counter",
    "Steps the loss-scale cell reported as overflow.",
    "steps",
    row=Row(
        "gradients",
        updated="every step whose overflow flag was set (the update was skipped); in sink mode one flag per sink",
    ),
)
LAYERNORM_MEAN = MetricFamily(
    "mindspore_train_layernorm_scale_mean",
    "gauge",
    "Mean of a LayerNorm scale (gamma).",
    "1",
    ("layer",),
    row=Row(
        "gradients",
        updated=(
            "at the first step and every `layernorm.every_n_steps` steps after it, for every LayerNorm (and "
            "`*RMSNorm`) scale"
        ),
        unit="gamma units",
    ),
)
LAYERNORM_STD = MetricFamily(
    "mindspore_train_layernorm_scale_std",
    "gauge",
    "Standard deviation of a LayerNorm scale.",
    "1",
    ("layer",),
    row=Row("gradients", updated="the same", unit="gamma units"),
)
LAYERNORM_DRIFT = MetricFamily(
    "mindspore_train_layernorm_scale_drift_ratio",
    "gauge",
    "Relative change of the LayerNorm scale mean over the last `window` steps.",
    "ratio",
    ("layer",),
    row=Row(
        "gradients",
        updated=(
            "the same: (mean now − mean `window` steps ago) / |mean then|, from the oldest sample inside the window"
        ),
    ),
)
WEIGHT_NORM = MetricFamily(
    "mindspore_train_weight_norm",
    "gauge",
    "L2 norm of a watched layer's weights.",
    "1",
    ("layer",),
    row=Row(
        "gradients",
        updated="with `weight_norm: true`: every `grad_norm.every_n_steps` steps, for the watched layers",
        unit="L2 norm",
    ),
)
LAYER_UPDATE_RATIO = MetricFamily(
    "mindspore_train_layer_update_ratio",
    "gauge",
    "How far a layer's weights moved between the last two samples: ||w - w_before|| / ||w||.",
    "1",
    ("layer",),
    row=Row(
        "gradients",
        updated=(
            "with `update_ratio.enable`: every `update_ratio.every_n_steps` steps from the second sample on, "
            "‖w − w_before‖ / ‖w‖ of the `update_ratio.layers` layers and the `top_k` layers that moved least"
            " and most ([update-ratio.md](update-ratio.md))"
        ),
        unit="ratio",
    ),
)
UPDATE_RATIO_MEDIAN = MetricFamily(
    "mindspore_train_update_ratio_median",
    "gauge",
    "The median of every layer's update ratio at the last sample (what a layer that stopped learning is compared "
    "with).",
    "1",
    row=Row("gradients", updated="the same: the median over every layer of the model", unit="ratio"),
)
# -- activation statistics (probes/activations.py; docs/activations.md): a layer's output at the last measured step --
LAYER_ACTIVATION_MEAN = MetricFamily(
    "mindspore_train_layer_activation_mean",
    "gauge",
    "Mean of the finite values of a layer's output at the last measured step.",
    "1",
    ("layer",),
    row=Row(
        "activations",
        updated="measured steps: the mean of the output's finite values; NaN when none is finite",
        unit="the output's units",
    ),
)
LAYER_ACTIVATION_STD = MetricFamily(
    "mindspore_train_layer_activation_std",
    "gauge",
    "Standard deviation of the finite values of a layer's output at the last measured step.",
    "1",
    ("layer",),
    row=Row(
        "activations",
        updated="the same: their standard deviation (population, around that mean)",
        unit="the output's units",
    ),
)
LAYER_ACTIVATION_ABS_MAX = MetricFamily(
    "mindspore_train_layer_activation_abs_max",
    "gauge",
    "Largest absolute finite value of a layer's output at the last measured step.",
    "1",
    ("layer",),
    row=Row("activations", updated="the same: their largest absolute value", unit="the output's units"),
)
LAYER_ACTIVATION_ZERO_RATIO = MetricFamily(
    "mindspore_train_layer_activation_zero_ratio",
    "gauge",
    "Share of a layer's output values that were exactly zero at the last measured step.",
    "ratio",
    ("layer",),
    row=Row("activations", updated="the same: the share of all the output's values that are exactly 0 (dead ReLUs)"),
)
LAYER_ACTIVATION_NONFINITE_RATIO = MetricFamily(
    "mindspore_train_layer_activation_nonfinite_ratio",
    "gauge",
    "Share of a layer's output values that were NaN or infinite at the last measured step.",
    "ratio",
    ("layer",),
    row=Row("activations", updated="the same: the share that are NaN or ±inf"),
)

ACTIONS_TAKEN = MetricFamily(
    "mindspore_train_actions_total",
    "counter",
    "Actions the monitor took on the run it watches.",
    "actions",
    ("action",),
    row=Row(
        "exporter",
        updated=(
            "when `monitor_config.actions` acts on the run; `rollback_stop`: the rollback loop guard ended "
            "training ([rollback.md](rollback.md))"
        ),
        labels=(
            "`action` (`early_stop`, `lr_backoff`, `snapshot`, `rollback`, `rollback_stop`; the enabled ones, from 0)"
        ),
    ),
)
LR_BACKOFF_FACTOR = MetricFamily(
    "mindspore_train_lr_backoff_factor",
    "gauge",
    "The scale lr_backoff put on the optimizer's learning rate (1: untouched).",
    "1",
    row=Row("exporter", updated="with `lr_backoff` on: the scale on the optimizer's learning rate (1 = untouched)"),
)
LAST_SNAPSHOT_STEP = MetricFamily(
    "mindspore_train_last_snapshot_step",
    "gauge",
    "Step of the newest anomaly snapshot under save_dir/snapshots.",
    "steps",
    row=Row(
        "exporter",
        updated="with `snapshot` on, after the first snapshot: the step of the newest one on disk",
        unit="step",
    ),
)
HEALTH_SCORE = MetricFamily(
    "mindspore_train_health_score",
    "gauge",
    "How healthy the last step looked, 0 to 1: the worst of the smoothed-loss trend, the "
    "gradient norm, memory growth and device temperature terms (docs/rollback.md); a good state is kept only "
    "at or above actions.rollback.min_health.",
    "1",
    row=Row(
        "exporter",
        updated=(
            "with `rollback` on, every step: 0 to 1, the worst of the smoothed-loss trend, gradient-norm, "
            "memory-growth and device-temperature terms ([rollback.md](rollback.md#the-health-score))"
        ),
    ),
)
LAST_GOOD_STEP = MetricFamily(
    "mindspore_train_last_good_step",
    "gauge",
    "Step of the newest good state actions.rollback keeps (what a rollback restores).",
    "steps",
    row=Row(
        "exporter",
        updated="with `rollback` on, once a good state is kept: the step a rollback would restore",
        unit="step",
    ),
)
ROLLBACK_LOST_STEPS = MetricFamily(
    "mindspore_train_rollback_lost_steps_total",
    "counter",
    "Steps trained and then undone by rollbacks (divergence step minus good step).",
    "steps",
    row=Row(
        "exporter", updated="with `rollback` on: steps trained and undone (divergence step minus good step, summed)"
    ),
)

# -- data quality (probes/data_quality.py; docs/data-quality.md) ---------------------------------------------------
# mindspore_train_data_quality_*{quantity}: the quantities whose baseline is learned and whose drop is watched.
LABEL_ENTROPY, SEQUENCE_LENGTH = "label_entropy", "sequence_length"
DATA_QUALITY_QUANTITIES = (LABEL_ENTROPY, SEQUENCE_LENGTH)
SEQUENCE_LENGTH_BUCKETS = tuple(float(2**k) for k in range(18))  # 1 to 131,072 tokens

DATA_LABEL_ENTROPY = MetricFamily(
    "mindspore_train_data_label_entropy_bits",
    "gauge",
    "Shannon entropy of the class labels of the last measured batch.",
    "bits",
    row=Row(
        "data",
        updated=(
            "each measured batch: the Shannon entropy of its class labels (0 for one class, log2(k) for k "
            "classes equally often)"
        ),
    ),
)
DATA_SEQUENCE_LENGTH = MetricFamily(
    "mindspore_train_data_sequence_length",
    "gauge",
    "Mean non-padding length of the samples of the last measured batch.",
    "tokens",
    row=Row("data", updated="each measured batch: the mean of its samples' non-padding lengths"),
)
DATA_SEQUENCE_LENGTH_DISTRIBUTION = MetricFamily(
    "mindspore_train_data_sequence_length_distribution",
    "histogram",
    "Non-padding length of each sample of the measured batches.",
    "tokens",
    buckets=SEQUENCE_LENGTH_BUCKETS,
    row=Row(
        "data",
        updated="one observation per sample of the measured batches",
        unit="tokens; buckets 1 to 131,072 in powers of 2",
        series=(
            "samples of at most `le` non-padding tokens",
            "non-padding tokens of the measured samples",
            "samples measured",
        ),
    ),
)
DATA_PADDING_RATIO = MetricFamily(
    "mindspore_train_data_padding_ratio",
    "gauge",
    "Share of the token positions of the last measured batch that are padding.",
    "ratio",
    row=Row("data", updated="each measured batch: padding positions over all positions of its token column"),
)
DATA_CHECKED_SAMPLES = MetricFamily(
    "mindspore_train_data_checked_samples_total",
    "counter",
    "Samples of the batches data_quality measured.",
    "samples",
    row=Row("data", updated="the samples of the measured batches (what the three counters below are shares of)"),
)
DATA_DUPLICATE_SAMPLES = MetricFamily(
    "mindspore_train_data_duplicate_samples_total",
    "counter",
    "Samples of a measured batch whose tokens repeat an earlier sample of the same batch.",
    "samples",
    row=Row("data", updated="samples whose tokens repeat an earlier sample of the same batch"),
)
DATA_EMPTY_SAMPLES = MetricFamily(
    "mindspore_train_data_empty_samples_total",
    "counter",
    "Samples of the measured batches without a non-padding token.",
    "samples",
    row=Row("data", updated="samples without a non-padding token"),
)
DATA_OUT_OF_VOCAB = MetricFamily(
    "mindspore_train_data_out_of_vocab_tokens_total",
    "counter",
    "Non-padding token ids of the measured batches outside [0, data_quality.vocab_size).",
    "tokens",
    row=Row("data", updated="non-padding token ids below 0 or at or above `data_quality.vocab_size`"),
)
DATA_QUALITY_BASELINE = MetricFamily(
    "mindspore_train_data_quality_baseline",
    "gauge",
    "A quantity's median over the first data_quality.baseline_steps measured batches.",
    "the quantity's unit",
    ("quantity",),
    row=Row(
        "data",
        updated=(
            "once learned: the median of the quantity over the first `data_quality.baseline_steps` measured batches"
        ),
        unit="the quantity's",
    ),
)
DATA_QUALITY_LOW_STREAK = MetricFamily(
    "mindspore_train_data_quality_low_streak",
    "gauge",
    "Measured batches in a row whose quantity was below data_quality.drop_ratio times its baseline.",
    "batches",
    ("quantity",),
    row=Row(
        "data",
        updated=("measured batches in a row below `data_quality.drop_ratio` x the baseline (0 after one that is not)"),
    ),
)
DATA_QUALITY_LOW = MetricFamily(
    "mindspore_train_data_quality_low",
    "gauge",
    "1 while the quantity's low streak is at least data_quality.streak batches, else 0.",
    "1",
    ("quantity",),
    row=Row(
        "data",
        updated=("1 while the streak is at least `data_quality.streak`: what `MindSporeTrainingDataQualityDrop` reads"),
    ),
)
DATA_LISTED_BATCHES = MetricFamily(
    "mindspore_train_data_listed_batches_total",
    "counter",
    "Batches of a data-quality drop listed in save_dir/skipped-batches.json (data_quality.list_batches).",
    "batches",
    row=Row(
        "data", updated="with `data_quality.list_batches`: batches of a drop written to `save_dir/skipped-batches.json`"
    ),
)

HOOK_DURATION = MetricFamily(
    "mindspore_exporter_callback_duration_seconds",
    "histogram",
    "The monitor's own cost per hook call.",
    "seconds",
    ("hook",),
    buckets=HOOK_BUCKETS,
    row=Row(
        "exporter",
        updated=(
            "every hook call; `step_end` excludes the loss read, which is the device synchronisation and "
            "belongs to the step"
        ),
        labels="`hook` (`train_begin`, `step_begin`, `step_end`, `train_end`, `eval_end`)",
        series=("hook calls that took at most `le` seconds", "seconds the monitor spent in the hook", "hook calls"),
    ),
)
ERRORS = MetricFamily(
    "mindspore_exporter_errors_total",
    "counter",
    "Failures the monitor absorbed instead of raising into training.",
    "errors",
    ("component",),
    row=Row(
        "exporter",
        updated="when the monitor absorbs a failure; each configured component is pre-created at 0",
        labels=(
            "`component` (a probe name, `callback`, `sampler`, `prometheus`, `local`, `otlp`, `tensorboard`, "
            "`wandb`, `console`, `pushgateway`, `file_sd`, `hardware.<reader>`, `strategy.<name>`)"
        ),
    ),
)
COMPONENT_DISABLED = MetricFamily(
    "mindspore_exporter_component_disabled",
    "gauge",
    f"1 for a component the monitor switched off after {FAILURES_BEFORE_DISABLE} failures in a row.",
    "1",
    ("component",),
    row=Row(
        "exporter",
        updated=(
            "appears (at 1) when a probe, the memory sampler, or the TensorBoard or W&B writer failed 3 times"
            " in a row and was switched off for the rest of the process; logged once with the last error. "
            "Network sinks (`otlp`, `pushgateway`) and the JSON Lines writer are never switched off: a peer "
            "may come back and a full disk may get room again, so each failed export or write is counted and "
            "tried again (JSON Lines after a back-off from its usual pause, doubling up to 60 s)"
        ),
    ),
)
DROPPED_RECORDS = MetricFamily(
    "mindspore_exporter_dropped_samples_total",
    "counter",
    "Records a sink dropped: it fell behind, or could not write them (a full disk).",
    "records",
    ("sink",),
    row=Row(
        "exporter",
        updated=(
            "when the JSON Lines, TensorBoard or W&B queue (100,000 records) overflows between writes, and "
            "for each record of a batch that could not be written (a full disk: the JSON Lines file keeps "
            "whole lines only)"
        ),
        labels="`sink` (`local`, `tensorboard`, `wandb`)",
    ),
)

STRATEGY_SECONDS = MetricFamily(
    "mindspore_exporter_strategy_seconds_total",
    "counter",
    "Time a strategy of the user's took in its hooks, on the training thread (docs/strategies.md).",
    "seconds",
    ("strategy",),
    row=Row(
        "exporter",
        updated=(
            "with `strategies` (yours, [strategies.md](strategies.md)): each strategy's time in its hooks, on"
            " the training thread"
        ),
    ),
)
STRATEGY_DROPPED = MetricFamily(
    "mindspore_exporter_strategy_dropped_total",
    "counter",
    'Values a strategy of the user\'s returned that were not exported: reason="keys" (a key past its bound of '
    'keys), reason="value" (not a number, or beyond a float\'s range) (docs/strategies.md).',
    "values",
    ("strategy", "reason"),
    row=Row(
        "exporter",
        updated=(
            "with `strategies`: values a strategy returned that were not exported: `keys` (a key past its "
            "first 32), `value` (not a number, or beyond a float's range) "
            "([strategies.md](strategies.md#its-numbers))"
        ),
    ),
)

# -- hardware (features/hardware/; docs/hardware.md) --------------------------------------------------------------
# `device`: gpu<N>, npu<N> as this rank sees them, or host. Each quantity exists only where the device's interface
# reports it.

DEVICE_TEMPERATURE = MetricFamily(
    "mindspore_train_device_temperature_celsius",
    "gauge",
    "Device (or host CPU) temperature.",
    "celsius",
    ("device",),
    row=Row(
        "hardware", updated="every reading: GPU (NVML), NPU (npu-smi), the host's hottest CPU sensor", group="hardware"
    ),
)
DEVICE_POWER = MetricFamily(
    "mindspore_train_device_power_watts",
    "gauge",
    "Device power draw.",
    "watts",
    ("device",),
    row=Row("hardware", updated="every reading (NVML, npu-smi)", group="hardware"),
)
DEVICE_POWER_LIMIT = MetricFamily(
    "mindspore_train_device_power_limit_watts",
    "gauge",
    "Device power limit in force.",
    "watts",
    ("device",),
    row=Row("hardware", updated="every reading (NVML's enforced limit)", group="hardware"),
)
DEVICE_UTILIZATION = MetricFamily(
    "mindspore_train_device_utilization_ratio",
    "gauge",
    "Share of the last sample interval the device's compute (GPU SMs, NPU AI cores, host CPUs) was busy.",
    "ratio",
    ("device",),
    row=Row("hardware", updated="every reading: GPU SMs, NPU AI cores, host CPUs busy", group="hardware"),
)
DEVICE_MEMORY_UTILIZATION = MetricFamily(
    "mindspore_train_device_memory_utilization_ratio",
    "gauge",
    "Share of the last sample interval the device's memory was being read or written.",
    "ratio",
    ("device",),
    row=Row(
        "hardware",
        updated="every reading: the memory read or written (NVML, npu-smi's HBM bandwidth)",
        group="hardware",
    ),
)
DEVICE_MEMORY_USED = MetricFamily(
    "mindspore_train_device_memory_used_bytes",
    "gauge",
    "Device memory in use (all processes).",
    "bytes",
    ("device",),
    row=Row(
        "hardware",
        updated="every reading (all processes on the device; the host's total less available)",
        group="hardware",
    ),
)
DEVICE_MEMORY_TOTAL = MetricFamily(
    "mindspore_train_device_memory_total_bytes",
    "gauge",
    "Device memory in all.",
    "bytes",
    ("device",),
    row=Row("hardware", updated="every reading", group="hardware"),
)
DEVICE_CLOCK = MetricFamily(
    "mindspore_train_device_clock_hertz",
    "gauge",
    "Device compute clock (GPU SM, NPU AI core).",
    "hertz",
    ("device",),
    row=Row("hardware", updated="every reading: GPU SM clock, NPU AI core clock", group="hardware"),
)
DEVICE_THROTTLED = MetricFamily(
    "mindspore_train_device_throttled",
    "gauge",
    "1 while the device holds its clock down for this reason (the interface's name), 0 after.",
    "1",
    ("device", "reason"),
    row=Row(
        "hardware",
        updated=(
            "every reading (NVML's clock event reasons, lower case: `sw_power_cap`, `hw_thermal_slowdown` "
            "...): 1 while the reason holds, 0 after"
        ),
        group="hardware",
    ),
)
DEVICE_ECC_UNCORRECTED = MetricFamily(
    "mindspore_train_device_ecc_uncorrected_errors_total",
    "counter",
    "Uncorrected ECC memory errors the device counted since its driver loaded.",
    "errors",
    ("device",),
    row=Row(
        "hardware",
        updated=(
            "every reading: NVML's volatile uncorrected count, npu-smi's HBM double-bit count (both since the"
            " driver loaded)"
        ),
        group="hardware",
    ),
)
DEVICE_PCIE = MetricFamily(
    "mindspore_train_device_pcie_bytes_per_second",
    "gauge",
    "Device PCIe throughput.",
    "bytes per second",
    ("device", "direction"),
    row=Row("hardware", updated="every reading (NVML)", group="hardware", labels="`device`, `direction` (`rx`, `tx`)"),
)
DEVICE_LINK_UP = MetricFamily(
    "mindspore_train_device_link_up",
    "gauge",
    "1 while the device's network link is up (Ascend RoCE).",
    "1",
    ("device",),
    row=Row("hardware", updated="every reading (hccn_tool's RoCE link on Ascend)", group="hardware"),
)
DEVICE_HEALTHY = MetricFamily(
    "mindspore_train_device_healthy",
    "gauge",
    "1 while the device's interface calls it healthy.",
    "1",
    ("device",),
    row=Row("hardware", updated="every reading (npu-smi's Health: OK is 1)", group="hardware"),
)
# The join to the device exporters: their labels in snake_case (dcgm-exporter's UUID, modelName and Hostname as
# uuid, model_name and hostname; the recording rules rename theirs with label_replace; docs/hardware.md), empty where
# they do not apply.
DEVICE_INFO = MetricFamily(
    "mindspore_train_device_info",
    "gauge",
    "A device this rank uses, with the labels dcgm-exporter and npu-exporter give it; always 1.",
    "1",
    (
        "device",
        "hostname",
        "gpu",
        "uuid",
        "pci_bus_id",
        "id",
        "vdie_id",
        "pcie_bus_info",
        "model_name",
        "pod",
        "namespace",
        "container",
    ),
    row=Row(
        "hardware",
        updated="a reader's first reading",
        group="hardware",
        type="gauge (=1)",
        labels=(
            "`device`, `hostname`, `gpu`, `uuid`, `pci_bus_id` (dcgm-exporter's `Hostname`, `gpu`, `UUID`, "
            "`pci_bus_id`), `model_name` (dcgm-exporter's `modelName`, npu-exporter's `model_name`), `id`, "
            "`vdie_id`, `pcie_bus_info` (npu-exporter's), `pod`, `namespace`, `container`: empty where they "
            "do not apply"
        ),
        unit="-",
    ),
)


# The families declared here; a part may declare one that only it reads in its own module, beside its class, and
# `make generate` copies it into core/builtin_parts.py (plain values, no import), so this module still imports
# neither numpy nor MindSpore nor any part.
CATALOGUE_FAMILIES: tuple[MetricFamily, ...] = tuple(
    value for value in list(globals().values()) if isinstance(value, MetricFamily)
)
PART_FAMILIES: tuple[MetricFamily, ...] = tuple(
    MetricFamily(
        name,
        cast(MetricType, kind),
        help_text,
        unit,
        tuple(labels),
        tuple(buckets),
        None if row is None else Row(*row),
    )
    for name, kind, help_text, unit, labels, buckets, row in builtin_parts.FAMILIES
)
FAMILIES: tuple[MetricFamily, ...] = CATALOGUE_FAMILIES + PART_FAMILIES


# -- what warn_on_value (and the grad_norm / layernorm thresholds) can watch -------------------------------------


@dataclass(frozen=True)
class Watchable:
    """A key of the breach counter's `metric` label: the family it watches, which way a bare number bounds it,
    and the `metrics` group that must be on for it to see values (None: a config section of its own)."""

    family: MetricFamily
    direction: Literal["max", "min"]
    group: str | None
    # Checked by the memory sampler thread rather than at step end.
    slow: bool = False
    # Throughput starts low while graphs compile: a lower bound waits for warm-up.
    after_warmup: bool = False


WATCHABLE: dict[str, Watchable] = {
    "loss": Watchable(LOSS, "max", "loss"),
    "loss_smoothed": Watchable(LOSS_SMOOTHED, "max", "loss"),
    "tokens_per_second": Watchable(TOKENS_PER_SECOND, "min", "tokens_per_second", after_warmup=True),
    "samples_per_second": Watchable(SAMPLES_PER_SECOND, "min", "samples_per_second", after_warmup=True),
    "memory_growth_ratio": Watchable(MEMORY_GROWTH_RATIO, "max", "memory_usage", slow=True),
    # Set by grad_norm.threshold and layernorm.drift_threshold, not by warn_on_value.
    "grad_norm": Watchable(GRAD_NORM, "max", None),
    "layernorm_scale_drift_ratio": Watchable(LAYERNORM_DRIFT, "max", None),
}
# The keys warn_on_value itself accepts.
WARN_ON_VALUE_KEYS = tuple(key for key, watch in WATCHABLE.items() if watch.group is not None)

# Per-step values that go into each JSON Lines step record (beside the sample's own loss, time and counts).
JSONL_STEP_COLUMNS = (
    LOSS_SMOOTHED,
    LOSS_RISING,
    LEARNING_RATE,
    SAMPLES_PER_SECOND,
    TOKENS_PER_SECOND,
    GRAD_NORM,
    MODEL_FLOPS_PER_SECOND,
    MFU,
    LAYER_UPDATE_RATIO,
    UPDATE_RATIO_MEDIAN,
)

# -- recording rules (deploy/prometheus/rules) ---------------------------------------------------------------------

RANK_STEP_MEAN = "rank:mindspore_train_step_duration_seconds:mean"
RANK_WAIT_MEAN = "rank:mindspore_train_data_wait_seconds:mean"
RANK_CYCLE_MEAN = "rank:mindspore_train_step_cycle_seconds:mean"
PROJECT_LOSS_MEAN = "project:mindspore_train_loss:mean"
PROJECT_LOSS_MIN = "project:mindspore_train_loss:min"
PROJECT_LOSS_MAX = "project:mindspore_train_loss:max"
PROJECT_TOKENS_PER_SECOND = "project:mindspore_train_tokens_per_second:sum"
PROJECT_SAMPLES_PER_SECOND = "project:mindspore_train_samples_per_second:sum"
PROJECT_STEP_MAX = "project:mindspore_train_step_duration_seconds:max"
PROJECT_STEP_MEDIAN = "project:mindspore_train_step_duration_seconds:median"
PROJECT_RANKS_REPORTING = "project:mindspore_train_ranks_reporting:count"
PROJECT_WAIT_MEDIAN = "project:mindspore_train_data_wait_seconds:median"
PROJECT_CYCLE_MEDIAN = "project:mindspore_train_step_cycle_seconds:median"
# Productive time over all time of every rank of a project (docs/goodput.md).
PROJECT_GOODPUT_1H = "project:mindspore_train_goodput:ratio1h"
PROJECT_GOODPUT_24H = "project:mindspore_train_goodput:ratio24h"
# Each rank's relative slowness score: the job's cycle over the cycle it would have were this rank's own work the
# best rank's (ms_exporter/core/analysis/slowness.py's relative_scores, in PromQL).
RANK_RELATIVE_SLOWNESS = "rank:mindspore_train_slowness_relative:score"
# The share of a group's ranks (mindspore_train_parallel_group_info, groups of two or more) whose fail-slow detector
# has flagged a slowdown: 1 names the whole group.
PROJECT_GROUP_FAILSLOW = "project_group:mindspore_train_failslow:ratio"
# The share of a rank's replica group that holds the same parameters as it at the group's latest comparison.
RANK_REPLICAS_AGREEING = "rank:mindspore_train_replicas_agreeing:ratio"
# The same per bucket of the replica checks' checksums (kind, bucket): docs/sdc.md.
RANK_CHECKSUMS_AGREEING = "rank:mindspore_train_checksums_agreeing:ratio"
# Model FLOPs utilisation of a project (docs/mfu.md): its model FLOPs per second in total, over the peaks of the
# ranks that report an MFU (the job's MFU), and the mean of its ranks' MFU.
PROJECT_MODEL_FLOPS = "project:mindspore_train_model_flops_per_second:sum"
PROJECT_MFU = "project:mindspore_train_mfu:ratio"
PROJECT_MFU_MEAN = "project:mindspore_train_mfu:mean"
# A rank's devices (docs/hardware.md#joining-the-device-exporters), labelled project, rank, device: each quantity as
# the rank's own hardware reader reads it, else as npu-exporter or dcgm-exporter reads the same device (joined to
# the rank through mindspore_train_device_info).
RANK_DEVICE_TEMPERATURE = "rank_device:mindspore_train_device_temperature_celsius:max"
RANK_DEVICE_POWER = "rank_device:mindspore_train_device_power_watts:max"
RANK_DEVICE_UTILIZATION = "rank_device:mindspore_train_device_utilization_ratio:max"
# 1 while the device holds its clock down for heat or power (not for idling or an applications-clock setting).
RANK_DEVICE_THROTTLED = "rank_device:mindspore_train_device_throttled:max"
# The clock-event reasons that mean heat or power, in NVML's names (DEVICE_THROTTLED's `reason` label): what
# RANK_DEVICE_THROTTLED, MindSporeTrainingDeviceThrottling and `top`'s THROTTLED count. Left out: gpu_idle,
# applications_clocks_setting and display_clock_setting (nothing wrong); sync_boost (held to another GPU's clock:
# that GPU is the one to name); sw_power_cap, the normal state of a fully loaded data-centre GPU at its power limit,
# so every rank of a busy job would read as throttled and the word would name nobody; board_limit, reliability and
# bits nvml.h does not name, whose meaning is not documented.
HEAT_POWER_REASONS = ("hw_slowdown", "sw_thermal_slowdown", "hw_thermal_slowdown", "hw_power_brake_slowdown")
RANK_DEVICE_ECC_ERRORS = "rank_device:mindspore_train_device_ecc_uncorrected_errors:max"
RANK_DEVICE_LINK_UP = "rank_device:mindspore_train_device_link_up:min"
# One series per device, always 1, its `state` label one of DEVICE_STATES (the first that holds, in this order).
RANK_DEVICE_STATE = "rank_device:mindspore_train_device_state:info"
DEVICE_STATES = ("ecc_errors", "link_down", "throttled", "hot", "healthy")
