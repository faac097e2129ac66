"""MonitorConfig: the top-level keys of a monitor_config, each with its check, and its sections."""

from __future__ import annotations

import dataclasses
import ipaddress
import math
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

from ms_exporter.config import part_sections
from ms_exporter.config.article_keys import STRATEGIES
from ms_exporter.config.checks import (
    _MAX_LABEL_VALUE,
    MAX_SECONDS,
    MAX_STEPS,
    Say,
    _Bad,
    _close,
    _is_number,
    at_least,
    boolean,
    choice,
    class_names,
    file_path,
    greater_than,
    int_in,
    mapping,
    names,
    optional,
    section,
    setting,
    text,
)
from ms_exporter.config.sections import (
    ActionsConfig,
    ActivationsConfig,
    DataQualityConfig,
    DivergenceConfig,
    FailSlowConfig,
    FlopsConfig,
    GoodputConfig,
    GradNormConfig,
    HangConfig,
    HardwareConfig,
    LayerNormConfig,
    OtlpConfig,
    PushgatewayConfig,
    TensorBoardConfig,
    UpdateRatioConfig,
    WandbConfig,
    WebConfig,
    sections_of,
)
from ms_exporter.config.vocabulary import (
    LOG_LEVELS,
    RESERVED_LABELS,
    RUN_ID_CHARACTERS,
    SERIES_PROFILES,
    WATCH_GROUP,
    WATCHABLE,
)
from ms_exporter.config.walker import shown_value
from ms_exporter.core import registry
from ms_exporter.core.import_path import load_class
from ms_exporter.core.redaction import REDACTED, url_for_logs

# Outside the 9100-9999 range that the Prometheus project hands out to exporters (9100 node, 9400 DCGM,
# 9464 OpenTelemetry ...), below Linux's ephemeral range (32768+), so that base + 7 local ranks stay clear.
DEFAULT_PORT = 19420

# Host memory is read at least this often (psutil, ~20 µs on the sampler thread): the growth slope then spans
# `memory_window` x 5 s, and a leak is seen growing within seconds.
MEMORY_SAMPLE_SECONDS = 5.0

_LABEL_NAME = re.compile(r"^[a-zA-Z_][a-zA-Z0-9_]*$")
_RUN_ID = re.compile(rf"^[A-Za-z0-9][{RUN_ID_CHARACTERS}]{{0,127}}$")


@dataclass(frozen=True)
class Bound:
    """One warn_on_value entry: the value must stay at or below `max`, or at or above `min`."""

    direction: Literal["max", "min"]
    value: float
    absolute: bool = False  # compare |value|: a drift ratio breaches in either direction

    def breached(self, observed: float) -> bool:
        if self.absolute:
            observed = abs(observed)
        if self.direction == "max":
            return observed > self.value or math.isnan(observed)
        return observed < self.value


# -- checks for one top-level key each ----------------------------------------------------------------------
def _base_port(value: Any) -> int:
    port: int = int_in(0, 65535)(value)
    if port > 65535 - 7:  # base + local rank must stay a valid port on an 8-rank node
        raise _Bad(
            f"must be 0 (any free port) or a base port from 1 to {65535 - 7}: a higher one leaves no room "
            "for base + local rank (up to +7)",
            value,
        )
    return port


def _bind_address(value: Any) -> str:
    address: str = text()(value)
    if address != "localhost":
        try:
            ipaddress.ip_address(address)
        except ValueError:
            raise _Bad("must be an IP address such as 127.0.0.1, 0.0.0.0 or ::, or localhost", value) from None
    return address


def _watch(metric: Any, spec: Any) -> tuple[str, Bound]:
    """One warn_on_value entry: a watchable metric and its bound."""
    if metric not in WATCHABLE:
        hint = f" (did you mean '{close}'?)" if (close := _close(metric, list(WATCHABLE))) else ""
        raise _Bad(f"unknown metric '{metric}'{hint}; allowed: {list(WATCHABLE)}", {metric: spec})
    bound = _bound(spec, WATCHABLE[metric])
    if bound is None:
        raise _Bad(
            f"bound for '{metric}' must be a number (a {WATCHABLE[metric]} bound), {{max: x}} or {{min: y}}", spec
        )
    return metric, bound


def _bound(spec: Any, default_direction: Literal["max", "min"]) -> Bound | None:
    if isinstance(spec, Mapping) and len(spec) == 1:
        ((direction, number),) = spec.items()
        if direction in ("max", "min") and _is_number(number):
            return Bound(direction, float(number))
        return None
    if _is_number(spec):
        return Bound(default_direction, float(spec))
    return None


def _tag(name: Any, tag: Any) -> tuple[str, str]:
    if not isinstance(name, str) or not _LABEL_NAME.match(name) or name.startswith("__"):
        raise _Bad(f"tag name {name!r} is not a valid Prometheus label name ([a-zA-Z_][a-zA-Z0-9_]*)", {name: tag})
    if name in RESERVED_LABELS:
        raise _Bad(f"tag name '{name}' is set by the exporter itself; reserved: {sorted(RESERVED_LABELS)}", {name: tag})
    if isinstance(tag, bool) or not isinstance(tag, (str, int, float)):
        raise _Bad(f"tag '{name}' must be a string or number", {name: tag})
    if len(str(tag)) > _MAX_LABEL_VALUE:
        raise _Bad(f"tag '{name}' must be at most {_MAX_LABEL_VALUE} characters", {name: tag})
    return name, str(tag)


def _runbook_url(value: Any) -> str:
    if not (isinstance(value, str) and re.match(r"^https?://[^/\s]+\S*$", value) and "#" not in value):
        raise _Bad(
            "must be the http(s) URL of the runbook page, without a #fragment (each alert adds its own), "
            "such as https://github.com/ORG/REPO/blob/main/docs/alerts.md",
            value,
        )
    return value


def _run_id(value: Any) -> str:
    if not isinstance(value, str) or not _RUN_ID.match(value):
        raise _Bad(
            "must be 1 to 128 letters, digits and '_.:-', starting with a letter or digit (it names the "
            "run's state file in save_dir)",
            value,
        )
    return value


def _jsonl_name(value: Any) -> str:
    if not isinstance(value, str) or not _RUN_ID.match(value) or value.startswith("."):
        raise _Bad(
            "must be a file name stem of 1 to 128 letters, digits and '_.:-', starting with a letter or digit "
            "(the JSON Lines files are save_dir/<jsonl_name>-rank<N>.jsonl)",
            value,
        )
    return value


# detail_ranks: at most this many ranks keep full detail under series_profile: large_job (one replica of a very large
# job is far fewer ranks; a longer list is a job that wants `full`).
MAX_DETAIL_RANKS = 4096
MAX_RANK = 10**7


def _detail_ranks(value: Any) -> tuple[int, ...]:
    """A rank or a list of ranks (global ranks, 0 to MAX_RANK), sorted, each once."""
    items = value if isinstance(value, (list, tuple)) else [value]
    if len(items) > MAX_DETAIL_RANKS or not all(
        isinstance(item, int) and not isinstance(item, bool) and 0 <= item <= MAX_RANK for item in items
    ):
        raise _Bad(
            f"must be a global rank or a list of at most {MAX_DETAIL_RANKS} of them (integers from 0 to {MAX_RANK})",
            value,
        )
    return tuple(sorted(set(items)))


STRATEGY_KEYS = ("name", "config", "every_n_steps")


def _strategies(value: Any) -> tuple[dict[str, Any], ...]:
    """A list of the user's own strategies: {name: package.module.Class, config: {...}, every_n_steps: n}. The name is
    imported here, so that a typo is a ConfigError at construction (and in check-config), not a failure later."""
    if value is None:
        return ()
    if not isinstance(value, (list, tuple)):
        raise _Bad("must be a list of {name: package.module.Class, config: {...}}", value)
    specs = []
    for index, spec in enumerate(value):
        if not isinstance(spec, Mapping) or not isinstance(spec.get("name"), str):
            raise _Bad(f"item {index} must be a mapping with a `name` (an import path) and a `config`", spec)
        extra = sorted(set(map(str, spec)) - set(STRATEGY_KEYS))
        if extra:
            raise _Bad(f"item {index}: unknown key(s) {', '.join(extra)}; allowed: {', '.join(STRATEGY_KEYS)}", spec)
        config = spec.get("config") or {}
        if not isinstance(config, Mapping):
            raise _Bad(f"item {index}: `config` must be a mapping", spec)
        every = spec.get("every_n_steps")
        if every is not None:
            every = int_in(1, MAX_STEPS)(every)
        name = spec["name"]
        if "." not in name and ":" not in name:
            raise _Bad(
                f"item {index}: {shown_value(name)} is neither a built-in strategy ({', '.join(STRATEGIES)}) nor an "
                "import path of your own (package.module.Class)",
                spec,
            )
        try:
            load_class(name, "on_step_end")  # imported, never run: core/import_path.py says what a path may name
        except ValueError as exc:
            raise _Bad(f"item {index}: {shown_value(name)}: {exc}", spec) from None
        specs.append({"name": name, "config": dict(config), "every_n_steps": every})
    return tuple(specs)


@dataclass(frozen=True)
class MonitorConfig:
    """The effective configuration. Field names are the YAML keys and the MS_EXPORTER_<KEY> suffixes."""

    enable: bool = setting(
        True,
        check=boolean(),
        doc=(
            "`false` makes the callback a no-op that opens no port and starts no thread; it says so once at "
            "construction (an INFO line naming where the switch was set)"
        ),
        allowed="bool",
    )
    backend: tuple[str, ...] = setting(
        ("prometheus",),
        check=names(registry.selectable_backends, at_least_one=True),
        doc=(
            "where numbers go: the rank's `/metrics` endpoint, OTLP export through the OpenTelemetry SDK "
            "(section `otlp` below; needs `pip install 'ms-exporter[otlp]'`), JSON Lines files, TensorBoard "
            "event files (section `tensorboard` below; needs `pip install 'ms-exporter[tensorboard]'`), a W&B"
            " run (section `wandb` below; needs `pip install 'ms-exporter[wandb]'`), one progress line "
            "through logging every `interval` seconds (`step 1200 epoch 3 loss 2.314 lr 0.0001 tokens/s 10240"
            " step 21.3 ms`, an INFO record of the `ms_exporter` logger: the monitor_config article's minimal"
            " monitor; without `console` the same line comes on rank 0 alone while `log_level` shows INFO: "
            "[articles.md](articles.md#its-check-that-it-works-the-progress-line))"
        ),
        allowed="any of `prometheus`, `otlp`, `local`, `tensorboard`, `wandb`, `console` (a single string works)",
    )
    project: str = setting(
        "default",
        check=text(label_value=True),
        doc="the `project` label on every series",
        allowed="non-empty string, ≤ 128 characters",
    )
    # The floor: 1e-9 s wrote 8 MB/s of JSON Lines and spun the sampler thread.
    interval: float = setting(
        30.0,
        check=at_least(0.05, MAX_SECONDS),
        doc=(
            "JSON Lines snapshot period (the queued step and event records reach the file at least every 5 s "
            "whatever `interval` says, on the writer's thread: a `kill -9` loses at most 5 s of them), and "
            "memory sampling period up to 5 s (memory is read every `min(interval, 5)` s, so that a leak "
            "pages within 2 minutes); the floor keeps it to 20 snapshots and memory samples a second"
        ),
        allowed="number of at least 0.05 (seconds), at most a week",
        shown="`30`",
    )
    save_dir: str = setting(
        "./monitor_output",
        check=file_path(),
        doc="where `local` writes `metrics-rank{r}.jsonl`",
        allowed="a path: non-empty, at most 4096 characters, no control character (NUL, newline, escape)",
    )
    port: int = setting(
        DEFAULT_PORT,
        check=_base_port,
        doc="base port; rank `r` serves on `port + local_rank`; `0` = any free port",
        allowed="0-65528",
    )
    bind_address: str = setting(
        "127.0.0.1",
        check=_bind_address,
        doc="loopback by default, so nothing is exposed by accident; use `0.0.0.0` in containers",
        allowed="an IP address or `localhost`",
    )
    metrics: tuple[str, ...] = setting(
        factory=registry.metric_groups,
        check=names(registry.metric_groups),
        doc=(
            "which groups of series to export ([metrics.md](metrics.md)); step, epoch, heartbeat and the "
            "exporter's own series are always on"
        ),
        allowed=(
            "`loss`, `lr`, `step_time`, `samples_per_second`, `tokens_per_second`, `memory_usage`, "
            "`global_rank`, `eval`"
        ),
        shown="all groups",
    )
    loss_window: int = setting(
        50, check=int_in(1, 1_000_000), doc="steps in `mindspore_train_loss_smoothed`", allowed="integer 1-1,000,000"
    )
    warn_on_value: Mapping[str, Bound] = setting(
        factory=dict,
        check=mapping(f"metric to bound, metrics from {list(WATCHABLE)}", _watch),
        doc=(
            "a bare number is a max for loss-like values and a min for throughput; a breach logs one WARNING "
            "per episode and counts in `mindspore_train_threshold_breaches_total{metric}`. The watched "
            "metric's group must be in `metrics`."
        ),
        allowed=(
            "`{metric: number}` or `{metric: {max: x}}` / `{metric: {min: y}}` for `loss`, `loss_smoothed`, "
            "`tokens_per_second`, `samples_per_second`, `memory_growth_ratio`"
        ),
    )
    tags: Mapping[str, str] = setting(
        factory=dict,
        check=mapping("label name to value", _tag),
        doc=(
            "extra labels on `mindspore_train_info` (not on every series, to keep cardinality and label "
            "clashes out). Reserved: every label of a family in `core/catalogue.py` (`rank`, `phase`, "
            "`layer`, `kind` ...: a `group_left` join onto those series would clash) and `le`, `job`, "
            "`instance`; the error lists them"
        ),
        allowed=(
            "label-name keys (`[a-zA-Z_][a-zA-Z0-9_]*`, not one the exporter sets), string or number values ≤"
            " 128 characters"
        ),
    )
    log_level: str = setting(
        "INFO",
        check=choice(*LOG_LEVELS, any_case=True),
        doc=(
            "level of the `ms_exporter` logger; `WARNING` and above also turn off the progress line rank 0 "
            "logs every `interval`"
        ),
        allowed="`DEBUG`, `INFO`, `WARNING`, `ERROR`, `CRITICAL` (any case)",
    )
    # Keys below are not in MindSpore Transformers' vocabulary.
    warmup_steps: int = setting(
        10,
        check=int_in(0, MAX_STEPS),
        doc=(
            "steps before the memory baseline is taken and throughput bounds are checked (graph compilation "
            "makes the first steps slow and allocation-heavy)"
        ),
        allowed="integer 0-10^12",
    )
    warn_warmup_steps: int = setting(
        50,
        check=int_in(0, MAX_STEPS),
        doc=(
            "steps before any `warn_on_value` bound (and the `grad_norm` and `layernorm` thresholds) is "
            "watched, loss included: the monitor_config article trains a few tens of steps before trusting a "
            "bound, since a warming-up loss is high. A breach warns once; a value crossing back and forth is "
            "one episode until it has stayed inside its bound for 10 checks"
        ),
        allowed="integer 0-10^12",
    )
    max_file_mb: float = setting(
        100.0,
        check=greater_than(0, 1024 * 1024),
        doc="JSON Lines file size at which it rotates",
        allowed="number > 0, at most 1,048,576",
        shown="`100`",
    )  # a TiB
    max_files: int = setting(
        5, check=int_in(1, 1000), doc="rotated JSON Lines files kept besides the live one", allowed="integer 1-1,000"
    )
    jsonl_name: str = setting(
        "metrics",
        check=_jsonl_name,
        doc=(
            "the JSON Lines files' name: `save_dir/<jsonl_name>-rank<r>.jsonl` (the strategy-container "
            "article's `log_path` sets it)"
        ),
        allowed="1-128 letters, digits and `_.:-`, starting with a letter or digit",
    )
    strategies: tuple[Mapping[str, Any], ...] = setting(
        (),
        check=_strategies,
        doc=(
            "measurements of your own ([strategies.md](strategies.md)); the strategy-container article's "
            "built-in names (`GradNormStrategy` ...) are read as our keys instead "
            "([articles.md](articles.md))"
        ),
        allowed="a list of `{name: package.module.Class, config: {...}, every_n_steps: n}`; the class must import",
    )
    attention_mask_column: str = setting(
        "attention_mask",
        check=text(),
        doc="dataset column whose non-zero entries are counted as tokens",
        allowed="string",
    )
    input_ids_column: str = setting(
        "input_ids",
        check=text(),
        doc="dataset column whose shape gives batch × sequence length when there is no mask",
        allowed="string",
    )
    memory_window: int = setting(
        10, check=int_in(2, 10_000), doc="memory samples in the growth-rate fit", allowed="integer 2-10,000"
    )
    pure_lr_schedules: tuple[str, ...] = setting(
        (),
        check=class_names(),
        doc=(
            "`LearningRateSchedule` classes of your own whose `construct` keeps no state, which the monitor "
            "may therefore evaluate to export the LR; MindSpore's own schedules need no naming, any other is "
            "never called (docs/metrics.md, learning rate)"
        ),
        allowed="a class name or a list of them",
    )
    grad_norm: GradNormConfig = section(GradNormConfig)
    layernorm: LayerNormConfig = section(LayerNormConfig)
    weight_norm: bool = setting(
        False, check=boolean(), doc="also export the weight norms of the `grad_norm.layers` layers", allowed="bool"
    )
    update_ratio: UpdateRatioConfig = section(UpdateRatioConfig)
    activations: ActivationsConfig = section(ActivationsConfig)
    file_sd_dir: str | None = setting(
        None,
        check=optional(file_path()),
        doc=(
            "write this rank's Prometheus file_sd target there (`ms-exporter-<project>-rank<r>.json`, the "
            "real host:port and `__meta_ms_exporter_*` labels), removed on close, at exit and on "
            "SIGTERM/SIGINT; `deploy/prometheus/prometheus.yml` discovers ranks this way (with "
            "`/tmp/ms-exporter-targets`)"
        ),
        allowed="a directory (a path, as `save_dir`)",
        shown="none",
    )
    runbook_url: str | None = setting(
        None,
        check=optional(_runbook_url),
        doc=(
            "the page serving docs/alerts.md: `ms-exporter rules --config` and `ms-exporter kubernetes "
            "--config` make every alert's `runbook_url` this URL plus `#<alert name in lower case>` "
            "([alerts.md](alerts.md#runbook-links)); `--runbook-url` overrides it"
        ),
        allowed="an http(s) URL without `#`",
        shown="none",
    )
    otlp: OtlpConfig = section(OtlpConfig)
    pushgateway: PushgatewayConfig = section(PushgatewayConfig)
    web: WebConfig = section(WebConfig)
    actions: ActionsConfig = section(ActionsConfig)
    hang: HangConfig = section(HangConfig)
    run_id: str | None = setting(
        None,
        check=optional(_run_id),
        doc=(
            "which run this process belongs to: processes of one run share the ledger's totals and count "
            "restarts. Derived: the project and 8 hex digits of save_dir's absolute path. "
            "`MS_EXPORTER_RUN_ID` sets it too (a scheduler's job id is a good one)"
        ),
        allowed="1 to 128 letters, digits and `_.:-`, starting with a letter or digit",
        shown="derived",
    )
    goodput: GoodputConfig = section(GoodputConfig)
    failslow: FailSlowConfig = section(FailSlowConfig)
    divergence: DivergenceConfig = section(DivergenceConfig)
    flops: FlopsConfig = section(FlopsConfig)
    tensorboard: TensorBoardConfig = section(TensorBoardConfig)
    wandb: WandbConfig = section(WandbConfig)
    hardware: HardwareConfig = section(HardwareConfig)
    data_quality: DataQualityConfig = section(DataQualityConfig)
    # Each profile's series: sinks/shared/series_budget.py.
    series_profile: str = setting(
        "full",
        check=choice(*SERIES_PROFILES),
        doc=(
            "which series a rank exposes: `full`, everything; `large_job`, for jobs of thousands of ranks, "
            "every series an alert or recording rule reads on every rank (a histogram among them as its "
            "`_sum` and `_count`), and the per-layer, histogram-bucket and diagnostic series on "
            "`detail_ranks` only. Applies to `/metrics`, the pushgateway and OTLP alike; what it keeps, what "
            "it costs and which alerts fire where: [scaling.md](scaling.md#very-large-jobs)"
        ),
        allowed="`full` or `large_job`",
    )
    detail_ranks: tuple[int, ...] = setting(
        (0,),
        check=_detail_ranks,
        doc=(
            "the ranks that keep everything under `series_profile: large_job` (rank 0, or one replica group "
            "where ranks hold different layers); ignored under `full`"
        ),
        allowed="a global rank or a list of up to 4,096 of them",
    )

    def _cross_check(self, say: Say) -> None:
        for metric in self.warn_on_value:
            group = WATCH_GROUP[metric]
            if group not in self.metrics:
                say(
                    f"warn_on_value.{metric}",
                    f"watches a metric that is switched off; add '{group}' to monitor_config.metrics or drop the bound",
                )

    @property
    def memory_interval(self) -> float:
        """Seconds between memory samples: `interval`, but at most MEMORY_SAMPLE_SECONDS, so that a leak pages in
        minutes (docs/alerts.md#how-fast-an-alert-arrives) whatever the JSON Lines flush period."""
        return min(self.interval, MEMORY_SAMPLE_SECONDS)

    def wants(self, group: str) -> bool:
        return group in self.metrics

    def all_bounds(self) -> dict[str, Bound]:
        """warn_on_value plus the thresholds of the grad_norm and layernorm sections, keyed by watched metric."""
        bounds = dict(self.warn_on_value)
        if self.grad_norm.enable and self.grad_norm.threshold is not None:
            bounds["grad_norm"] = Bound("max", self.grad_norm.threshold)
        if self.layernorm.enable and self.layernorm.drift_threshold is not None:
            bounds["layernorm_scale_drift_ratio"] = Bound("max", self.layernorm.drift_threshold, absolute=True)
        return bounds

    def redacted(self) -> dict[str, Any]:
        """to_dict() with secrets (OTLP header values, password hashes, URL passwords) replaced, for printing and
        logging."""
        out = self.to_dict()
        for section_name, key in (("otlp", "headers"), ("web", "basic_auth_users")):
            if out[section_name][key]:
                out[section_name][key] = {name: REDACTED for name in out[section_name][key]}
        for section_name, key in (("otlp", "endpoint"), ("pushgateway", "url")):
            if out[section_name][key]:
                out[section_name][key] = url_for_logs(out[section_name][key])
        return out

    def section(self, key: str) -> Any:
        """The config section of the part named `key`, one it declares beside its class (config/part_sections.py):
        as this config was given it, else its defaults."""
        given = part_sections.given(self)
        return given[key] if key in given else part_sections.section_class(key)()

    def to_dict(self) -> dict[str, Any]:
        """Plain data, the shape a YAML file would have (used by `ms-exporter check-config`); the parts' own
        sections it was given come last."""
        plain: dict[str, Any] = _plain(self)
        plain.update({key: _plain(value) for key, value in part_sections.given(self).items()})
        return plain

    def __eq__(self, other: object) -> bool:
        if other.__class__ is not self.__class__:
            return NotImplemented
        fields = dataclasses.fields(self)
        return all(getattr(self, f.name) == getattr(other, f.name) for f in fields) and part_sections.given(
            self
        ) == part_sections.given(other)


def _plain(value: Any) -> Any:
    """Sections as mappings, tuples as lists, a Bound as {max: x} or {min: y}."""
    if isinstance(value, Bound):
        return {value.direction: value.value}
    if dataclasses.is_dataclass(value):
        return {f.name: _plain(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if isinstance(value, tuple):
        return [_plain(item) for item in value]
    if isinstance(value, Mapping):
        return {key: _plain(item) for key, item in value.items()}
    return value


KEYS = tuple(f.name for f in dataclasses.fields(MonitorConfig))


# The top-level sections by key (grad_norm, tensorboard, ...), as MonitorConfig declares them.
SECTIONS = sections_of(MonitorConfig)
