"""Every metric family the monitor exports, the closed sets of label values, and the recording-rule names.

This is the one place a name is written. Probes register their families from it, and the readers (threshold
watching, the live page's history, the JSON Lines columns, `top`, the report, the rules and the dashboard) take
their names from it too. docs/metrics.md is held to it by tests/unit/test_catalogue.py: a family added here
without a row there fails, and so does a row for a family that is not here.

Importing this module costs nothing: no MindSpore, no numpy (the operator tools use it).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

MetricType = Literal["gauge", "counter", "histogram"]

TRAIN_PREFIX = "mindspore_train_"
USER_PREFIX = TRAIN_PREFIX + "user_"  # a user's strategy's numbers: <USER_PREFIX><strategy>_<key> (docs/strategies.md)
EXPORTER_PREFIX = "mindspore_exporter_"  # the monitor's own health
# Labels every series of a rank carries (MetricStore's constant labels).
CONSTANT_LABELS = ("rank", "project")


@dataclass(frozen=True)
class MetricFamily:
    """One exported family. `labels` are its own label names (the constant ones come on top)."""

    name: str
    type: MetricType
    help: str
    unit: str
    labels: tuple[str, ...] = ()
    buckets: tuple[float, ...] = ()

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
)
PARALLEL_GROUP_INFO = MetricFamily(
    "mindspore_train_parallel_group_info",
    "gauge",
    "A group of ranks this rank works in (its node; its pipeline stage and model copy where the parallel layout "
    "says); always 1.",
    "1",
    ("kind", "group"),
)
WORLD_SIZE = MetricFamily("mindspore_train_world_size", "gauge", "Number of ranks in the job.", "ranks")

GLOBAL_STEP = MetricFamily(
    "mindspore_train_global_step", "gauge", "Current global step (cb_params.cur_step_num).", "steps"
)
EPOCH = MetricFamily("mindspore_train_epoch", "gauge", "Current epoch (cb_params.cur_epoch_num).", "epochs")
STEPS = MetricFamily("mindspore_train_steps_total", "counter", "Steps this process completed.", "steps")
LAST_STEP_TIMESTAMP = MetricFamily(
    "mindspore_train_last_step_timestamp_seconds",
    "gauge",
    "Unix time the last step ended (train begin, before the first step).",
    "seconds",
)
PLANNED_STEPS = MetricFamily(
    "mindspore_train_planned_steps",
    "gauge",
    "Global step at which the current training call ends, when known.",
    "steps",
)

PHASE = MetricFamily(
    "mindspore_train_phase",
    "gauge",
    "1 for the phase this rank is in, 0 for the others (ended: training ended normally or was stopped as asked).",
    "1",
    ("phase",),
)
PHASE_SECONDS = MetricFamily(
    "mindspore_train_phase_seconds", "gauge", "Seconds since the current phase began.", "seconds"
)
HANG_SUSPECTED = MetricFamily(
    "mindspore_train_hang_suspected", "gauge", "1 while the current phase has outlasted its hang deadline, else 0.", "1"
)
HANG_DUMPS = MetricFamily(
    "mindspore_train_hang_dumps_total", "counter", "Stack dumps the hang watchdog wrote to save_dir.", "dumps"
)
HANG_DEADLINE = MetricFamily(
    "mindspore_train_hang_deadline_seconds",
    "gauge",
    "Seconds the current phase may last before it counts as a hang (learned from the "
    "run's own step cycles in step, data_wait and callbacks).",
    "seconds",
)

TIME_SECONDS = MetricFamily(
    "mindspore_train_time_seconds_total",
    "counter",
    "This process's wall time by where it went; the buckets sum to its age.",
    "seconds",
    ("bucket",),
)
RUN_TIME_SECONDS = MetricFamily(
    "mindspore_train_run_time_seconds_total",
    "counter",
    "The run's time by bucket over all its processes, as of the last save of the run "
    "state (never lower than what an earlier process exported).",
    "seconds",
    ("bucket",),
)
RESTARTS = MetricFamily(
    "mindspore_train_restarts_total", "counter", "Processes of this run that came before this one.", "restarts"
)
RUN_INFO = MetricFamily(
    "mindspore_train_run_info", "gauge", "The run this process belongs to; always 1.", "1", ("run_id",)
)
# The checkpoint interval advisor (core/analysis/checkpoint_interval.py, docs/failslow.md#checkpoint-interval).
CHECKPOINT_SAVE_SECONDS = MetricFamily(
    "mindspore_train_checkpoint_save_seconds",
    "gauge",
    "Seconds a checkpoint save holds training, the mean of this process's saves.",
    "seconds",
)
CHECKPOINT_INTERVAL = MetricFamily(
    "mindspore_train_checkpoint_interval_seconds",
    "gauge",
    "Seconds of training between two checkpoint saves, as this process saves (the mean, a save's time left out).",
    "seconds",
)
MTBF = MetricFamily(
    "mindspore_train_mtbf_seconds",
    "gauge",
    "The run's mean time between failures: its wall time over its restarts (processes that did not end normally).",
    "seconds",
)
FAILURE_COST = MetricFamily(
    "mindspore_train_failure_cost_seconds",
    "gauge",
    "What a failure costs the run besides the work since the last save: from the failed process's last sign of "
    "life to this process's first step (detection, rescheduling, start-up, compilation).",
    "seconds",
)
CHECKPOINT_INTERVAL_ADVISED = MetricFamily(
    "mindspore_train_checkpoint_interval_advised_seconds",
    "gauge",
    "The checkpoint interval of highest expected goodput given the run's failures, save time and failure cost "
    "(Daly's model, over the MTBF's uncertainty); `bound` low and high: at the ends of the MTBF's 90% interval.",
    "seconds",
    ("bound",),
)
CHECKPOINT_GOODPUT_LOSS = MetricFamily(
    "mindspore_train_checkpoint_interval_goodput_loss_ratio",
    "gauge",
    "The share of wall time the run's current checkpoint interval loses against the advised one (Daly's model).",
    "1",
)
ADVISED_BOUNDS = ("best", "low", "high")

PARAM_FINGERPRINT = MetricFamily(
    "mindspore_train_param_fingerprint",
    "gauge",
    "CRC-32 of this rank's trainable parameters at the last fingerprint step: equal on "
    "every replica of its group while they hold the same weights.",
    "1",
    ("replica_group",),
)
PARAM_CHECKSUM = MetricFamily(
    "mindspore_train_param_checksum",
    "gauge",
    "CRC-32 of one bucket of this rank's weights or optimizer state, folded over the bit sums of every step since the "
    "fingerprint step before: equal on every replica of its group while they hold the same bits at every step.",
    "1",
    ("replica_group", "kind", "bucket"),
)
LOCAL_GRAD_NORM = MetricFamily(
    "mindspore_train_local_grad_norm",
    "gauge",
    "This rank's global L2 norm of its own gradients before the all-reduce, at the last step (a train cell that "
    "measures it: GradNormTrainOneStepCell).",
    "1",
    ("replica_group",),
)
LOCAL_GRAD_OUTLIERS = MetricFamily(
    "mindspore_train_local_grad_outliers_total",
    "counter",
    "Steps whose local gradient norm was not finite or more than divergence.local_grad_factor times the median of "
    "this rank's recent ones: a corrupted local gradient, which every replica then applies.",
    "steps",
    ("replica_group",),
)
LOCAL_GRAD_SKIPPED = MetricFamily(
    "mindspore_train_local_grad_skipped_steps_total",
    "counter",
    "Steps this rank skipped (no update applied) because a replica's local gradient norm was an outlier "
    "(divergence.skip_local_grad_outliers): the same steps on every replica.",
    "steps",
    ("replica_group",),
)
LOCAL_GRAD_OUTLIER_STEP = MetricFamily(
    "mindspore_train_local_grad_outlier_step",
    "gauge",
    "The step of this rank's last local gradient norm outlier.",
    "steps",
    ("replica_group",),
)
PARAM_FINGERPRINT_STEP = MetricFamily(
    "mindspore_train_param_fingerprint_step",
    "gauge",
    "The step the fingerprint was taken at.",
    "steps",
    ("replica_group",),
)
PARAM_FINGERPRINT_OVERFLOW = MetricFamily(
    "mindspore_train_param_fingerprint_overflow",
    "gauge",
    "1 if the fingerprint step overflowed, as the train cell reported it.",
    "1",
    ("replica_group",),
)
PARAM_FINGERPRINT_GRAD_NORM = MetricFamily(
    "mindspore_train_param_fingerprint_grad_norm",
    "gauge",
    "Global gradient norm of the fingerprint step after the all-reduce, as the "
    "train cell reported it (NaN: not reported that step).",
    "1",
    ("replica_group",),
)

LOSS = MetricFamily("mindspore_train_loss", "gauge", "Loss of the last step.", "loss")
LOSS_SMOOTHED = MetricFamily(
    "mindspore_train_loss_smoothed", "gauge", "Mean of the last loss_window finite losses.", "loss"
)
LOSS_RISING = MetricFamily(
    "mindspore_train_loss_consecutive_increases", "gauge", "Steps in a row the loss went up.", "steps"
)
NONFINITE_LOSS = MetricFamily(
    "mindspore_train_nonfinite_loss_total", "counter", "Steps whose loss was NaN or Inf.", "steps"
)

LEARNING_RATE = MetricFamily(
    "mindspore_train_learning_rate", "gauge", "Learning rate the optimizer used for the last step.", "1", ("group",)
)
LEARNING_RATE_SCHEDULED = MetricFamily(
    "mindspore_train_learning_rate_scheduled",
    "gauge",
    "1 when the learning rate is a schedule (it should change), 0 when fixed.",
    "1",
    ("group",),
)

STEP_DURATION = MetricFamily(
    "mindspore_train_step_duration_seconds",
    "histogram",
    "Wall time per step, measured after the loss was read.",
    "seconds",
    buckets=STEP_BUCKETS,
)
DATA_WAIT = MetricFamily(
    "mindspore_train_data_wait_seconds",
    "histogram",
    "Time from one step's end to the next step's begin (data loading, host work).",
    "seconds",
    buckets=WAIT_BUCKETS,
)

# Fail-slow (core/analysis/slowness.py, docs/failslow.md): a rank's own work per step, scored and watched for
# the step a slowdown starts.
OWN_WORK = MetricFamily(
    "mindspore_train_own_work_seconds",
    "gauge",
    "This rank's own work per step, averaged over about the last 10 steps: its data wait (and, in the loop API, the "
    "time up to the collective where the loop marks it), the part of the step cycle no other rank waits in.",
    "seconds",
)
CLEAN_CYCLE = MetricFamily(
    "mindspore_train_clean_cycle_seconds",
    "gauge",
    "This rank's step cycle (step and data wait) before any slowdown: the fail-slow detector's baseline.",
    "seconds",
)
SLOWNESS_SCORE = MetricFamily(
    "mindspore_train_slowness_score",
    "gauge",
    "This rank's individual slowness score: its clean cycle over the cycle its own work makes now (1: as fast as "
    "its own best; 0.8: its own work adds a quarter to the cycle), or its slowest device's clock over its best where "
    "that is lower.",
    "1",
)
FAILSLOW = MetricFamily(
    "mindspore_train_failslow",
    "gauge",
    "1 while this rank's own work is flagged as slowed (a CUSUM over its excess crossed the threshold), else 0.",
    "1",
)
FAILSLOW_ONSET_STEP = MetricFamily(
    "mindspore_train_failslow_onset_step",
    "gauge",
    "The first step of this rank's current (or last) flagged slowdown: the change-point estimate.",
    "steps",
)
FAILSLOW_SIZE = MetricFamily(
    "mindspore_train_failslow_size_ratio",
    "gauge",
    "How much this rank's current (or last) flagged slowdown adds per step, as a share of its clean cycle.",
    "1",
)
FAILSLOW_ONSETS = MetricFamily(
    "mindspore_train_failslow_onsets_total", "counter", "Slowdowns flagged on this rank.", "slowdowns"
)
FAILSLOW_SECONDS = MetricFamily(
    "mindspore_train_failslow_seconds_total",
    "counter",
    "Seconds of step cycle this rank's flagged slowdowns added (the job waited as long): part of the goodput "
    "ledger's data_wait and productive time, not a bucket of its own.",
    "seconds",
)

SAMPLES = MetricFamily("mindspore_train_samples_total", "counter", "Samples consumed.", "samples")
TOKENS = MetricFamily("mindspore_train_tokens_total", "counter", "Non-padding tokens consumed.", "tokens")
SAMPLES_PER_SECOND = MetricFamily(
    "mindspore_train_samples_per_second", "gauge", "Samples per second over a short recent window.", "samples/s"
)
TOKENS_PER_SECOND = MetricFamily(
    "mindspore_train_tokens_per_second", "gauge", "Tokens per second over a short recent window.", "tokens/s"
)

FLOPS_PER_TOKEN = MetricFamily(
    "mindspore_train_flops_per_token",
    "gauge",
    "Model FLOPs (forward and backward) per token over the recent window, the attention "
    "term from the batches' real sequence lengths.",
    "FLOPs/token",
)
MODEL_FLOPS_PER_SECOND = MetricFamily(
    "mindspore_train_model_flops_per_second",
    "gauge",
    "Model FLOPs per second of this rank: tokens per second times FLOPs per token "
    "(padding is not counted as work), over the ranks that compute each batch "
    "together.",
    "FLOPs/s",
)
PEAK_FLOPS = MetricFamily(
    "mindspore_train_peak_flops_per_device",
    "gauge",
    "The device's peak FLOPs per second, as configured (flops.peak_flops_per_device).",
    "FLOPs/s",
)
MFU = MetricFamily(
    "mindspore_train_mfu",
    "gauge",
    "Model FLOPs utilisation: model FLOPs per second over the device's peak (0-1).",
    "ratio",
)
FLOPS_INFO = MetricFamily(
    "mindspore_train_flops_info",
    "gauge",
    "Where FLOPs per token come from (source: per_token, model or parameters; attention: "
    "causal, full, none or in_per_token), the peak's preset (or number, none) and the ranks "
    "that compute each batch together; always 1.",
    "1",
    ("source", "attention", "peak", "ranks_per_batch"),
)

EVAL_METRIC = MetricFamily(
    "mindspore_train_eval_metric", "gauge", "Each metric of the latest evaluation.", "1", ("name",)
)

MEMORY_BYTES = MetricFamily("mindspore_train_memory_bytes", "gauge", "Memory in use, by kind.", "bytes", ("kind",))
MEMORY_GROWTH_RATIO = MetricFamily(
    "mindspore_train_memory_growth_ratio",
    "gauge",
    "(current - baseline) / baseline, baseline taken after warm-up.",
    "ratio",
    ("kind",),
)
MEMORY_GROWTH_RATE = MetricFamily(
    "mindspore_train_memory_growth_bytes_per_second",
    "gauge",
    "Memory growth rate over the recent samples.",
    "bytes/s",
    ("kind",),
)
MEMORY_RISING = MetricFamily(
    "mindspore_train_memory_consecutive_increases",
    "gauge",
    "Samples in a row that grew by more than 1 MiB.",
    "samples",
    ("kind",),
)

BREACHES = MetricFamily(
    "mindspore_train_threshold_breaches_total",
    "counter",
    "warn_on_value breach episodes, by metric.",
    "episodes",
    ("metric",),
)

GRAD_NORM = MetricFamily(
    "mindspore_train_grad_norm",
    "gauge",
    "Global L2 norm of the gradients (before clipping) at the last sampled step.",
    "1",
)
GRAD_NORM_DISTRIBUTION = MetricFamily(
    "mindspore_train_grad_norm_distribution",
    "histogram",
    "Global gradient norm at sampled steps.",
    "1",
    buckets=NORM_BUCKETS,
)
GRAD_NORM_CLIPPED = MetricFamily(
    "mindspore_train_grad_norm_clipped_total",
    "counter",
    "Sampled steps whose gradient norm exceeded the clip threshold.",
    "steps",
)
LAYER_GRAD_NORM = MetricFamily(
    "mindspore_train_layer_grad_norm",
    "gauge",
    "L2 norm of a layer's gradients at the last sampled step.",
    "1",
    ("layer",),
)
LAYER_GRAD_ZERO = MetricFamily(
    "mindspore_train_layer_grad_zero_total",
    "counter",
    "Sampled steps where a watched layer's gradient norm was exactly zero.",
    "steps",
    ("layer",),
)
LOSS_SCALE = MetricFamily("mindspore_train_loss_scale", "gauge", "Current loss scale.", "1")
OVERFLOW_STEPS = MetricFamily(
    "mindspore_train_overflow_steps_total", "counter", "Steps the loss-scale cell reported as overflow.", "steps"
)
LAYERNORM_MEAN = MetricFamily(
    "mindspore_train_layernorm_scale_mean", "gauge", "Mean of a LayerNorm scale (gamma).", "1", ("layer",)
)
LAYERNORM_STD = MetricFamily(
    "mindspore_train_layernorm_scale_std", "gauge", "Standard deviation of a LayerNorm scale.", "1", ("layer",)
)
LAYERNORM_DRIFT = MetricFamily(
    "mindspore_train_layernorm_scale_drift_ratio",
    "gauge",
    "Relative change of the LayerNorm scale mean over the last `window` steps.",
    "ratio",
    ("layer",),
)
WEIGHT_NORM = MetricFamily(
    "mindspore_train_weight_norm", "gauge", "L2 norm of a watched layer's weights.", "1", ("layer",)
)
LAYER_UPDATE_RATIO = MetricFamily(
    "mindspore_train_layer_update_ratio",
    "gauge",
    "How far a layer's weights moved between the last two samples: ||w - w_before|| / ||w||.",
    "1",
    ("layer",),
)
UPDATE_RATIO_MEDIAN = MetricFamily(
    "mindspore_train_update_ratio_median",
    "gauge",
    "The median of every layer's update ratio at the last sample (what a layer that stopped learning is compared "
    "with).",
    "1",
)
# -- activation statistics (probes/activations.py; docs/activations.md): a layer's output at the last measured step --
LAYER_ACTIVATION_MEAN = MetricFamily(
    "mindspore_train_layer_activation_mean",
    "gauge",
    "Mean of the finite values of a layer's output at the last measured step.",
    "1",
    ("layer",),
)
LAYER_ACTIVATION_STD = MetricFamily(
    "mindspore_train_layer_activation_std",
    "gauge",
    "Standard deviation of the finite values of a layer's output at the last measured step.",
    "1",
    ("layer",),
)
LAYER_ACTIVATION_ABS_MAX = MetricFamily(
    "mindspore_train_layer_activation_abs_max",
    "gauge",
    "Largest absolute finite value of a layer's output at the last measured step.",
    "1",
    ("layer",),
)
LAYER_ACTIVATION_ZERO_RATIO = MetricFamily(
    "mindspore_train_layer_activation_zero_ratio",
    "gauge",
    "Share of a layer's output values that were exactly zero at the last measured step.",
    "ratio",
    ("layer",),
)
LAYER_ACTIVATION_NONFINITE_RATIO = MetricFamily(
    "mindspore_train_layer_activation_nonfinite_ratio",
    "gauge",
    "Share of a layer's output values that were NaN or infinite at the last measured step.",
    "ratio",
    ("layer",),
)

ACTIONS_TAKEN = MetricFamily(
    "mindspore_train_actions_total",
    "counter",
    "Actions the monitor took on the run it watches.",
    "actions",
    ("action",),
)
LR_BACKOFF_FACTOR = MetricFamily(
    "mindspore_train_lr_backoff_factor",
    "gauge",
    "The scale lr_backoff put on the optimizer's learning rate (1: untouched).",
    "1",
)
LAST_SNAPSHOT_STEP = MetricFamily(
    "mindspore_train_last_snapshot_step",
    "gauge",
    "Step of the newest anomaly snapshot under save_dir/snapshots.",
    "steps",
)
HEALTH_SCORE = MetricFamily(
    "mindspore_train_health_score",
    "gauge",
    "How healthy the last step looked, 0 to 1: the worst of the smoothed-loss trend, the "
    "gradient norm, memory growth and device temperature terms (docs/rollback.md); a good state is kept only "
    "at or above actions.rollback.min_health.",
    "1",
)
LAST_GOOD_STEP = MetricFamily(
    "mindspore_train_last_good_step",
    "gauge",
    "Step of the newest good state actions.rollback keeps (what a rollback restores).",
    "steps",
)
ROLLBACK_LOST_STEPS = MetricFamily(
    "mindspore_train_rollback_lost_steps_total",
    "counter",
    "Steps trained and then undone by rollbacks (divergence step minus good step).",
    "steps",
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
)
DATA_SEQUENCE_LENGTH = MetricFamily(
    "mindspore_train_data_sequence_length",
    "gauge",
    "Mean non-padding length of the samples of the last measured batch.",
    "tokens",
)
DATA_SEQUENCE_LENGTH_DISTRIBUTION = MetricFamily(
    "mindspore_train_data_sequence_length_distribution",
    "histogram",
    "Non-padding length of each sample of the measured batches.",
    "tokens",
    buckets=SEQUENCE_LENGTH_BUCKETS,
)
DATA_PADDING_RATIO = MetricFamily(
    "mindspore_train_data_padding_ratio",
    "gauge",
    "Share of the token positions of the last measured batch that are padding.",
    "ratio",
)
DATA_CHECKED_SAMPLES = MetricFamily(
    "mindspore_train_data_checked_samples_total", "counter", "Samples of the batches data_quality measured.", "samples"
)
DATA_DUPLICATE_SAMPLES = MetricFamily(
    "mindspore_train_data_duplicate_samples_total",
    "counter",
    "Samples of a measured batch whose tokens repeat an earlier sample of the same batch.",
    "samples",
)
DATA_EMPTY_SAMPLES = MetricFamily(
    "mindspore_train_data_empty_samples_total",
    "counter",
    "Samples of the measured batches without a non-padding token.",
    "samples",
)
DATA_OUT_OF_VOCAB = MetricFamily(
    "mindspore_train_data_out_of_vocab_tokens_total",
    "counter",
    "Non-padding token ids of the measured batches outside [0, data_quality.vocab_size).",
    "tokens",
)
DATA_QUALITY_BASELINE = MetricFamily(
    "mindspore_train_data_quality_baseline",
    "gauge",
    "A quantity's median over the first data_quality.baseline_steps measured batches.",
    "the quantity's unit",
    ("quantity",),
)
DATA_QUALITY_LOW_STREAK = MetricFamily(
    "mindspore_train_data_quality_low_streak",
    "gauge",
    "Measured batches in a row whose quantity was below data_quality.drop_ratio times its baseline.",
    "batches",
    ("quantity",),
)
DATA_QUALITY_LOW = MetricFamily(
    "mindspore_train_data_quality_low",
    "gauge",
    "1 while the quantity's low streak is at least data_quality.streak batches, else 0.",
    "1",
    ("quantity",),
)
DATA_LISTED_BATCHES = MetricFamily(
    "mindspore_train_data_listed_batches_total",
    "counter",
    "Batches of a data-quality drop listed in save_dir/skipped-batches.json (data_quality.list_batches).",
    "batches",
)

HOOK_DURATION = MetricFamily(
    "mindspore_exporter_callback_duration_seconds",
    "histogram",
    "The monitor's own cost per hook call.",
    "seconds",
    ("hook",),
    buckets=HOOK_BUCKETS,
)
ERRORS = MetricFamily(
    "mindspore_exporter_errors_total",
    "counter",
    "Failures the monitor absorbed instead of raising into training.",
    "errors",
    ("component",),
)
COMPONENT_DISABLED = MetricFamily(
    "mindspore_exporter_component_disabled",
    "gauge",
    f"1 for a component the monitor switched off after {FAILURES_BEFORE_DISABLE} failures in a row.",
    "1",
    ("component",),
)
DROPPED_RECORDS = MetricFamily(
    "mindspore_exporter_dropped_samples_total",
    "counter",
    "Records a sink dropped: it fell behind, or could not write them (a full disk).",
    "records",
    ("sink",),
)

STRATEGY_SECONDS = MetricFamily(
    "mindspore_exporter_strategy_seconds_total",
    "counter",
    "Time a strategy of the user's took in its hooks, on the training thread (docs/strategies.md).",
    "seconds",
    ("strategy",),
)
STRATEGY_DROPPED = MetricFamily(
    "mindspore_exporter_strategy_dropped_total",
    "counter",
    'Values a strategy of the user\'s returned that were not exported: reason="keys" (a key past its bound of '
    'keys), reason="value" (not a number, or beyond a float\'s range) (docs/strategies.md).',
    "values",
    ("strategy", "reason"),
)

# -- hardware (features/hardware/; docs/hardware.md) --------------------------------------------------------------
# `device`: gpu<N>, npu<N> as this rank sees them, or host. Each quantity exists only where the device's interface
# reports it.

DEVICE_TEMPERATURE = MetricFamily(
    "mindspore_train_device_temperature_celsius", "gauge", "Device (or host CPU) temperature.", "celsius", ("device",)
)
DEVICE_POWER = MetricFamily("mindspore_train_device_power_watts", "gauge", "Device power draw.", "watts", ("device",))
DEVICE_POWER_LIMIT = MetricFamily(
    "mindspore_train_device_power_limit_watts", "gauge", "Device power limit in force.", "watts", ("device",)
)
DEVICE_UTILIZATION = MetricFamily(
    "mindspore_train_device_utilization_ratio",
    "gauge",
    "Share of the last sample interval the device's compute (GPU SMs, NPU AI cores, host CPUs) was busy.",
    "ratio",
    ("device",),
)
DEVICE_MEMORY_UTILIZATION = MetricFamily(
    "mindspore_train_device_memory_utilization_ratio",
    "gauge",
    "Share of the last sample interval the device's memory was being read or written.",
    "ratio",
    ("device",),
)
DEVICE_MEMORY_USED = MetricFamily(
    "mindspore_train_device_memory_used_bytes", "gauge", "Device memory in use (all processes).", "bytes", ("device",)
)
DEVICE_MEMORY_TOTAL = MetricFamily(
    "mindspore_train_device_memory_total_bytes", "gauge", "Device memory in all.", "bytes", ("device",)
)
DEVICE_CLOCK = MetricFamily(
    "mindspore_train_device_clock_hertz", "gauge", "Device compute clock (GPU SM, NPU AI core).", "hertz", ("device",)
)
DEVICE_THROTTLED = MetricFamily(
    "mindspore_train_device_throttled",
    "gauge",
    "1 while the device holds its clock down for this reason (the interface's name), 0 after.",
    "1",
    ("device", "reason"),
)
DEVICE_ECC_UNCORRECTED = MetricFamily(
    "mindspore_train_device_ecc_uncorrected_errors_total",
    "counter",
    "Uncorrected ECC memory errors the device counted since its driver loaded.",
    "errors",
    ("device",),
)
DEVICE_PCIE = MetricFamily(
    "mindspore_train_device_pcie_bytes_per_second",
    "gauge",
    "Device PCIe throughput.",
    "bytes per second",
    ("device", "direction"),
)
DEVICE_LINK_UP = MetricFamily(
    "mindspore_train_device_link_up",
    "gauge",
    "1 while the device's network link is up (Ascend RoCE).",
    "1",
    ("device",),
)
DEVICE_HEALTHY = MetricFamily(
    "mindspore_train_device_healthy", "gauge", "1 while the device's interface calls it healthy.", "1", ("device",)
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
)


FAMILIES: tuple[MetricFamily, ...] = tuple(
    value for value in list(globals().values()) if isinstance(value, MetricFamily)
)


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
