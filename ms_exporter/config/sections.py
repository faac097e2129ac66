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

    enable: bool = setting(
        True, check=boolean(), doc="read gradient norms when the train cell reports them", allowed="bool"
    )
    every_n_steps: int = setting(
        10,
        check=int_in(1, 1_000_000),
        doc="device-to-host reads of the norms happen only at multiples of this step",
        allowed="integer ≥ 1",
    )
    layers: tuple[str, ...] = setting(
        (),
        check=regexes(),
        doc="layers always exported",
        allowed="regular expressions, matched from the start of a layer or parameter name",
    )  # matched (from the start) against layer names
    top_k: int = setting(
        5, check=int_in(0, 1000), doc="the largest other layers exported at each sample", allowed="0 to `max_series`"
    )
    max_series: int = setting(
        20, check=int_in(1, 1000), doc="cap on layer series (watched + top k)", allowed="1 to 1,000"
    )
    threshold: float | None = setting(
        DEFAULTS.grad_norm_high,
        check=optional(greater_than(0, MAX_RATIO)),
        doc="a max bound on `mindspore_train_grad_norm`, with `warn_on_value` semantics",
        allowed="number > 0 or null",
    )
    clip: float | None = setting(
        None,
        check=optional(greater_than(0, MAX_RATIO)),
        doc=(
            "the clip threshold for `mindspore_train_grad_norm_clipped_total`; null takes `clip_norm` of "
            "`GradNormTrainOneStepCell`"
        ),
        allowed="number > 0 or null",
        shown="`null`",
    )

    def _cross_check(self, say: Say) -> None:
        if self.top_k > self.max_series:
            say("top_k", f"must not exceed max_series ({self.max_series})", self.top_k)


@dataclass(frozen=True)
class LayerNormConfig:
    """monitor_config.layernorm: statistics of every LayerNorm scale (gamma)."""

    enable: bool = setting(True, check=boolean(), doc="LayerNorm scale statistics", allowed="bool")
    # Reading every LayerNorm scale costs ~0.3 ms on the demo model: every 25 steps keeps it near 10 µs a step
    # and still gives the 100-step drift window four samples.
    every_n_steps: int = setting(
        25,
        check=int_in(1, 1_000_000),
        doc=(
            "how often the scales are read (a read of every scale costs ~0.3 ms on the demo model; the "
            "100-step window gets 4 samples)"
        ),
        allowed="integer ≥ 1",
    )
    window: int = setting(
        100, check=int_in(1, 10_000_000), doc="the span of the drift ratio", allowed="integer ≥ 1 (steps)"
    )
    drift_threshold: float | None = setting(
        DEFAULTS.layernorm_drift,
        check=optional(greater_than(0, MAX_RATIO)),
        doc="a bound on |drift ratio|",
        allowed="number > 0 or null",
    )
    # Three series per scale: a deep model (two norms a block) would otherwise be a rank's largest family.
    max_layers: int = setting(
        24,
        check=int_in(1, 10_000),
        doc=(
            "cap on the LayerNorm (and RMSNorm) scales watched, three series each; a model with more has this"
            " many watched, spread evenly over its depth (the first and the last included; which ones is "
            "logged at train begin)"
        ),
        allowed="1 to 10,000",
    )


@dataclass(frozen=True)
class UpdateRatioConfig:
    """monitor_config.update_ratio: how far each layer's weights moved between two samples, ||w - w_before|| / ||w||
    (the TensorBoard article's "parameter update size"; docs/update-ratio.md)."""

    enable: bool = setting(
        False,
        check=boolean(),
        doc=(
            "each layer's update ratio ‖w − w_before‖ / ‖w‖ between samples "
            "([update-ratio.md](update-ratio.md)); read on the device at `sketch_size` positions per weight "
            "tensor, one transfer per sample"
        ),
        allowed="bool",
    )
    # The ratio is over these many steps: each sample reads every weight's norm and its values at sketch_size fixed
    # random positions, on the device, and keeps those values on the host until the next.
    every_n_steps: int = setting(
        100, check=int_in(1, 1_000_000), doc="steps between the samples the ratio compares", allowed="integer ≥ 1"
    )
    sketch_size: int = setting(
        1024,
        check=int_in(16, 1_000_000),
        doc=(
            "fixed random positions read per weight tensor; relative error about 1 / √(2 × sketch_size); a "
            "tensor of at most this many values is compared whole (exact)"
        ),
        allowed="16 to 1,000,000",
    )
    layers: tuple[str, ...] = setting(
        (),
        check=regexes(),
        doc="layers always exported",
        allowed="regular expressions, matched from the start of a layer or parameter name",
    )  # always exported; matched like grad_norm.layers
    top_k: int = setting(
        3,
        check=int_in(0, 1000),
        doc="the layers that moved least and the layers that moved most, this many each, exported besides",
        allowed="0 to half of `max_series`",
    )
    max_series: int = setting(
        20, check=int_in(1, 1000), doc="cap on layer series (watched + 2 × top k)", allowed="1 to 1,000"
    )
    frozen_fraction: float = setting(
        DEFAULTS.update_ratio_frozen_fraction,
        check=greater_than(0, 1),
        doc=("`MindSporeTrainingLayerFrozen`: a layer whose ratio is under this share of its rank's median layer's"),
        allowed="number in (0, 1]",
    )

    def _cross_check(self, say: Say) -> None:
        if 2 * self.top_k > self.max_series:
            say("top_k", f"the top_k smallest and largest must fit in max_series ({self.max_series})", self.top_k)


@dataclass(frozen=True)
class ActivationsConfig:
    """monitor_config.activations: mean, std, max |x| and the shares of zeros and non-finite values of selected
    layers' outputs every `every_n_steps` steps (the TensorBoard article's debug tier; docs/activations.md)."""

    enable: bool = setting(
        False,
        check=boolean(),
        doc=(
            "measure the selected layers' outputs (in GRAPH mode the selected cells are wrapped while a "
            "training call runs, and the measured steps run a second compiled graph)"
        ),
        allowed="bool",
    )
    layers: tuple[str, ...] = setting(
        (),
        check=regexes(),
        doc=(
            "the cells measured; a cell's name is its path in the network, as its parameters' names spell it "
            "(`encoder.layers.0` for `encoder.layers.0.dense1.weight`), so the names `grad_norm.layers` uses;"
            " `[]`: the network's top-level cells but its loss. A pattern that matches no cell is a warning "
            "naming the nearest ones"
        ),
        allowed="regular expressions, matched from the start of a cell's name",
    )
    # A measured step costs a second graph's run (GRAPH mode) or hooks and one reduction per layer (PYNATIVE); the
    # steps in between cost nothing (docs/activations.md, "What it costs").
    every_n_steps: int = setting(
        100,
        check=int_in(1, 1_000_000),
        doc="the measured steps are its multiples; the steps in between run as without the monitor",
        allowed="integer 1-1,000,000",
    )
    max_layers: int = setting(
        16,
        check=int_in(1, 1000),
        doc=(
            "cap on the layers measured, five series each; more matches are thinned evenly over the model's "
            "depth (the first and the last kept; the log names the ones kept)"
        ),
        allowed="integer 1-1,000",
    )


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

    endpoint: str | None = setting(
        None,
        check=optional(url()),
        doc=(
            "where to send; unset: `OTEL_EXPORTER_OTLP_METRICS_ENDPOINT`, else `OTEL_EXPORTER_OTLP_ENDPOINT`,"
            " else the SDK's default (`localhost:4317` for gRPC, `http://localhost:4318/v1/metrics` for "
            "HTTP). For `http/protobuf`, an endpoint without a path gets `/v1/metrics`, as the SDK does for "
            "the variable"
        ),
        allowed="a URL (`scheme://host:port[/path]`)",
    )
    protocol: str | None = setting(
        None,
        check=optional(choice(*OTLP_PROTOCOLS)),
        doc="unset: `OTEL_EXPORTER_OTLP_METRICS_PROTOCOL`, else `OTEL_EXPORTER_OTLP_PROTOCOL`, else `grpc`",
        allowed="`grpc`, `http/protobuf`",
    )
    interval: float | None = setting(
        None,
        check=optional(at_least(0.1, MAX_SECONDS)),
        doc=(
            "time between exports (each renders every series: ten a second at most); unset: "
            "`OTEL_METRIC_EXPORT_INTERVAL` (milliseconds), else 60 s"
        ),
        allowed="number of at least 0.1 (seconds), at most a week",
    )
    timeout: float = setting(
        10.0,
        check=greater_than(0, MAX_SECONDS),
        doc="what one export may take, the exporter's retries included; also bounds the last export on close",
        allowed="number > 0 (seconds)",
        shown="`10`",
    )  # seconds one export may take, retries included
    headers: Mapping[str, str] | None = setting(
        None,
        check=optional(_headers),
        doc=(
            "request headers (gRPC metadata); unset: `OTEL_EXPORTER_OTLP_(METRICS_)HEADERS`. Values are "
            "secrets: `check-config` prints `<redacted>`, errors never echo them"
        ),
        allowed="mapping, or `name=value,name2=value2`",
    )
    insecure: bool | None = setting(
        None,
        check=optional(boolean()),
        doc=(
            "gRPC without TLS; unset: `OTEL_EXPORTER_OTLP_(METRICS_)INSECURE`, else decided by the endpoint's"
            " scheme (`http://` is plaintext)"
        ),
        allowed="bool",
    )


@dataclass(frozen=True)
class PushgatewayConfig:
    """monitor_config.pushgateway: push this rank's series to a Pushgateway, grouped by project and rank."""

    url: str | None = setting(
        None,
        check=optional(url()),
        doc="the Pushgateway to push to; null (the default) pushes nothing",
        allowed="a URL such as `http://host:9091` (a path prefix is kept), or null",
        shown="none",
    )  # None: no pushes
    on: tuple[str, ...] = setting(
        ("train_end",), check=names(PUSH_EVENTS), doc="when to push (below)", allowed="any of `train_end`, `interval`"
    )
    interval: float = setting(
        30.0,
        check=at_least(0.1, MAX_SECONDS),
        doc=("time between pushes when `on` has `interval` (each renders the whole store: ten a second at most)"),
        allowed="number of at least 0.1 (seconds), at most a week",
        shown="`30`",
    )
    timeout: float = setting(
        5.0,
        check=greater_than(0, MAX_SECONDS),
        doc="per connect and per read of one push; a push that runs out of time is dropped",
        allowed="number > 0 (seconds)",
        shown="`5`",
    )
    job: str = setting(
        "mindspore_training", check=text(), doc="the `job` label of the pushed group", allowed="non-empty string"
    )


@dataclass(frozen=True)
class EarlyStopConfig:
    """monitor_config.actions.early_stop: stop when the smoothed loss stops improving, or on non-finite losses."""

    enable: bool = setting(
        False,
        check=boolean(),
        doc=(
            "stop training cleanly (`run_context.request_stop()`, after the current step); the JSON Lines "
            "file gets an `action` event `early_stop` with the step and the reason, which `ms-exporter "
            "triage` and `report` read as a stop on purpose"
        ),
        allowed="bool",
    )
    patience: int = setting(
        5,
        check=int_in(1, 10_000_000),
        doc="evaluations of `mindspore_train_loss_smoothed` without an improvement; they count across epochs",
        allowed="integer ≥ 1",
    )  # evaluations without improvement
    min_delta: float = setting(
        0.0,
        check=at_least(0, MAX_RATIO),
        doc="an improvement must beat the best smoothed loss so far by more than this",
        allowed="number ≥ 0",
        shown="`0`",
    )
    unit: str = setting(
        "epoch",
        check=choice(*EARLY_STOP_UNITS),
        doc="what one evaluation is: each epoch end, or each step",
        allowed="`epoch`, `step`",
    )  # what one evaluation is: an epoch end or a step
    max_nonfinite: int | None = setting(
        3,
        check=optional(int_in(1, 1_000_000)),
        doc="this many non-finite losses in a row stop at once, whatever the patience; null: never",
        allowed="integer ≥ 1 or null",
    )


@dataclass(frozen=True)
class LrBackoffConfig:
    """monitor_config.actions.lr_backoff: scale the learning rate down on a rising loss or a large gradient norm."""

    enable: bool = setting(
        False,
        check=boolean(),
        doc=(
            "multiply the learning rate by `factor` when the loss rose `rising_steps` steps in a row "
            "(`mindspore_train_loss_consecutive_increases`) or, with `on_grad_norm`, the gradient norm is "
            "over `grad_norm.threshold`"
        ),
        allowed="bool",
    )
    factor: float = setting(0.5, check=between(0, 1), doc="per back-off; back-offs compound", allowed="0 < x < 1")
    rising_steps: int = setting(
        20,
        check=int_in(1, 10_000_000),
        allowed="integer ≥ 1",
        doc="how many steps in a row the loss must rise before a back-off",
    )
    on_grad_norm: bool = setting(
        True,
        check=boolean(),
        doc=(
            "also back off when the gradient norm passes `grad_norm.threshold`; needs a train cell that reports "
            "the norm (`GradNormTrainOneStepCell`, MindSpore Transformers' cells)"
        ),
        allowed="bool",
    )
    cooldown: int = setting(
        100,
        check=int_in(0, 10_000_000),
        doc="after a back-off, no other one for this many steps",
        allowed="integer ≥ 0 (steps)",
    )  # steps after a back-off before the next one
    min_lr: float = setting(
        0.0,
        check=at_least(0, MAX_RATIO),
        doc=("the learning rate is never scaled below this (against the schedule's current value for a schedule)"),
        allowed="number ≥ 0",
        shown="`0`",
    )


@dataclass(frozen=True)
class SnapshotConfig:
    """monitor_config.actions.snapshot: a checkpoint at the first anomaly of each episode."""

    enable: bool = setting(
        False,
        check=boolean(),
        doc="on the first anomaly of an episode, save a checkpoint to `save_dir/snapshots/`",
        allowed="bool",
    )
    spike_factor: float = setting(
        LOSS_SPIKE_FACTOR,
        check=greater_than(1, MAX_RATIO),
        doc=(
            "a loss above this many times the previous step's smoothed loss is a spike; non-finite losses and"
            " a gradient norm over `grad_norm.threshold` are anomalies too"
        ),
        allowed="number > 1",
    )
    max_snapshots: int = setting(
        3, check=int_in(1, 1000), doc="the oldest snapshots are removed beyond this", allowed="integer 1-1,000"
    )
    quiet_steps: int = setting(
        10,
        check=int_in(1, 10_000_000),
        doc="steps without an anomaly that end an episode (the next anomaly snapshots again)",
        allowed="integer ≥ 1",
    )  # steps without an anomaly that end an episode


@dataclass(frozen=True)
class RollbackConfig:
    """monitor_config.actions.rollback: keep the last good state; on a divergence restore it, list the batches
    trained since, and go on (docs/rollback.md)."""

    enable: bool = setting(
        False,
        check=boolean(),
        doc=(
            "keep the last good state; on a divergence restore it, list the batches trained since in "
            "`save_dir/skipped-batches.json` and go on ([rollback.md](rollback.md))"
        ),
        allowed="bool",
    )
    good_every: int = setting(
        100, check=int_in(1, 10_000_000), doc="steps between good states", allowed="integer ≥ 1"
    )  # steps between good states
    quiet_steps: int = setting(
        20,
        check=int_in(1, 10_000_000),
        doc="steps without a divergence before a state counts as good",
        allowed="integer ≥ 1",
    )  # steps without a divergence before one is kept
    min_health: float = setting(
        0.8, check=at_least(0, 1), doc="`mindspore_train_health_score` a good state needs", allowed="0-1"
    )  # mindspore_train_health_score needed to keep one
    max_kept: int = setting(
        2, check=int_in(1, 100), doc="good states kept (a rollback restores the newest)", allowed="integer 1-100"
    )
    # where good states live: memory (copies on the device where each Parameter lives), disk (files in
    # save_dir/good-states, written from a device copy by a background thread), or auto: memory while max_kept + 1
    # states (the newest is taken before the oldest goes) fit in memory_limit_mb, which so bounds the device memory
    # good states hold; disk holds one state's device copy while it is written (docs/rollback.md)
    storage: str = setting(
        "auto",
        check=choice(*ROLLBACK_STORAGE),
        doc=(
            "device copies of every Parameter, or `.npz` files in `save_dir/good-states` written from a "
            "device copy by a background thread; auto: memory while `max_kept` + 1 states fit in "
            "`memory_limit_mb`"
        ),
        allowed="`auto`, `memory`, `disk`",
    )
    memory_limit_mb: float = setting(
        64.0,
        check=greater_than(0, 1024 * 1024),
        doc=(
            "the device memory good states in memory may hold (`max_kept` + 1 states: the newest is taken "
            "before the oldest goes); larger states go to disk ([rollback.md](rollback.md))"
        ),
        allowed="number > 0",
        shown="`64`",
    )
    # what a divergence is: a non-finite loss, a loss over spike_factor x the smoothed loss, a gradient norm over
    # grad_norm_above (unset: the exploding threshold, 10 x grad_norm.threshold)
    on_nonfinite: bool = setting(True, check=boolean(), doc="a non-finite loss is a divergence", allowed="bool")
    spike_factor: float | None = setting(
        LOSS_SPIKE_FACTOR,
        check=optional(greater_than(1, MAX_RATIO)),
        doc=(
            "a loss above this many times the smoothed loss before it is a divergence (after `warmup_steps`);"
            " null: never"
        ),
        allowed="number > 1 or null",
    )
    grad_norm_above: float | None = setting(
        None,
        check=optional(greater_than(0, MAX_RATIO)),
        doc="a gradient norm above this is a divergence; null: 10 x `grad_norm.threshold`",
        allowed="number > 0 or null",
        shown="the exploding threshold",
    )
    max_rollbacks: int = setting(
        3,
        check=int_in(1, 1000),
        doc="rollbacks allowed within `window_steps`; the next divergence stops training",
        allowed="integer 1-1,000",
    )
    window_steps: int = setting(
        1000,
        check=int_in(1, 10_000_000),
        allowed="integer ≥ 1",
        doc="the span, in steps, over which rollbacks are counted against `max_rollbacks`",
    )


@dataclass(frozen=True)
class ActionsConfig:
    """monitor_config.actions: what the monitor may do to the run, each off by default."""

    early_stop: EarlyStopConfig = section(EarlyStopConfig)
    lr_backoff: LrBackoffConfig = section(LrBackoffConfig)
    snapshot: SnapshotConfig = section(SnapshotConfig)
    rollback: RollbackConfig = section(RollbackConfig)
    shared_loss: bool = setting(
        False,
        check=boolean(),
        doc=(
            "the loss the training hands the monitor is already the mean over the data-parallel replicas, the same "
            "on every rank (a loop that all-reduces it): in a job of more than one rank early_stop, lr_backoff "
            "and rollback then decide from it alike on every rank, and no warning says otherwise "
            "(GradNormTrainOneStepCell shares its loss by itself)"
        ),
        allowed="bool",
    )

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

    enable: bool = setting(
        True,
        check=boolean(),
        doc="export the deadline and run the hang watchdog (the phases are always exported)",
        allowed="bool",
    )
    min_seconds: float = setting(
        120.0,
        check=greater_than(0, MAX_SECONDS),
        doc=(
            "the floor of the learned deadline. 120 s: longer than a garbage collection, a log rotation or an"
            " epoch boundary's data reload on a busy host, short enough that a stall of sub-second steps "
            "pages within 3 minutes"
        ),
        allowed="number > 0",
        shown="`120`",
    )
    factor: float = setting(
        3.0,
        check=at_least(1, MAX_RATIO),
        doc="the learned deadline is this many times the recent step cycle",
        allowed="number ≥ 1",
        shown="`3`",
    )
    percentile: float = setting(
        99.0,
        check=_percentile,
        doc=(
            "which percentile of the recent step cycles (from one step's end to the next, everything between "
            "included) the factor multiplies: a high one, so that the run's own regular slow cycles (an epoch"
            " boundary, a shard read from slow storage, a callback that uploads every 20 steps) raise the "
            "deadline instead of tripping it"
        ),
        allowed="50 to 100",
        shown="`99`",
    )
    window: int = setting(
        500,
        check=int_in(10, 1_000_000),
        doc="how many recent cycles the percentile is taken over",
        allowed="integer ≥ 10 (step cycles; sink cycles in sink mode)",
    )  # step cycles
    compile_seconds: float = setting(
        3600.0,
        check=greater_than(0, MAX_SECONDS),
        doc=(
            "the deadline from train begin to the end of the first step (graph compilation of a large model "
            "on Ascend takes tens of minutes)"
        ),
        allowed="number > 0",
        shown="`3600`",
    )  # train begin to the first step's end
    eval_seconds: float = setting(
        1800.0,
        check=greater_than(0, MAX_SECONDS),
        doc="the deadline of an evaluation pass",
        allowed="number > 0",
        shown="`1800`",
    )
    checkpoint_seconds: float = setting(
        1800.0,
        check=greater_than(0, MAX_SECONDS),
        doc=(
            "the deadline of a checkpoint save: a `ModelCheckpoint`'s (or subclass's) step or epoch hook "
            "(writing hundreds of GB to shared storage)"
        ),
        allowed="number > 0",
        shown="`1800`",
    )
    checkpoint_callbacks: tuple[str, ...] = setting(
        (),
        check=class_names(),
        doc=(
            "callbacks whose step and epoch hooks also count as `checkpoint` (their class or a base class has"
            " one of these names: an uploader, a custom saver); any other callback's hooks are the "
            "`callbacks` phase, with the learned deadline"
        ),
        allowed="a class name or a list of them",
    )
    debug_endpoint: bool = setting(
        True,
        check=boolean(),
        doc=(
            "serve the latest stack dump at `GET /debug/stacks` on the rank's endpoint (same TLS and auth as "
            "`/metrics`; 404 before any dump)"
        ),
        allowed="bool",
    )
    native_stacks: bool = setting(
        True,
        check=boolean(),
        doc=(
            "add native (C/C++) frames to a dump through `py-spy dump --native` when `py-spy` is on PATH and "
            "may read the process; the dump says which it has"
        ),
        allowed="bool",
    )  # add py-spy's native frames when py-spy is installed


@dataclass(frozen=True)
class FailSlowConfig:
    """monitor_config.failslow: each rank's own work per step scored, and a slowdown flagged at the step it starts
    (docs/failslow.md)."""

    enable: bool = setting(
        True,
        check=boolean(),
        doc=(
            "keep the detector: `mindspore_train_slowness_score`, `mindspore_train_failslow`, its onset step and size"
        ),
        allowed="bool",
    )
    alert_below: float = setting(
        DEFAULTS.failslow_relative,
        check=between(0, 1),
        doc=(
            "`MindSporeTrainingFailSlow` pages for a flagged rank whose relative score (the job's cycle over "
            "the one it would have were this rank's own work the best rank's) is under this (`ms-exporter "
            "rules --config`)"
        ),
        allowed="a number between 0 and 1 (exclusive)",
    )


@dataclass(frozen=True)
class GoodputConfig:
    """monitor_config.goodput: the time ledger and the run state that carries it across restarts (docs/goodput.md).

    The run is `run_id` (top level, or MS_EXPORTER_RUN_ID), else one derived from project and save_dir."""

    enable: bool = setting(True, check=boolean(), doc="keep the ledger and the run state file", allowed="bool")
    save_seconds: float = setting(
        5.0,
        check=at_least(0.1, MAX_SECONDS),
        doc=(
            "how often the run state file is rewritten (a write and a rename each time: ten a second at "
            "most); the run's totals (`mindspore_train_run_time_seconds_total`) are exported as of the last "
            "save"
        ),
        allowed="number of at least 0.1 (seconds), at most a week",
        shown="`5`",
    )
    alert_below: float = setting(
        DEFAULTS.goodput_low,
        check=between(0, 1),
        doc=(
            "`MindSporeTrainingGoodputLow` fires when less than this share of the last hour was productive "
            "(`ms-exporter rules --config`)"
        ),
        allowed="a number between 0 and 1 (exclusive)",
    )


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

    enable: bool = setting(
        True,
        check=boolean(),
        doc="fingerprint the parameters where the job has replicas (more than one rank, not `stand_alone`)",
        allowed="bool",
    )  # acts only where the job has replicas (more than one rank)
    every_n_steps: int = setting(
        100,
        check=int_in(1, 1_000_000),
        doc=(
            "how often; each fingerprint reads every parameter once (about 1 ms on the demo model, "
            "[benchmarks.md](benchmarks.md))"
        ),
        allowed="integer 1-1,000,000",
    )
    replica_group: str | None = setting(
        None,
        check=optional(text(label_value=True)),
        doc="this rank's replica group, where MindSpore's parallel context does not give it",
        allowed="a label value",
        shown="derived",
    )
    model_parallel: int | None = setting(
        None,
        check=optional(int_in(1, 1_000_000)),
        doc=(
            "ranks that hold the shards of one replica within a pipeline stage (MindSpore Transformers' "
            "`parallel_config.model_parallel`), for semi-auto and auto parallel jobs; fail-slow reads it too,"
            " to name a model copy whose every rank slowed ([failslow.md](failslow.md#groups))"
        ),
        allowed="integer ≥ 1",
        shown="from `dataset_strategy`",
    )
    check_every_step: bool = setting(
        True,
        check=boolean(),
        doc=(
            "read the bit sums of every weight and optimizer state tensor at every step's end, so that a "
            "corruption is caught at the step it happens ([sdc.md](sdc.md); 0.09 ms a step on the demo model,"
            " growing with the parameters: a rank whose checks cost more than 1% of its step cycle says so "
            "once, in a WARNING, [sdc.md](sdc.md#what-it-costs)). Set it alike on every rank of a group"
        ),
        allowed="bool",
    )
    check_every_n_steps: int = setting(
        1,
        check=int_in(1, 1_000_000),
        doc=(
            "the checks on every n-th step only: a corruption is then seen up to n - 1 steps late, still "
            "named by tensor; their cost is divided by n. The same n on every rank (replicas must read the "
            "same steps); the cost WARNING names the least n that brings them within 1%"
        ),
        allowed="integer 1-1,000,000 dividing `divergence.every_n_steps`",
    )
    buckets: int = setting(
        8,
        check=int_in(1, 64),
        doc=(
            "runs of tensors of each kind (weights, optimizer state) compared as one checksum each: "
            "`mindspore_train_param_checksum{kind,bucket}`"
        ),
        allowed="integer 1-64",
    )
    window_steps: int = setting(
        128,
        check=int_in(1, 10_000),
        doc=(
            "steps of per-tensor sums kept for `/debug/checksums` (which names the step and the tensor where "
            "replicas first differ): the last this many, and as many of each of the two comparison intervals "
            "before the current one; at least `every_n_steps` keeps those whole"
        ),
        allowed="integer 1-10,000",
    )
    # Measured by GradNormTrainOneStepCell every step where replica checks run.
    local_grad_factor: float = setting(
        1000.0,
        check=at_least(2, MAX_RATIO),
        doc=(
            "a rank's local gradient norm (before the all-reduce) more than this many times the median of its"
            " last 128 is an outlier: logged with rank and step, counted in "
            "`mindspore_train_local_grad_outliers_total`, paged by `MindSporeTrainingSilentDataCorruption` "
            "([sdc.md](sdc.md#local-gradients))"
        ),
        allowed="number ≥ 2",
        shown="`1000`",
    )
    skip_local_grad_outliers: bool = setting(
        False,
        check=boolean(),
        doc=(
            "skip, on every replica, each step at which any replica's local gradient norm is over its limit "
            "(`local_grad_factor` times its median) or not finite: the corrupted update is applied nowhere "
            "(GradNormTrainOneStepCell: one all-reduce of a number and an in-graph branch a step; counted in "
            "`mindspore_train_local_grad_skipped_steps_total`, [sdc.md](sdc.md#skipping-the-step))"
        ),
        allowed="bool",
    )
    inject_flips: tuple[BitFlip, ...] = setting(
        (),
        check=_flips,
        doc=(
            "drills: flip these bits at the end of these steps ([sdc.md](sdc.md#drills)); refused unless "
            "`allow_injection`"
        ),
        allowed=(
            "a list of mappings with `rank`, `step`, `kind` (`weights`, `optimizer` or `gradients`: the local"
            " gradient of that trained weight, before the all-reduce; GradNormTrainOneStepCell only), "
            "`tensor` (a Parameter name or a position from 0), `element` (from 0, in the flattened tensor) "
            "and `bit` (0-63)"
        ),
    )
    allow_injection: bool = setting(
        False,
        check=boolean(),
        doc="must be `true` for `inject_flips` to be accepted: a fault is never injected by a stray setting",
        allowed="bool",
    )

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

    enable: bool = setting(
        False,
        check=boolean(),
        doc="measure the batches; off by default (it reads the batch on the training thread)",
        allowed="bool",
    )
    every_n_steps: int = setting(
        1,
        check=int_in(1, 1_000_000),
        doc="the batch of every this many steps is measured (the first of each training call, then every n)",
        allowed="integer 1-1,000,000",
    )  # a batch of every this many steps is measured
    label_column: str | int | None = setting(
        None,
        check=optional(_column),
        doc=(
            "the class labels whose entropy is measured (integer ids, an ignore index below 0 left out; "
            "one-hot rows by their largest entry); null: no label entropy"
        ),
        allowed="a column name, or its position in the batch (0-10,000)",
        shown="`null`",
    )
    token_column: str | int | None = setting(
        None,
        check=optional(_column),
        doc=(
            "the token ids (2-D integers); null: `input_ids_column` where it holds them, else the first other"
            " column that does"
        ),
        allowed="a column name or position",
        shown="`null`",
    )
    pad_id: int | None = setting(
        None,
        check=optional(int_in(-(2**31), 2**31 - 1)),
        doc=(
            "the padding id, for datasets without an `attention_mask_column` (the mask, where there is one, "
            "says what is padding, as for the token counts); null without a mask: no lengths, padding or "
            "empty samples"
        ),
        allowed="integer (int32) or null",
        shown="`null`",
    )
    vocab_size: int | None = setting(
        None,
        check=optional(int_in(1, 10**9)),
        doc=(
            "token ids outside `[0, vocab_size)` are counted "
            "(`mindspore_train_data_out_of_vocab_tokens_total`); null: not counted"
        ),
        allowed="integer 1-10^9 or null",
        shown="`null`",
    )  # null: no out-of-vocabulary count
    baseline_steps: int = setting(
        20,
        check=int_in(1, 1_000_000),
        doc="a quantity's baseline is its median over this many measured batches, the first of the process",
        allowed="integer 1-1,000,000",
    )
    drop_ratio: float = setting(
        DATA_QUALITY_DROP_RATIO,
        check=between(0, 1),
        doc="a measured batch whose quantity is below this times its baseline is low",
        allowed="number between 0 and 1 (exclusive)",
    )  # below baseline x this: low
    streak: int = setting(
        DATA_QUALITY_STREAK,
        check=int_in(1, 1_000_000),
        doc=(
            "low batches in a row that make a drop: `mindspore_train_data_quality_low` is 1 and "
            "`MindSporeTrainingDataQualityDrop` may fire (the strategy-container article's \"5 steps in a "
            'row")'
        ),
        allowed="integer 1-1,000,000",
    )  # low batches in a row: a drop
    list_batches: bool = setting(
        False,
        check=boolean(),
        doc=(
            "the action: every batch of a drop (the first `streak` too) goes to "
            "`save_dir/skipped-batches.json`, rollback's list, so that `SkipListedSamples` / `KeepUnlisted` "
            "keep its samples out on the next pass ([rollback.md](rollback.md#keeping-the-batches-out))"
        ),
        allowed="bool",
    )
    max_listed: int = setting(
        1000,
        check=int_in(1, 1_000_000),
        doc=(
            "batches one process lists at most (a long drop would grow the list without end); past it drops "
            "are measured and alerted on, not listed, and the log says so once"
        ),
        allowed="integer 1-1,000,000",
    )  # batches one process lists at most

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

    num_layers: int | None = setting(
        None,
        check=_SIZE,
        doc=(
            "the description; all five together. `vocab_size: 0`: no output layer per token (a classifier on "
            "a pooled vector). MindSpore Transformers' `model_config` names: the same, `intermediate_size` is"
            " `ffn_hidden_size`, `n_kv_heads` is `num_kv_heads`"
        ),
        allowed="integers ≥ 1 (`vocab_size` ≥ 0)",
    )
    hidden_size: int | None = setting(None, check=_SIZE)
    num_heads: int | None = setting(None, check=_SIZE)
    ffn_hidden_size: int | None = setting(None, check=_SIZE)
    vocab_size: int | None = setting(None, check=optional(int_in(0, 10**9)))  # 0: no per-token output layer
    num_kv_heads: int | None = setting(
        None,
        check=_SIZE,
        doc="key/value heads (grouped-query and multi-query attention)",
        allowed="integer dividing `num_heads`",
        shown="unset: `num_heads`",
    )
    head_dim: int | None = setting(
        None,
        check=_SIZE,
        doc="the size of one attention head, where heads x head_dim is not the hidden size",
        allowed="integer ≥ 1",
        shown="unset: `hidden_size / num_heads`",
    )
    gated_mlp: bool = setting(
        False, check=boolean(), doc="three MLP matrices (gate, up, down: SwiGLU, GeGLU) instead of two", allowed="bool"
    )
    causal: bool = setting(
        True,
        check=boolean(),
        doc=(
            "each token attends to the ones before it: half the attention square. Read without a description "
            "too (the parameters fallback)"
        ),
        allowed="bool",
    )
    num_experts: int = setting(
        0,
        check=int_in(0, 1_000_000),
        doc=(
            "MoE: routed experts per layer, experts per token, an expert's FFN size, experts every token goes through"
        ),
        allowed="integers",
    )
    moe_top_k: int | None = setting(None, check=_SIZE)
    moe_ffn_hidden_size: int | None = setting(None, check=_SIZE, shown="unset: `ffn_hidden_size`")
    shared_experts: int = setting(0, check=int_in(0, 1_000_000))
    tied_embeddings: bool = setting(
        False,
        check=boolean(),
        doc=(
            "the output layer reuses the input table: changes the parameter count, not the FLOPs "
            "([mfu.md](mfu.md#the-formula-term-by-term))"
        ),
        allowed="bool",
    )
    seq_length: int | None = setting(
        None,
        check=_SIZE,
        doc=(
            "the model's sequence length, for `ms-exporter check-config`, which prints the description's "
            "parameter count and its FLOPs per token of a full sequence (the monitor itself reads each "
            "batch's real lengths)"
        ),
        allowed="integer ≥ 1",
    )  # for check-config's figure per token of a full sequence

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

    enable: bool = setting(
        True,
        check=boolean(),
        doc="count model FLOPs (for token data: a batch with an `input_ids` column of integers)",
        allowed="bool",
    )
    per_token: float | None = setting(
        None,
        check=optional(greater_than(0, MAX_FLOPS)),
        doc=(
            "training FLOPs per token, stated: attention included, so sequence lengths do not change it. Not "
            "with `model`"
        ),
        allowed="number > 0, at most 1e30",
    )
    model: FlopsModelConfig = section(FlopsModelConfig)
    peak_flops_per_device: float | str | None = setting(
        None,
        check=optional(_peak),
        doc="the device's peak at the precision training runs at ([mfu.md](mfu.md#peak-presets))",
        allowed=(
            "a number > 0 (FLOPs per second), or a preset: `nvidia_a100_bf16`, `nvidia_a100_fp16`, "
            "`nvidia_h100_sxm_bf16`, `nvidia_h100_pcie_bf16`, `ascend_910_fp16`"
        ),
    )
    seq_len_column: str = setting(
        "actual_seq_len",
        check=text(),
        doc=(
            "packed data: each row's document end offsets (MindSpore Transformers' `actual_seq_len`); "
            "attention then costs the sum of the documents' lengths squared"
        ),
        allowed="a column name",
    )
    ranks_per_batch: int | None = setting(
        None,
        check=optional(int_in(1, 10**7)),
        doc=(
            "ranks that compute each batch this rank's dataset yields: 1 in data parallel, all ranks with "
            "`full_batch`, tensor x pipeline parallel ranks otherwise; a rank's model FLOPs are its batches' "
            "over this"
        ),
        allowed="integer ≥ 1",
        shown="from the parallel context",
    )
    alert_below: float | None = setting(
        None,
        check=optional(between(0, 1)),
        doc=(
            "`MindSporeTrainingMfuLow` fires when the project's MFU stays below it for 10 minutes "
            "(`ms-exporter rules --config`); unset: no such alert"
        ),
        allowed="a number between 0 and 1 (exclusive); needs a peak",
    )

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

    all_ranks: bool = setting(
        False,
        check=boolean(),
        doc=(
            "every rank writes its own `save_dir/tensorboard/<project>/rank<r>`; by default only rank 0 does,"
            " as MindSpore Transformers' own TensorBoard writer"
        ),
        allowed="bool",
    )
    collect_freq: int = setting(
        10,
        check=int_in(1, 1_000_000),
        doc=(
            "every this many steps (SummaryCollector's `collect_freq`) the per-layer tags `grad/<layer>`, "
            "`weight/<layer>`, `update_ratio/<layer>` and the histograms are written; the step scalars are "
            "written every step"
        ),
        allowed="integer ≥ 1",
    )
    histogram_regular: str | None = setting(
        None,
        check=optional(regex()),
        doc=(
            "weight histograms (`weight/<parameter>`, 64 equal bins) of the trainable parameters it matches "
            "(SummaryCollector's `histogram_regular`, e.g. `.*weight.*`), at most 64 of them; gradient "
            "histograms (`grad/<parameter>`) too where the train cell returns its gradients "
            "(`return_grad=True`). The values stay on the device: at the sampled step the training thread "
            "reduces all the chosen parameters in one compiled call, and that step's gradients in one more, "
            "each to min, max, count, sum, sum of squares and the 64 bins' counts of its finite values (NaN "
            "and inf are left out), and reads them in one transfer each: 276 bytes a parameter (17.6 KB for "
            "64 of them), whatever its size. The writer thread turns them into TensorBoard's histograms, with"
            " the bins `numpy.histogram` gives. A parameter of more than 65,536 values is drawn from at most "
            "65,536 of its values at fixed random places (the same at every sample): whole rows of its first "
            "axis, as many as fit (a row is contiguous, which every device reads at the speed of memory: on "
            "this CPU a tenth of the time of 65,536 single positions), or 65,536 single positions where one "
            "row holds more; its count, sums and bin counts are scaled to its size, its min and max are those"
            " of the drawn values: a histogram is a picture of the distribution, and the whole of a large "
            "tensor cost a pass and several tensor-sized intermediates on the device (6.5 GB at 100 M "
            "parameters)"
        ),
        allowed="one regular expression, matched from the start of a parameter name, or null",
        shown="`null`",
    )
    max_file_mb: float = setting(
        500.0,
        check=at_least(0, 1024 * 1024),
        doc=(
            "an event file this large is closed and the next one begun "
            "(`...tfevents.<time>.<host>.<pid>.<n>`; TensorBoard reads them in order); 0: one file"
        ),
        allowed="number ≥ 0 (MiB)",
        shown="`500`",
    )


@dataclass(frozen=True)
class HardwareConfig:
    """monitor_config.hardware: device and host health, read on threads of the monitor's own and never on the step
    path (docs/hardware.md). The strategy-container article's top-level `enable_hardware_monitor` is read as
    `enable`."""

    enable: bool = setting(
        True,
        check=boolean(),
        doc="read the hardware at all (`enable_hardware_monitor` at the top level means the same)",
        allowed="bool",
    )
    readers: tuple[str, ...] = setting(
        factory=registry.hardware_readers,
        check=names(registry.hardware_readers),
        doc=(
            "which readers to try; each runs where it finds a device (NVML: `pip install 'ms-exporter[nvml]'`"
            " and an NVIDIA driver; npu-smi: the command in a trusted directory, "
            "[hardware.md](hardware.md#failures-timeouts-output-size-featureshardwarecommandpy))"
        ),
        allowed="any of the registered readers (`nvml`, `npu_smi`, `host`, and ones you register)",
    )
    interval: float = setting(
        10.0,
        check=at_least(0.5, MAX_SECONDS),
        doc=(
            "seconds between readings (the strategy-container article samples every 10 steps because "
            "`nvidia-smi` costs about 80 ms)"
        ),
        allowed="number of at least 0.5 (seconds), at most a week",
        shown="`10`",
    )
    timeout: float = setting(
        5.0,
        check=at_least(0.1, MAX_SECONDS),
        doc=(
            "a reader still busy this long is counted as a failure (`TimeoutError`), again for each further "
            "timeout, and asked again only once it answers (three failures in a row switch it off and take "
            "its readings off the page); npu-smi's commands share it"
        ),
        allowed="number of at least 0.1 (seconds), at most a week",
        shown="`5`",
    )
    npu_smi: str = setting(
        "npu-smi",
        check=text(),
        doc="Huawei's npu-smi",
        allowed=(
            "a command name (looked for in trusted directories only: never the working directory or one other"
            " users can write) or an absolute path"
        ),
    )
    hccn_tool: str | None = setting(
        "hccn_tool",
        check=optional(text()),
        doc=("the RoCE link state on Ascend (often `/usr/local/Ascend/driver/tools/hccn_tool`); null: no link series"),
        allowed="a command name (trusted directories only, as `npu_smi`) or an absolute path, or null",
    )


@dataclass(frozen=True)
class WandbConfig:
    """monitor_config.wandb: the `wandb` backend's W&B runs, their files in save_dir/wandb (docs/configuration.md)."""

    all_ranks: bool = setting(
        False,
        check=boolean(),
        doc="every rank logs a run of its own; by default only rank 0 does, as for TensorBoard",
        allowed="bool",
    )
    mode: str = setting(
        "offline",
        check=choice("offline", "online"),
        doc=(
            "`offline`: files only, which `wandb sync save_dir/wandb` uploads later; `online`: wandb's own upload "
            "as it runs"
        ),
        allowed="`offline`, `online`",
    )
    project: str | None = setting(
        None,
        check=optional(text()),
        doc="the W&B project, when it should differ from the `project` label",
        allowed="a string",
        shown="unset: the `project` label",
    )  # the W&B project; unset: monitor_config.project
    entity: str | None = setting(
        None, check=optional(text()), doc="the W&B user or team", allowed="a string", shown="wandb's default"
    )  # the W&B team or user; unset: wandb's default


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

    config_file: str | None = setting(
        None,
        check=optional(file_path()),
        doc=(
            "`tls_server_config.{cert_file, key_file, client_ca_file, client_auth_type}` and "
            "`basic_auth_users`, read at construction; keys given directly under `web` win; any other key in "
            "the file is an error, not ignored"
        ),
        allowed="a Prometheus web config file (a path, as `save_dir`)",
    )
    tls_cert_file: str | None = setting(
        None,
        check=optional(readable_file()),
        doc=(
            "serve HTTPS (TLS 1.2+) instead of HTTP; the URL in logs and file_sd becomes `https://`. A "
            "certificate or key that does not load is a `ConfigError` at construction: the monitor never "
            "falls back to plain HTTP"
        ),
        allowed="readable files, both or neither",
    )
    tls_key_file: str | None = setting(None, check=optional(readable_file()))
    client_ca_file: str | None = setting(
        None,
        check=optional(readable_file()),
        doc="the CA that signs client certificates",
        allowed="a readable file; needs TLS",
    )
    client_auth_type: str = setting(
        "NoClientCert",
        check=choice(*CLIENT_AUTH_TYPES),
        doc="Prometheus' names; the last two need `client_ca_file`",
        allowed="`NoClientCert`, `VerifyClientCertIfGiven`, `RequireAndVerifyClientCert`",
    )
    basic_auth_users: Mapping[str, str] = setting(
        factory=dict,
        check=_password_hashes,
        doc="HTTP basic auth for every path; a request without valid credentials gets 401",
        allowed=(
            "user → bcrypt hash (`$2a$`/`$2b$`/`$2y$`, e.g. `htpasswd -nbBC 10 user pw`; needs `pip install "
            "'ms-exporter[auth]'`) or `sha256:<64 hex>` (`printf %s pw | sha256sum`)"
        ),
    )
    cache_seconds: float = setting(
        0.25,
        check=at_least(0, 3600),
        doc=(
            "a rendered `/metrics` page is reused this long, so a flood of requests costs one render per "
            "window (Prometheus scrapes every 5-30 s and never sees the difference); 0 renders every request"
        ),
        allowed="0 or a number > 0",
    )
    max_requests_per_second: float = setting(
        20.0,
        check=at_least(0, 1_000_000),
        doc=(
            "the endpoint reads and answers at most this many requests a second (bursts of up to a second's "
            "worth), counting an answer that took more than 1 ms of CPU as one request per ms, at most 10 "
            "more (a `/metrics` render ~2, the live page's whole history ~30, capped at 11); a request over "
            "the budget waits its turn before it is read, it is never refused. Requests for anything but "
            "`/metrics` (the live page, its series, `/debug/stacks`, a 404) also wait in a second budget of a"
            " quarter of this rate, which their answers' work is charged to: a flood of page requests cannot "
            "delay the scrapes. Every request costs the training process ~0.2 ms of CPU (~0.33 ms on a new "
            "connection): the budget bounds what a flood, a misconfigured scraper or a load test can take "
            "from training, whatever the request rate: at 20 a second, ~0.4% of a core kept-alive, ~0.7% on "
            "new connections (a TLS handshake, which costs a few ms of CPU, takes a request's share of the "
            "budget too). 20 is far above what Prometheus (one scrape per 5-30 s per server), the live page "
            "(one request per 2 s per open tab) and `ms_exporter top` need; 0 serves every request as it "
            "comes ([reliability.md](reliability.md) measures both)"
        ),
        allowed="0 or a number > 0, at most 1,000,000",
        shown="`20`",
    )

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
