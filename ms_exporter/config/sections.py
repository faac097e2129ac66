"""The sections of a monitor_config (grad_norm, otlp, web, actions, hang, flops ...), each field with its check."""

from __future__ import annotations

import dataclasses
import importlib.util
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, NamedTuple

import yaml

from ms_exporter.config.checks import (
    MAX_FLOPS,
    MAX_RATIO,
    MAX_SECONDS,
    Say,
    _Bad,
    _close,
    _is_number,
    at_least,
    between,
    boolean,
    choice,
    class_names,
    file_path,
    greater_than,
    int_in,
    mapping,
    names,
    optional,
    readable_file,
    regex,
    regexes,
    section,
    setting,
    text,
    url,
)
from ms_exporter.config.safe_yaml import load_yaml, read_small_file
from ms_exporter.config.vocabulary import (
    CLIENT_AUTH_TYPES,
    EARLY_STOP_UNITS,
    OTLP_PROTOCOLS,
    PUSH_EVENTS,
    ROLLBACK_STORAGE,
)
from ms_exporter.core import registry
from ms_exporter.core.analysis.flops import PEAK_PRESETS, FlopsModel, ModelShape, from_per_token, from_shape
from ms_exporter.core.redaction import REDACTED
from ms_exporter.core.thresholds import DATA_QUALITY_DROP_RATIO, DATA_QUALITY_STREAK, DEFAULTS, LOSS_SPIKE_FACTOR


@dataclass(frozen=True)
class GradNormConfig:
    """monitor_config.grad_norm: gradient norms read from the real training step."""

    enable: bool = setting(True, check=boolean())
    every_n_steps: int = setting(10, check=int_in(1, 1_000_000))
    layers: tuple[str, ...] = setting((), check=regexes())  # matched (from the start) against layer names
    top_k: int = setting(5, check=int_in(0, 1000))
    max_series: int = setting(20, check=int_in(1, 1000))
    threshold: float | None = setting(DEFAULTS.grad_norm_high, check=optional(greater_than(0, MAX_RATIO)))
    clip: float | None = setting(None, check=optional(greater_than(0, MAX_RATIO)))

    def _cross_check(self, say: Say) -> None:
        if self.top_k > self.max_series:
            say("top_k", f"must not exceed max_series ({self.max_series})", self.top_k)


@dataclass(frozen=True)
class LayerNormConfig:
    """monitor_config.layernorm: statistics of every LayerNorm scale (gamma)."""

    enable: bool = setting(True, check=boolean())
    # Reading every LayerNorm scale costs ~0.3 ms on the demo model: every 25 steps keeps it near 10 µs a step
    # and still gives the 100-step drift window four samples.
    every_n_steps: int = setting(25, check=int_in(1, 1_000_000))
    window: int = setting(100, check=int_in(1, 10_000_000))
    drift_threshold: float | None = setting(DEFAULTS.layernorm_drift, check=optional(greater_than(0, MAX_RATIO)))
    # Three series per scale: a deep model (two norms a block) would otherwise be a rank's largest family.
    max_layers: int = setting(24, check=int_in(1, 10_000))


@dataclass(frozen=True)
class UpdateRatioConfig:
    """monitor_config.update_ratio: how far each layer's weights moved between two samples, ||w - w_before|| / ||w||
    (the TensorBoard article's "parameter update size"; docs/update-ratio.md)."""

    enable: bool = setting(False, check=boolean())
    # The ratio is over these many steps: each sample reads every weight's norm and its values at sketch_size fixed
    # random positions, on the device, and keeps those values on the host until the next.
    every_n_steps: int = setting(100, check=int_in(1, 1_000_000))
    # Positions per weight tensor: the movement's estimate has a relative error of about 1 / sqrt(2 x sketch_size)
    # (2% at 1024) where the values move alike, more where few move (embeddings: docs/update-ratio.md); a tensor
    # with at most this many values is compared whole, exactly.
    sketch_size: int = setting(1024, check=int_in(16, 1_000_000))
    layers: tuple[str, ...] = setting((), check=regexes())  # always exported; matched like grad_norm.layers
    # Besides the watched layers: the k layers that moved least and the k that moved most.
    top_k: int = setting(3, check=int_in(0, 1000))
    max_series: int = setting(20, check=int_in(1, 1000))
    # MindSporeTrainingLayerFrozen: a layer whose ratio is under this share of the rank's median ratio.
    frozen_fraction: float = setting(DEFAULTS.update_ratio_frozen_fraction, check=greater_than(0, 1))

    def _cross_check(self, say: Say) -> None:
        if 2 * self.top_k > self.max_series:
            say("top_k", f"the top_k smallest and largest must fit in max_series ({self.max_series})", self.top_k)


@dataclass(frozen=True)
class ActivationsConfig:
    """monitor_config.activations: mean, std, max |x| and the shares of zeros and non-finite values of selected
    layers' outputs every `every_n_steps` steps (the TensorBoard article's debug tier; docs/activations.md)."""

    enable: bool = setting(False, check=boolean())
    # Matched from the start of a cell's name (its path in the network, as parameter names spell it); none: the
    # network's top-level cells.
    layers: tuple[str, ...] = setting((), check=regexes())
    # A measured step costs a second graph's run (GRAPH mode) or hooks and one reduction per layer (PYNATIVE); the
    # steps in between cost nothing (docs/activations.md, "What it costs").
    every_n_steps: int = setting(100, check=int_in(1, 1_000_000))
    # Five series per layer; more matches than this are thinned evenly over the model's depth.
    max_layers: int = setting(16, check=int_in(1, 1000))


def _headers(value: Any) -> dict[str, str]:
    """A mapping, or the OTEL_EXPORTER_OTLP_HEADERS form `name=value,name2=value2`. Values are secrets: never shown."""
    if isinstance(value, str):
        pairs = [part.split("=", 1) for part in value.split(",") if part.strip()]
        if not all(len(pair) == 2 and pair[0].strip() for pair in pairs):
            raise _Bad("must be a mapping of header name to value, or 'name=value,name2=value2'", REDACTED)
        value = {name.strip(): text.strip() for name, text in pairs}
    if not isinstance(value, Mapping) or not all(isinstance(k, str) and isinstance(v, str) for k, v in value.items()):
        raise _Bad("must be a mapping of header name to string value", REDACTED)
    return dict(value)


@dataclass(frozen=True)
class OtlpConfig:
    """monitor_config.otlp: the `otlp` backend. None leaves a setting to the standard OTEL_* variables."""

    endpoint: str | None = setting(None, check=optional(url()))
    # grpc or http/protobuf; None: OTEL_EXPORTER_OTLP_(METRICS_)PROTOCOL, else grpc
    protocol: str | None = setting(None, check=optional(choice(*OTLP_PROTOCOLS)))
    # seconds between exports; None: OTEL_METRIC_EXPORT_INTERVAL, else 60. Each export renders every series on the
    # SDK's reader thread: ten a second at most.
    interval: float | None = setting(None, check=optional(at_least(0.1, MAX_SECONDS)))
    timeout: float = setting(10.0, check=greater_than(0, MAX_SECONDS))  # seconds one export may take, retries included
    headers: Mapping[str, str] | None = setting(None, check=optional(_headers))
    insecure: bool | None = setting(None, check=optional(boolean()))


@dataclass(frozen=True)
class PushgatewayConfig:
    """monitor_config.pushgateway: push this rank's series to a Pushgateway, grouped by project and rank."""

    url: str | None = setting(None, check=optional(url()))  # None: no pushes
    on: tuple[str, ...] = setting(("train_end",), check=names(PUSH_EVENTS))
    # seconds between pushes when `on` has interval; each push renders the whole store: ten a second at most
    interval: float = setting(30.0, check=at_least(0.1, MAX_SECONDS))
    timeout: float = setting(5.0, check=greater_than(0, MAX_SECONDS))
    job: str = setting("mindspore_training", check=text())


@dataclass(frozen=True)
class EarlyStopConfig:
    """monitor_config.actions.early_stop: stop when the smoothed loss stops improving, or on non-finite losses."""

    enable: bool = setting(False, check=boolean())
    patience: int = setting(5, check=int_in(1, 10_000_000))  # evaluations without improvement
    # an improvement must beat the best smoothed loss by more than this
    min_delta: float = setting(0.0, check=at_least(0, MAX_RATIO))
    unit: str = setting("epoch", check=choice(*EARLY_STOP_UNITS))  # what one evaluation is: an epoch end or a step
    # non-finite losses in a row that stop at once; null: never
    max_nonfinite: int | None = setting(3, check=optional(int_in(1, 1_000_000)))


@dataclass(frozen=True)
class LrBackoffConfig:
    """monitor_config.actions.lr_backoff: scale the learning rate down on a rising loss or a large gradient norm."""

    enable: bool = setting(False, check=boolean())
    factor: float = setting(0.5, check=between(0, 1))
    rising_steps: int = setting(20, check=int_in(1, 10_000_000))
    # also back off when the gradient norm passes grad_norm.threshold
    on_grad_norm: bool = setting(True, check=boolean())
    cooldown: int = setting(100, check=int_in(0, 10_000_000))  # steps after a back-off before the next one
    min_lr: float = setting(0.0, check=at_least(0, MAX_RATIO))


@dataclass(frozen=True)
class SnapshotConfig:
    """monitor_config.actions.snapshot: a checkpoint at the first anomaly of each episode."""

    enable: bool = setting(False, check=boolean())
    # a loss above this many times the smoothed loss is a spike
    spike_factor: float = setting(LOSS_SPIKE_FACTOR, check=greater_than(1, MAX_RATIO))
    max_snapshots: int = setting(3, check=int_in(1, 1000))
    quiet_steps: int = setting(10, check=int_in(1, 10_000_000))  # steps without an anomaly that end an episode


@dataclass(frozen=True)
class RollbackConfig:
    """monitor_config.actions.rollback: keep the last good state; on a divergence restore it, list the batches
    trained since, and go on (docs/rollback.md)."""

    enable: bool = setting(False, check=boolean())
    good_every: int = setting(100, check=int_in(1, 10_000_000))  # steps between good states
    quiet_steps: int = setting(20, check=int_in(1, 10_000_000))  # steps without a divergence before one is kept
    min_health: float = setting(0.8, check=at_least(0, 1))  # mindspore_train_health_score needed to keep one
    max_kept: int = setting(2, check=int_in(1, 100))
    # where good states live: memory (copies on the device where each Parameter lives), disk (files in
    # save_dir/good-states, written from a device copy by a background thread), or auto: memory while max_kept + 1
    # states (the newest is taken before the oldest goes) fit in memory_limit_mb, which so bounds the device memory
    # good states hold; disk holds one state's device copy while it is written (docs/rollback.md)
    storage: str = setting("auto", check=choice(*ROLLBACK_STORAGE))
    memory_limit_mb: float = setting(64.0, check=greater_than(0, 1024 * 1024))
    # what a divergence is: a non-finite loss, a loss over spike_factor x the smoothed loss, a gradient norm over
    # grad_norm_above (unset: the exploding threshold, 10 x grad_norm.threshold)
    on_nonfinite: bool = setting(True, check=boolean())
    spike_factor: float | None = setting(LOSS_SPIKE_FACTOR, check=optional(greater_than(1, MAX_RATIO)))
    grad_norm_above: float | None = setting(None, check=optional(greater_than(0, MAX_RATIO)))
    max_rollbacks: int = setting(3, check=int_in(1, 1000))  # within window_steps; one more stops the training
    window_steps: int = setting(1000, check=int_in(1, 10_000_000))


@dataclass(frozen=True)
class ActionsConfig:
    """monitor_config.actions: what the monitor may do to the run, each off by default."""

    early_stop: EarlyStopConfig = section(EarlyStopConfig)
    lr_backoff: LrBackoffConfig = section(LrBackoffConfig)
    snapshot: SnapshotConfig = section(SnapshotConfig)
    rollback: RollbackConfig = section(RollbackConfig)

    @property
    def any(self) -> bool:
        return self.early_stop.enable or self.lr_backoff.enable or self.snapshot.enable or self.rollback.enable


def sections_of(kind: type) -> dict[str, type]:
    """The nested sections a config class declares (`section(...)` fields), by key: read from the class, never listed
    by hand."""
    return {f.name: f.metadata["check"] for f in dataclasses.fields(kind) if isinstance(f.metadata.get("check"), type)}


ACTION_SECTIONS = sections_of(ActionsConfig)


def _percentile(value: Any) -> float:
    if not _is_number(value) or not 50 <= value <= 100:
        raise _Bad("must be a percentile from 50 to 100 (99: the 99th percentile)", value)
    return float(value)


@dataclass(frozen=True)
class HangConfig:
    """monitor_config.hang: how long a phase may last before it counts as a hang (docs/hangs.md).

    In `step`, `data_wait` and `callbacks` the deadline is learned: `factor` times the `percentile` of the last
    `window` step cycles (from one step's end to the next), never below `min_seconds`. The other phases have fixed
    deadlines."""

    enable: bool = setting(True, check=boolean())
    min_seconds: float = setting(120.0, check=greater_than(0, MAX_SECONDS))
    factor: float = setting(3.0, check=at_least(1, MAX_RATIO))
    percentile: float = setting(99.0, check=_percentile)
    window: int = setting(500, check=int_in(10, 1_000_000))  # step cycles
    compile_seconds: float = setting(3600.0, check=greater_than(0, MAX_SECONDS))  # train begin to the first step's end
    eval_seconds: float = setting(1800.0, check=greater_than(0, MAX_SECONDS))
    checkpoint_seconds: float = setting(1800.0, check=greater_than(0, MAX_SECONDS))
    # Callbacks whose step and epoch hooks count as `checkpoint` (their class or a base class has one of these
    # names), besides ModelCheckpoint and its subclasses: an uploader, a custom saver.
    checkpoint_callbacks: tuple[str, ...] = setting((), check=class_names())
    # GET /debug/stacks on the rank's endpoint serves the latest dump (same TLS and auth as /metrics)
    debug_endpoint: bool = setting(True, check=boolean())
    native_stacks: bool = setting(True, check=boolean())  # add py-spy's native frames when py-spy is installed


@dataclass(frozen=True)
class FailSlowConfig:
    """monitor_config.failslow: each rank's own work per step scored, and a slowdown flagged at the step it starts
    (docs/failslow.md)."""

    enable: bool = setting(True, check=boolean())
    # MindSporeTrainingFailSlow pages for a flagged rank whose relative score (the best rank's cycle over the one this
    # rank's own work makes) is under this (ms-exporter rules).
    alert_below: float = setting(DEFAULTS.failslow_relative, check=between(0, 1))


@dataclass(frozen=True)
class GoodputConfig:
    """monitor_config.goodput: the time ledger and the run state that carries it across restarts (docs/goodput.md).

    The run is `run_id` (top level, or MS_EXPORTER_RUN_ID), else one derived from project and save_dir."""

    enable: bool = setting(True, check=boolean())
    # How often the run state file in save_dir is rewritten (the run's totals are exported as of the last save).
    # Each save writes and renames a small file: ten a second at most.
    save_seconds: float = setting(5.0, check=at_least(0.1, MAX_SECONDS))
    # MindSporeTrainingGoodputLow fires below this share of productive time over the last hour (ms-exporter rules).
    alert_below: float = setting(DEFAULTS.goodput_low, check=between(0, 1))


class BitFlip(NamedTuple):
    """One injected fault: bit `bit` of element `element` (of the flattened tensor) of tensor `tensor` (its
    Parameter name, or its position in its kind's list) of `kind` on rank `rank`, at the end of step `step`; of
    kind `gradients`: of the local gradient of that trained weight, before step `step`'s all-reduce."""

    rank: int
    step: int
    kind: str
    tensor: str | int
    element: int
    bit: int


_FLIP_FIELDS = {
    "rank": "an integer from 0",
    "step": "an integer from 1",
    "kind": "weights, optimizer or gradients",
    "tensor": "a Parameter name or a position from 0",
    "element": "an integer from 0",
    "bit": "an integer from 0 to 63",
}


def _flip_field(name: str, value: Any) -> Any:
    natural = isinstance(value, int) and not isinstance(value, bool)
    accepted = {
        "rank": natural and value >= 0,
        "step": natural and value >= 1,
        "kind": value in ("weights", "optimizer", "gradients"),
        "tensor": (isinstance(value, str) and bool(value)) or (natural and value >= 0),
        "element": natural and value >= 0,
        "bit": natural and 0 <= value <= 63,
    }[name]
    if not accepted:
        raise _Bad(f"{name} must be {_FLIP_FIELDS[name]}", value)
    return value


def _flips(value: Any) -> tuple[BitFlip, ...]:
    """A list of {rank, step, kind, tensor, element, bit} mappings (docs/sdc.md#drills)."""
    if value is None:
        return ()
    allowed = f"a list of mappings with the keys {', '.join(_FLIP_FIELDS)}"
    if not isinstance(value, (list, tuple)):
        raise _Bad(f"must be {allowed}", value)
    flips = []
    for item in value:
        if not isinstance(item, Mapping) or set(item) != set(_FLIP_FIELDS):
            raise _Bad(f"must be {allowed}", item)
        flips.append(BitFlip(**{name: _flip_field(name, item[name]) for name in _FLIP_FIELDS}))
    return tuple(flips)


@dataclass(frozen=True)
class DivergenceConfig:
    """monitor_config.divergence: a fingerprint of the parameters every few steps, equal on every replica of a
    group while the replicas hold the same weights, to name the rank that left its group (docs/divergence.md)."""

    enable: bool = setting(True, check=boolean())  # acts only where the job has replicas (more than one rank)
    every_n_steps: int = setting(100, check=int_in(1, 1_000_000))
    # The replica group's name, where it cannot be derived from MindSpore's parallel context.
    replica_group: str | None = setting(None, check=optional(text(label_value=True)))
    # Ranks that hold the shards of one replica within a pipeline stage (MindSpore Transformers'
    # parallel_config.model_parallel), where MindSpore's dataset_strategy does not say.
    model_parallel: int | None = setting(None, check=optional(int_in(1, 1_000_000)))
    # Every step, the bit sums of every weight and optimizer state tensor (silent data corruption caught at the step
    # it happens, docs/sdc.md), compared at each fingerprint step as checksums of at most `buckets` runs of tensors.
    check_every_step: bool = setting(True, check=boolean())
    # The checks on every n-th step only, the same n on every rank (a corruption then seen up to n - 1 steps late, still
    # named by tensor): for a rank whose checks cost more than their 1% of a step (docs/sdc.md#what-it-costs).
    check_every_n_steps: int = setting(1, check=int_in(1, 1_000_000))
    buckets: int = setting(8, check=int_in(1, 64))
    # Per-tensor sums kept for /debug/checksums: the last this many steps, and as many of each of the two comparison
    # intervals before the current one (at least every_n_steps keeps those intervals whole).
    window_steps: int = setting(128, check=int_in(1, 10_000))
    # A rank's local gradient norm (before the all-reduce, measured by GradNormTrainOneStepCell every step where
    # replica checks run) more than this many times the median of its recent ones is an outlier (docs/sdc.md).
    local_grad_factor: float = setting(1000.0, check=at_least(2, MAX_RATIO))
    # Skip, on every replica, a step whose local gradient norm is an outlier on any of them (GradNormTrainOneStepCell:
    # one all-reduce of a number a step, and an in-graph branch).
    skip_local_grad_outliers: bool = setting(False, check=boolean())
    # Drills: bits flipped on purpose in the weights or the optimizer's state, refused unless allow_injection.
    inject_flips: tuple[BitFlip, ...] = setting((), check=_flips)
    allow_injection: bool = setting(False, check=boolean())

    def _cross_check(self, say: Say) -> None:
        if self.every_n_steps % self.check_every_n_steps:
            say(
                "check_every_n_steps",
                f"must divide every_n_steps ({self.every_n_steps}): the checksums are compared at the fingerprint "
                "steps, which must be checked steps",
                self.check_every_n_steps,
            )
        if self.inject_flips and not self.allow_injection:
            say(
                "inject_flips",
                "flips bits of the training's weights on purpose, for drills: refused unless "
                "divergence.allow_injection is true",
                len(self.inject_flips),
            )


def _column(value: Any) -> str | int:
    """A dataset column: its name, or its position in the batch (from 0)."""
    if isinstance(value, str) and value.strip():
        return value
    if isinstance(value, int) and not isinstance(value, bool) and 0 <= value <= 10_000:
        return value
    raise _Bad(
        "must be a column name (a non-empty string) or its position in the batch (an integer from 0 to 10000)", value
    )


@dataclass(frozen=True)
class DataQualityConfig:
    """monitor_config.data_quality: the batch each step consumed, measured against baselines learned over the run's
    first batches (the strategy-container article's data-quality strategy; docs/data-quality.md). Not in sink mode:
    there MindSpore hands the callback no batch."""

    enable: bool = setting(False, check=boolean())
    every_n_steps: int = setting(1, check=int_in(1, 1_000_000))  # a batch of every this many steps is measured
    # The class labels whose entropy is measured; null: no label entropy.
    label_column: str | int | None = setting(None, check=optional(_column))
    # The token ids; null: `input_ids_column` where it holds 2-D integers, else the first column that does.
    token_column: str | int | None = setting(None, check=optional(_column))
    # The padding id, where the dataset has no `attention_mask_column`; null: padding only from the mask (as the
    # token counts), and without a mask no lengths, padding or empty samples.
    pad_id: int | None = setting(None, check=optional(int_in(-(2**31), 2**31 - 1)))
    vocab_size: int | None = setting(None, check=optional(int_in(1, 10**9)))  # null: no out-of-vocabulary count
    # The baseline of a quantity is its median over this many measured batches, the first of the process.
    baseline_steps: int = setting(20, check=int_in(1, 1_000_000))
    drop_ratio: float = setting(DATA_QUALITY_DROP_RATIO, check=between(0, 1))  # below baseline x this: low
    streak: int = setting(DATA_QUALITY_STREAK, check=int_in(1, 1_000_000))  # low batches in a row: a drop
    # The action: every batch of a drop goes to save_dir/skipped-batches.json (rollback's list, docs/rollback.md).
    list_batches: bool = setting(False, check=boolean())
    max_listed: int = setting(1000, check=int_in(1, 1_000_000))  # batches one process lists at most

    def _cross_check(self, say: Say) -> None:
        if self.label_column is not None and self.label_column == self.token_column:
            say("token_column", "must be another column than label_column", self.token_column)


def _peak(value: Any) -> float | str:
    """A number of FLOPs per second, or the name of a preset whose figure docs/mfu.md cites."""
    if isinstance(value, str):
        if value in PEAK_PRESETS:
            return value
        close = _close(value, list(PEAK_PRESETS))
        hint = f" (did you mean '{close}'?)" if close else ""
        raise _Bad(
            f"unknown preset{hint}; give FLOPs per second as a number (such as 312e12) or a preset from "
            f"{list(PEAK_PRESETS)}",
            value,
        )
    if _is_number(value) and 0 < value <= MAX_FLOPS:
        return float(value)
    raise _Bad(
        f"must be FLOPs per second greater than 0 and at most {MAX_FLOPS:g} (such as 312e12), or a preset "
        f"from {list(PEAK_PRESETS)}",
        value,
    )


_SIZE = optional(int_in(1, 10**9))


@dataclass(frozen=True)
class FlopsModelConfig:
    """monitor_config.flops.model: the Transformer whose FLOPs per token the monitor computes (docs/mfu.md). The
    names follow MindSpore Transformers' model_config where it has one (num_layers, hidden_size, num_heads,
    n_kv_heads -> num_kv_heads, ffn_hidden_size / intermediate_size, vocab_size, seq_length)."""

    num_layers: int | None = setting(None, check=_SIZE)
    hidden_size: int | None = setting(None, check=_SIZE)
    num_heads: int | None = setting(None, check=_SIZE)
    ffn_hidden_size: int | None = setting(None, check=_SIZE)
    vocab_size: int | None = setting(None, check=optional(int_in(0, 10**9)))  # 0: no per-token output layer
    num_kv_heads: int | None = setting(None, check=_SIZE)
    head_dim: int | None = setting(None, check=_SIZE)
    gated_mlp: bool = setting(False, check=boolean())
    # Also read without a description: the attention term of the FLOPs derived from the network's parameters.
    causal: bool = setting(True, check=boolean())
    num_experts: int = setting(0, check=int_in(0, 1_000_000))
    moe_top_k: int | None = setting(None, check=_SIZE)
    moe_ffn_hidden_size: int | None = setting(None, check=_SIZE)
    shared_experts: int = setting(0, check=int_in(0, 1_000_000))
    tied_embeddings: bool = setting(False, check=boolean())
    seq_length: int | None = setting(None, check=_SIZE)  # for check-config's figure per token of a full sequence

    _REQUIRED = ("num_layers", "hidden_size", "num_heads", "ffn_hidden_size", "vocab_size")

    @property
    def described(self) -> bool:
        return any(getattr(self, key) is not None for key in (*self._REQUIRED, "num_kv_heads", "head_dim"))

    def shape(self) -> ModelShape | None:
        """The description as a ModelShape; None when the model is not described."""
        if not self.described:
            return None
        values = {f.name: getattr(self, f.name) for f in dataclasses.fields(ModelShape)}
        return ModelShape(**values)

    def _cross_check(self, say: Say) -> None:
        if not self.described:
            return
        missing = [key for key in self._REQUIRED if getattr(self, key) is None]
        if missing:
            say("", f"a model description needs {', '.join(missing)} too (required: {', '.join(self._REQUIRED)})")
            return
        heads, kv_heads = self.num_heads or 1, self.num_kv_heads
        if self.head_dim is None and (self.hidden_size or 0) % heads:
            say("num_heads", f"must divide hidden_size ({self.hidden_size}) unless head_dim is given", heads)
        if kv_heads is not None and (kv_heads > heads or heads % kv_heads):
            say("num_kv_heads", f"must divide num_heads ({heads})", kv_heads)
        if self.num_experts > 1 and not (self.moe_top_k and self.moe_top_k <= self.num_experts):
            say(
                "moe_top_k",
                f"an MoE model (num_experts {self.num_experts}) needs the experts each token is routed "
                f"to, from 1 to {self.num_experts}",
                self.moe_top_k,
            )
        if self.num_experts <= 1 and (self.moe_top_k is not None or self.moe_ffn_hidden_size is not None):
            say(
                "num_experts",
                "moe_top_k and moe_ffn_hidden_size describe an MoE model: give num_experts (2 or more)",
                self.num_experts,
            )


@dataclass(frozen=True)
class FlopsConfig:
    """monitor_config.flops: model FLOPs per token and the device's peak, for model FLOPs utilisation (docs/mfu.md).

    FLOPs per token come from `per_token`, else from the `model` description, else from the network's trainable
    parameters (6N plus the attention of the attention layers found); MFU needs `peak_flops_per_device`."""

    enable: bool = setting(True, check=boolean())
    per_token: float | None = setting(None, check=optional(greater_than(0, MAX_FLOPS)))
    model: FlopsModelConfig = section(FlopsModelConfig)
    peak_flops_per_device: float | str | None = setting(None, check=optional(_peak))
    # A column of packed data with each document's end offset in its row (MindSpore Transformers' actual_seq_len).
    seq_len_column: str = setting("actual_seq_len", check=text())
    # Ranks that compute each batch this rank's dataset yields (tensor x pipeline parallel; all ranks with
    # full_batch): a rank's model FLOPs are its batches' over this. Default: from MindSpore's parallel context.
    ranks_per_batch: int | None = setting(None, check=optional(int_in(1, 10**7)))
    # MindSporeTrainingMfuLow fires below this MFU of the project (ms-exporter rules); unset: no such alert.
    alert_below: float | None = setting(None, check=optional(between(0, 1)))

    def _cross_check(self, say: Say) -> None:
        if self.per_token is not None and self.model.described:
            say("", "give FLOPs per token one way: per_token or a model description, not both")
        if self.alert_below is not None and self.peak_flops_per_device is None:
            say("alert_below", "MFU needs peak_flops_per_device: without it there is no MFU to alert on")

    @property
    def peak(self) -> float | None:
        """The peak in FLOPs per second (a preset's figure), or None."""
        value = self.peak_flops_per_device
        return PEAK_PRESETS[value].flops if isinstance(value, str) else value

    def model_flops(self) -> FlopsModel | None:
        """The FLOPs model when it does not depend on the network (per_token or a description), else None."""
        if self.per_token is not None:
            return from_per_token(self.per_token)
        shape = self.model.shape()
        return from_shape(shape) if shape is not None else None


@dataclass(frozen=True)
class TensorBoardConfig:
    """monitor_config.tensorboard: the `tensorboard` backend's event files in save_dir/tensorboard/<project>/rank<r>."""

    # Rank 0 only by default, as MindSpore Transformers' TensorBoard writer does: every rank writes with true.
    all_ranks: bool = setting(False, check=boolean())
    # Layer tags (grad/<layer>, weight/<layer>, update_ratio/<layer>) and histograms every this many steps, as
    # MindSpore's SummaryCollector's collect_freq (the scalars of every step are written at every step).
    collect_freq: int = setting(10, check=int_in(1, 1_000_000))
    # Weight histograms of the parameters whose names this regular expression matches (from the start of the name,
    # as SummaryCollector's histogram_regular, e.g. ".*weight.*"); null: no histograms.
    histogram_regular: str | None = setting(None, check=optional(regex()))
    # A new event file once the current one holds this many MiB (the TensorBoard article's log rotation; 0: never).
    max_file_mb: float = setting(500.0, check=at_least(0, 1024 * 1024))


@dataclass(frozen=True)
class HardwareConfig:
    """monitor_config.hardware: device and host health, read on threads of the monitor's own and never on the step
    path (docs/hardware.md). The strategy-container article's top-level `enable_hardware_monitor` is read as
    `enable`."""

    enable: bool = setting(True, check=boolean())
    # Every reader that finds a device here runs: NVML (NVIDIA GPUs, the `nvml` extra), npu-smi (Ascend NPUs), host.
    readers: tuple[str, ...] = setting(factory=registry.hardware_readers, check=names(registry.hardware_readers))
    # A reading every this many seconds (the strategy-container article samples every 10 steps because nvidia-smi
    # costs ~80 ms).
    interval: float = setting(10.0, check=at_least(0.5, MAX_SECONDS))
    # A reader that has not answered after this long is counted (TimeoutError) and asked again once it answers.
    timeout: float = setting(5.0, check=at_least(0.1, MAX_SECONDS))
    # The npu-smi command: a name, looked for in trusted directories only (features/hardware/command.py), or an
    # absolute path.
    npu_smi: str = setting("npu-smi", check=text())
    # Ascend's RoCE link state (often /usr/local/Ascend/driver/tools/hccn_tool); null: no link series.
    hccn_tool: str | None = setting("hccn_tool", check=optional(text()))


@dataclass(frozen=True)
class WandbConfig:
    """monitor_config.wandb: the `wandb` backend's W&B runs, their files in save_dir/wandb (docs/configuration.md)."""

    # Rank 0 only by default, as the tensorboard backend: every rank logs a run of its own with true.
    all_ranks: bool = setting(False, check=boolean())
    # offline: files only, `wandb sync save_dir/wandb` uploads them later; online: wandb's own upload as it runs.
    mode: str = setting("offline", check=choice("offline", "online"))
    project: str | None = setting(None, check=optional(text()))  # the W&B project; unset: monitor_config.project
    entity: str | None = setting(None, check=optional(text()))  # the W&B team or user; unset: wandb's default


_BCRYPT_HASH = re.compile(r"^\$2[aby]\$\d\d\$[./A-Za-z0-9]{53}$")
_SHA256_HASH = re.compile(r"^sha256:[0-9a-f]{64}$")


def _password_hash(user: Any, hashed: Any) -> tuple[str, str]:
    if not isinstance(user, str) or not user or ":" in user:
        raise _Bad("user names must be non-empty strings without ':'", user)
    if not isinstance(hashed, str) or not (_BCRYPT_HASH.match(hashed) or _SHA256_HASH.match(hashed)):
        raise _Bad(
            f"the hash for user '{user}' must be a bcrypt hash ($2a$/$2b$/$2y$, e.g. from "
            "`htpasswd -nbBC 10 user password`) or sha256:<64 hex digits>",
            REDACTED,
        )
    return user, hashed


def _password_hashes(value: Any) -> dict[str, str]:
    users: dict[str, str] = mapping("user name to password hash", _password_hash, secret=True)(value)
    if any(_BCRYPT_HASH.match(h) for h in users.values()) and importlib.util.find_spec("bcrypt") is None:
        raise _Bad(
            "bcrypt hashes need the bcrypt package: pip install 'ms-exporter[auth]' (or give sha256:<hex> hashes)",
            REDACTED,
        )
    return users


def _read_web_config_file(path: Any, say: Say) -> dict[str, Any]:
    """A Prometheus web config file (exporter-toolkit format) as monitor_config.web keys."""
    try:
        file_path()(path)
    except _Bad:
        return {}  # the config_file check reports it
    try:
        data = load_yaml(read_small_file(path)) or {}
    except (OSError, ValueError, yaml.YAMLError) as exc:  # ValueError: a NUL byte in the path, or not UTF-8
        say("config_file", f"cannot read {path!r}: {exc}")
        return {}
    if not isinstance(data, Mapping):
        say("config_file", f"{path} must hold a mapping (tls_server_config, basic_auth_users)")
        return {}
    out: dict[str, Any] = {}
    unknown = [k for k in data if k not in ("tls_server_config", "basic_auth_users")]
    tls = data.get("tls_server_config") or {}
    names = {
        "cert_file": "tls_cert_file",
        "key_file": "tls_key_file",
        "client_ca_file": "client_ca_file",
        "client_auth_type": "client_auth_type",
    }
    if isinstance(tls, Mapping):
        unknown += [f"tls_server_config.{k}" for k in tls if k not in names]
        out.update({names[k]: v for k, v in tls.items() if k in names})
    else:  # dropping it silently would serve plain HTTP
        say("config_file", f"{path}: tls_server_config must be a mapping of {', '.join(names)}", tls)
    if data.get("basic_auth_users") is not None:
        out["basic_auth_users"] = data["basic_auth_users"]
    if unknown:
        say(
            "config_file",
            f"{path} has keys this exporter does not support: {sorted(map(str, unknown))}; "
            f"supported: tls_server_config.{{{', '.join(names)}}}, basic_auth_users",
        )
    return out


@dataclass(frozen=True)
class WebConfig:
    """monitor_config.web: who may read the endpoint, in the spirit of Prometheus' web configuration file."""

    # a Prometheus web config file (tls_server_config, basic_auth_users)
    config_file: str | None = setting(None, check=optional(file_path()))
    tls_cert_file: str | None = setting(None, check=optional(readable_file()))
    tls_key_file: str | None = setting(None, check=optional(readable_file()))
    client_ca_file: str | None = setting(None, check=optional(readable_file()))
    client_auth_type: str = setting("NoClientCert", check=choice(*CLIENT_AUTH_TYPES))
    # user -> bcrypt or sha256:<hex> hash
    basic_auth_users: Mapping[str, str] = setting(factory=dict, check=_password_hashes)
    # a rendered page is reused this long: a flood of requests costs one render
    cache_seconds: float = setting(0.25, check=at_least(0, 3600))
    # Requests read and answered per second, at most (0: no limit). Past it a request waits its turn before it
    # is read: a flood costs the training process this many requests' Python a second, whatever the load.
    max_requests_per_second: float = setting(20.0, check=at_least(0, 1_000_000))

    @property
    def tls(self) -> bool:
        return self.tls_cert_file is not None

    @staticmethod
    def _expand(raw: Mapping[str, Any], say: Say) -> Mapping[str, Any]:
        """The settings of config_file, under the keys given beside it."""
        if raw.get("config_file"):
            return {**_read_web_config_file(raw["config_file"], say), **raw}
        return raw

    def _cross_check(self, say: Say) -> None:
        if (self.tls_cert_file is None) != (self.tls_key_file is None):
            say(
                "",
                "tls_cert_file and tls_key_file go together: give both for TLS, or neither",
                {"tls_cert_file": self.tls_cert_file, "tls_key_file": self.tls_key_file},
            )
        if not self.tls and (self.client_ca_file or self.client_auth_type != "NoClientCert"):
            say(
                "",
                "client certificates (client_ca_file, client_auth_type) need TLS: set tls_cert_file and tls_key_file",
                self.client_auth_type,
            )
        if self.client_auth_type != "NoClientCert" and not self.client_ca_file:
            say(
                "client_auth_type", "needs client_ca_file, the CA that signs client certificates", self.client_auth_type
            )
