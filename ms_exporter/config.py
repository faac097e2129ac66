"""YAML, dict, environment and keyword configuration -> one frozen MonitorConfig; every problem in one ConfigError."""

from __future__ import annotations

import dataclasses
import difflib
import importlib.util
import ipaddress
import math
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import yaml

from ms_exporter.thresholds import DEFAULTS

ENV_PREFIX = "MS_EXPORTER_"

# Outside the 9100-9999 range that the Prometheus project hands out to exporters (9100 node, 9400 DCGM,
# 9464 OpenTelemetry ...), below Linux's ephemeral range (32768+), so that base + 7 local ranks stay clear.
DEFAULT_PORT = 19420

BACKENDS = ("prometheus", "otlp", "local")
OTLP_PROTOCOLS = ("grpc", "http/protobuf")
PUSH_EVENTS = ("train_end", "interval")
# What check-config prints instead of a secret.
REDACTED = "<redacted>"

# Names allowed in `metrics`: each switches on one group of series (docs/metrics.md lists them).
METRIC_GROUPS = (
    "loss",
    "lr",
    "step_time",
    "samples_per_second",
    "tokens_per_second",
    "memory_usage",
    "global_rank",
    "eval",
)

# warn_on_value keys and which way a bare number bounds them.
WATCHABLE: dict[str, Literal["max", "min"]] = {
    "loss": "max",
    "loss_smoothed": "max",
    "tokens_per_second": "min",
    "samples_per_second": "min",
    "memory_growth_ratio": "max",
}

# The `metrics` group that must be on for a warn_on_value key to see values.
WATCH_GROUP = {"loss": "loss", "loss_smoothed": "loss", "tokens_per_second": "tokens_per_second",
               "samples_per_second": "samples_per_second", "memory_growth_ratio": "memory_usage"}

LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")

# Labels the exporter sets itself; a tag may not reuse them.
RESERVED_LABELS = frozenset(
    {
        "rank",
        "project",
        "world_size",
        "local_rank",
        "node",
        "device_target",
        "mindspore_version",
        "exporter_version",
        "kind",
        "group",
        "name",
        "metric",
        "hook",
        "component",
        "le",
        "job",
        "instance",
    }
)
_LABEL_NAME = re.compile(r"^[a-zA-Z_][a-zA-Z0-9_]*$")
_MAX_LABEL_VALUE = 128


class ConfigError(ValueError):
    """Raised at construction with every problem found; `problems` holds them one per item."""

    def __init__(self, problems: list[str]) -> None:
        self.problems = list(problems)
        lines = "\n  - ".join(self.problems)
        super().__init__(f"invalid monitor_config ({len(self.problems)} problem(s)):\n  - {lines}")


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


@dataclass(frozen=True)
class GradNormConfig:
    """monitor_config.grad_norm: gradient norms read from the real training step."""

    enable: bool = True
    every_n_steps: int = 10
    layers: tuple[str, ...] = ()  # regexes matched (from the start) against layer names
    top_k: int = 5
    max_series: int = 20
    threshold: float | None = DEFAULTS.grad_norm_high
    clip: float | None = None


@dataclass(frozen=True)
class LayerNormConfig:
    """monitor_config.layernorm: statistics of every LayerNorm scale (gamma)."""

    enable: bool = True
    # Reading every LayerNorm scale costs ~0.3 ms on the demo model: every 25 steps keeps it near 10 µs a step
    # and still gives the 100-step drift window four samples.
    every_n_steps: int = 25
    window: int = 100
    drift_threshold: float | None = DEFAULTS.layernorm_drift
    # Three series per scale: a deep model (two norms a block) would otherwise be a rank's largest family.
    max_layers: int = 24


@dataclass(frozen=True)
class OtlpConfig:
    """monitor_config.otlp: the `otlp` backend. None leaves a setting to the standard OTEL_* variables."""

    endpoint: str | None = None
    protocol: str | None = None  # grpc or http/protobuf; None: OTEL_EXPORTER_OTLP_(METRICS_)PROTOCOL, else grpc
    interval: float | None = None  # seconds between exports; None: OTEL_METRIC_EXPORT_INTERVAL, else 60
    timeout: float = 10.0  # seconds one export may take, retries included
    headers: Mapping[str, str] | None = None
    insecure: bool | None = None


@dataclass(frozen=True)
class PushgatewayConfig:
    """monitor_config.pushgateway: push this rank's series to a Pushgateway, grouped by project and rank."""

    url: str | None = None  # None: no pushes
    on: tuple[str, ...] = ("train_end",)
    interval: float = 30.0  # seconds between pushes when `on` has interval
    timeout: float = 5.0
    job: str = "mindspore_training"


EARLY_STOP_UNITS = ("epoch", "step")


@dataclass(frozen=True)
class EarlyStopConfig:
    """monitor_config.actions.early_stop: stop when the smoothed loss stops improving, or on non-finite losses."""

    enable: bool = False
    patience: int = 5  # evaluations without improvement
    min_delta: float = 0.0  # an improvement must beat the best smoothed loss by more than this
    unit: str = "epoch"  # what one evaluation is: an epoch end or a step
    max_nonfinite: int | None = 3  # non-finite losses in a row that stop at once; null: never


@dataclass(frozen=True)
class LrBackoffConfig:
    """monitor_config.actions.lr_backoff: scale the learning rate down on a rising loss or a large gradient norm."""

    enable: bool = False
    factor: float = 0.5
    rising_steps: int = 20
    on_grad_norm: bool = True  # also back off when the gradient norm passes grad_norm.threshold
    cooldown: int = 100  # steps after a back-off before the next one
    min_lr: float = 0.0


@dataclass(frozen=True)
class SnapshotConfig:
    """monitor_config.actions.snapshot: a checkpoint at the first anomaly of each episode."""

    enable: bool = False
    spike_factor: float = 3.0  # a loss above this many times the smoothed loss is a spike
    max_snapshots: int = 3
    quiet_steps: int = 10  # steps without an anomaly that end an episode


@dataclass(frozen=True)
class ActionsConfig:
    """monitor_config.actions: what the monitor may do to the run, each off by default."""

    early_stop: EarlyStopConfig = field(default_factory=EarlyStopConfig)
    lr_backoff: LrBackoffConfig = field(default_factory=LrBackoffConfig)
    snapshot: SnapshotConfig = field(default_factory=SnapshotConfig)

    @property
    def any(self) -> bool:
        return self.early_stop.enable or self.lr_backoff.enable or self.snapshot.enable


ACTION_SECTIONS = {"early_stop": EarlyStopConfig, "lr_backoff": LrBackoffConfig, "snapshot": SnapshotConfig}


CLIENT_AUTH_TYPES = ("NoClientCert", "VerifyClientCertIfGiven", "RequireAndVerifyClientCert")
_BCRYPT_HASH = re.compile(r"^\$2[aby]\$\d\d\$[./A-Za-z0-9]{53}$")
_SHA256_HASH = re.compile(r"^sha256:[0-9a-f]{64}$")


@dataclass(frozen=True)
class WebConfig:
    """monitor_config.web: who may read the endpoint, in the spirit of Prometheus' web configuration file."""

    config_file: str | None = None  # a Prometheus web config file (tls_server_config, basic_auth_users)
    tls_cert_file: str | None = None
    tls_key_file: str | None = None
    client_ca_file: str | None = None
    client_auth_type: str = "NoClientCert"
    basic_auth_users: Mapping[str, str] = field(default_factory=dict)  # user -> bcrypt or sha256:<hex> hash
    cache_seconds: float = 0.25  # a rendered page is reused this long: a flood of requests costs one render
    # Requests read and answered per second, at most (0: no limit). Past it a request waits its turn before it
    # is read: a flood costs the training process this many requests' Python a second, whatever the load.
    max_requests_per_second: float = 20.0

    @property
    def tls(self) -> bool:
        return self.tls_cert_file is not None


SECTIONS = {"grad_norm": GradNormConfig, "layernorm": LayerNormConfig, "otlp": OtlpConfig,
            "pushgateway": PushgatewayConfig, "web": WebConfig, "actions": ActionsConfig}


@dataclass(frozen=True)
class MonitorConfig:
    """The effective configuration. Field names are the YAML keys and the MS_EXPORTER_<KEY> suffixes."""

    enable: bool = True
    backend: tuple[str, ...] = ("prometheus",)
    project: str = "default"
    interval: float = 30.0
    save_dir: str = "./monitor_output"
    port: int = DEFAULT_PORT
    bind_address: str = "127.0.0.1"
    metrics: tuple[str, ...] = METRIC_GROUPS
    loss_window: int = 50
    warn_on_value: Mapping[str, Bound] = field(default_factory=dict)
    tags: Mapping[str, str] = field(default_factory=dict)
    log_level: str = "INFO"
    # Keys below are not in MindSpore Transformers' vocabulary; docs/configuration.md explains each.
    warmup_steps: int = 10
    max_file_mb: float = 100.0
    max_files: int = 5
    attention_mask_column: str = "attention_mask"
    input_ids_column: str = "input_ids"
    memory_window: int = 10
    grad_norm: GradNormConfig = field(default_factory=GradNormConfig)
    layernorm: LayerNormConfig = field(default_factory=LayerNormConfig)
    weight_norm: bool = False
    file_sd_dir: str | None = None
    otlp: OtlpConfig = field(default_factory=OtlpConfig)
    pushgateway: PushgatewayConfig = field(default_factory=PushgatewayConfig)
    web: WebConfig = field(default_factory=WebConfig)
    actions: ActionsConfig = field(default_factory=ActionsConfig)

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
        """to_dict() with secrets (OTLP header values) replaced, for printing and logging."""
        out = self.to_dict()
        for section, key in (("otlp", "headers"), ("web", "basic_auth_users")):
            if out[section][key]:
                out[section][key] = {name: REDACTED for name in out[section][key]}
        return out

    def to_dict(self) -> dict[str, Any]:
        """Plain data, the shape a YAML file would have (used by `ms-exporter check-config`)."""
        out: dict[str, Any] = {}
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            if isinstance(value, tuple):
                value = list(value)
            elif f.name == "warn_on_value":
                value = {k: {b.direction: b.value} for k, b in value.items()}
            elif f.name in SECTIONS:
                value = {k: list(v) if isinstance(v, tuple) else dict(v) if isinstance(v, Mapping) else v
                         for k, v in dataclasses.asdict(value).items()}  # nested sections become dicts too
            elif isinstance(value, Mapping):
                value = dict(value)
            out[f.name] = value
        return out


KEYS = tuple(f.name for f in dataclasses.fields(MonitorConfig))


def load_config(source: str | os.PathLike[str] | Mapping[str, Any] | MonitorConfig | None = None,
                **overrides: Any) -> MonitorConfig:
    """Build the effective config: defaults < file/dict < MS_EXPORTER_* environment < keyword overrides."""
    problems: list[str] = []
    raw: dict[str, Any] = {}
    origin: dict[str, str] = {}
    if isinstance(source, MonitorConfig):
        raw.update(source.to_dict())
    elif isinstance(source, Mapping):
        raw.update(_unwrap(dict(source), "the given dict", problems))
    elif source is not None:
        raw.update(_read_file(Path(source), problems))
    for key in raw:
        origin[key] = "monitor_config"
    for key, text in _env_values().items():
        _merge(raw, key, _parse_env(key, text))
        origin[key] = f"environment variable {ENV_PREFIX}{key.upper()}"
    for key, value in overrides.items():
        _merge(raw, key, value)
        origin[key] = f"keyword argument {key}="
    config = _validate(raw, origin, problems)
    if problems or config is None:
        raise ConfigError(problems)
    return config


def _merge(raw: dict[str, Any], key: str, value: Any) -> None:
    """A later source replaces a key; for the nested sections it replaces the sub-keys it names."""
    if key in SECTIONS and isinstance(raw.get(key), Mapping) and isinstance(value, Mapping):
        raw[key] = {**raw[key], **value}
    else:
        raw[key] = value


def _read_file(path: Path, problems: list[str]) -> dict[str, Any]:
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, ValueError) as exc:  # ValueError: not UTF-8, or a NUL byte in the path
        problems.append(f"cannot read config file {str(path)!r}: {getattr(exc, 'strerror', None) or exc}")
        return {}
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        problems.append(f"{path} is not valid YAML: {exc}")
        return {}
    if data is None:
        return {}
    raw = _unwrap(data, str(path), problems)
    if "pushgateway" in raw:
        raw["pushgateway"] = _yaml_on_key(raw["pushgateway"])
    return raw


def _yaml_on_key(section: Any) -> Any:
    """YAML 1.1 (PyYAML) reads a bare `on:` key as the boolean true: give pushgateway.on its name back."""
    if isinstance(section, Mapping) and any(key is True for key in section):
        return {"on" if key is True else key: value for key, value in section.items()}
    return section


def _unwrap(data: Any, where: str, problems: list[str]) -> dict[str, Any]:
    if not isinstance(data, Mapping):
        problems.append(f"{where}: expected a mapping with a monitor_config key (or a bare mapping of its keys), "
                        f"got {type(data).__name__}")
        return {}
    if "monitor_config" in data:
        extra = [k for k in data if k != "monitor_config"]
        if extra:
            problems.append(f"{where}: only the top-level key monitor_config is read; "
                            f"unexpected {sorted(map(str, extra))}")
        inner = data["monitor_config"]
        if inner is None:
            return {}
        if not isinstance(inner, Mapping):
            problems.append(f"{where}: monitor_config must be a mapping, got {type(inner).__name__}")
            return {}
        return {str(k): v for k, v in inner.items()}
    return {str(k): v for k, v in data.items()}


def _env_values() -> dict[str, str]:
    values = {}
    for key in KEYS:
        text = os.environ.get(ENV_PREFIX + key.upper())
        if text is not None:
            values[key] = text
    return values


def _validate(raw: dict[str, Any], origin: dict[str, str], problems: list[str]) -> MonitorConfig | None:
    checker = _Checker(origin, problems)
    values: dict[str, Any] = {}
    for key in raw:
        if key not in KEYS:
            close = difflib.get_close_matches(key, KEYS, n=1)
            hint = f"did you mean '{close[0]}'? " if close else ""
            problems.append(f"monitor_config.{key}: unknown key ({origin.get(key, 'monitor_config')}); {hint}"
                            f"allowed keys: {', '.join(KEYS)}")
    for key in KEYS:
        if key in raw:
            value = checker.check(key, raw[key])
            if value is not _INVALID:
                values[key] = value
    if problems:
        return None
    config = MonitorConfig(**values)
    for metric in config.warn_on_value:
        group = WATCH_GROUP[metric]
        if group not in config.metrics:
            problems.append(f"monitor_config.warn_on_value.{metric}: watches a metric that is switched off; "
                            f"add '{group}' to monitor_config.metrics or drop the bound")
    if problems:
        return None
    if config.port and config.port > 65535 - 7:
        # base + local rank must stay a valid port on an 8-rank node.
        problems.append(f"monitor_config.port: {config.port} leaves no room for base + local rank (up to +7); "
                        f"use 0 (any free port) or a base port from 1 to {65535 - 7}")
        return None
    return config


_INVALID = object()


class _Checker:
    """Per-key validation; each method returns the clean value or records a problem and returns _INVALID."""

    def __init__(self, origin: dict[str, str], problems: list[str]) -> None:
        self._origin = origin
        self._problems = problems

    def check(self, key: str, value: Any) -> Any:
        simple = self._simple_rules().get(key)
        if simple is not None:
            return simple(key, value)
        return getattr(self, f"_{key}")(key, value)

    def _simple_rules(self) -> dict[str, Any]:
        """Keys checked by type and range alone."""
        return {
            "enable": self._bool,
            "weight_norm": self._bool,
            "interval": self._positive_float,
            "max_file_mb": self._positive_float,
            "save_dir": self._text,
            "attention_mask_column": self._text,
            "input_ids_column": self._text,
            "port": lambda k, v: self._int(k, v, 0, 65535),
            "loss_window": lambda k, v: self._int(k, v, 1, 1_000_000),
            "warmup_steps": lambda k, v: self._int(k, v, 0),
            "max_files": lambda k, v: self._int(k, v, 1, 1000),
            "memory_window": lambda k, v: self._int(k, v, 2, 10_000),
        }

    def _fail(self, key: str, message: str, value: Any) -> Any:
        where = self._where(key)
        shown = value if not isinstance(value, str) else repr(value)
        self._problems.append(f"monitor_config.{key}: {message}, got {shown} (from {where})")
        return _INVALID

    # -- scalar helpers -------------------------------------------------------------------------------
    def _bool(self, key: str, value: Any) -> Any:
        if isinstance(value, bool):
            return value
        return self._fail(key, "must be true or false", value)

    def _int(self, key: str, value: Any, low: int, high: int | None = None) -> Any:
        if isinstance(value, bool) or not isinstance(value, int):
            return self._fail(key, f"must be an integer{_range_text(low, high)}", value)
        if value < low or (high is not None and value > high):
            return self._fail(key, f"must be an integer{_range_text(low, high)}", value)
        return value

    def _positive_float(self, key: str, value: Any) -> Any:
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value <= 0:
            return self._fail(key, "must be a number greater than 0", value)
        return float(value)

    def _text(self, key: str, value: Any, allow_empty: bool = False) -> Any:
        if not isinstance(value, str) or (not allow_empty and not value.strip()):
            return self._fail(key, "must be a non-empty string", value)
        return value

    def _names(self, key: str, value: Any, allowed: tuple[str, ...]) -> Any:
        items = [value] if isinstance(value, str) else value
        if not isinstance(items, (list, tuple)) or not all(isinstance(v, str) for v in items):
            return self._fail(key, f"must be a name or a list of names from {list(allowed)}", value)
        bad = [v for v in items if v not in allowed]
        if bad:
            hints = [f"'{b}' (did you mean '{m[0]}'?)" if (m := difflib.get_close_matches(b, allowed, n=1))
                     else f"'{b}'" for b in bad]
            return self._fail(key, f"unknown name(s) {', '.join(hints)}; allowed: {list(allowed)}", value)
        return tuple(dict.fromkeys(items))

    # -- one method per key ---------------------------------------------------------------------------
    def _backend(self, key: str, value: Any) -> Any:
        names = self._names(key, value, BACKENDS)
        if names is _INVALID:
            return names
        if not names:
            return self._fail(key, f"needs at least one of {list(BACKENDS)}", value)
        return names

    def _project(self, key: str, value: Any) -> Any:
        text = self._text(key, value)
        if text is _INVALID:
            return text
        if len(text) > _MAX_LABEL_VALUE:
            return self._fail(key, f"must be at most {_MAX_LABEL_VALUE} characters (it is a label value)", value)
        return text

    def _bind_address(self, key: str, value: Any) -> Any:
        text = self._text(key, value)
        if text is _INVALID:
            return text
        if text == "localhost":
            return text
        try:
            ipaddress.ip_address(text)
        except ValueError:
            return self._fail(key, "must be an IP address such as 127.0.0.1, 0.0.0.0 or ::, or localhost", value)
        return text

    def _metrics(self, key: str, value: Any) -> Any:
        return self._names(key, value, METRIC_GROUPS)

    def _warn_on_value(self, key: str, value: Any) -> Any:
        if value is None:
            return {}
        if not isinstance(value, Mapping):
            return self._fail(key, f"must be a mapping of metric to bound, metrics from {list(WATCHABLE)}", value)
        bounds: dict[str, Bound] = {}
        ok = True
        for metric, spec in value.items():
            if metric not in WATCHABLE:
                close = difflib.get_close_matches(str(metric), WATCHABLE, n=1)
                hint = f" (did you mean '{close[0]}'?)" if close else ""
                self._fail(key, f"unknown metric '{metric}'{hint}; allowed: {list(WATCHABLE)}", value)
                ok = False
                continue
            bound = _bound(spec, WATCHABLE[metric])
            if bound is None:
                self._fail(key, f"bound for '{metric}' must be a number (a {WATCHABLE[metric]} bound), "
                                "{max: x} or {min: y}", spec)
                ok = False
                continue
            bounds[str(metric)] = bound
        return bounds if ok else _INVALID

    def _tags(self, key: str, value: Any) -> Any:
        if value is None:
            return {}
        if not isinstance(value, Mapping):
            return self._fail(key, "must be a mapping of label name to value", value)
        tags: dict[str, str] = {}
        ok = True
        for name, tag in value.items():
            if not isinstance(name, str) or not _LABEL_NAME.match(name) or name.startswith("__"):
                self._fail(key, f"tag name {name!r} is not a valid Prometheus label name ([a-zA-Z_][a-zA-Z0-9_]*)",
                           value)
                ok = False
            elif name in RESERVED_LABELS:
                self._fail(key, f"tag name '{name}' is set by the exporter itself; "
                                f"reserved: {sorted(RESERVED_LABELS)}", value)
                ok = False
            elif isinstance(tag, bool) or not isinstance(tag, (str, int, float)):
                self._fail(key, f"tag '{name}' must be a string or number", value)
                ok = False
            elif len(str(tag)) > _MAX_LABEL_VALUE:
                self._fail(key, f"tag '{name}' must be at most {_MAX_LABEL_VALUE} characters", value)
                ok = False
            else:
                tags[name] = str(tag)
        return tags if ok else _INVALID

    def _log_level(self, key: str, value: Any) -> Any:
        if isinstance(value, str) and value.upper() in LOG_LEVELS:
            return value.upper()
        return self._fail(key, f"must be one of {list(LOG_LEVELS)}", value)

    def _file_sd_dir(self, key: str, value: Any) -> Any:
        return None if value is None else self._text(key, value)

    def _grad_norm(self, key: str, value: Any) -> Any:
        fields, known = self._section(key, value, GradNormConfig)
        checks = {
            "enable": self._bool,
            "every_n_steps": lambda k, v: self._int(k, v, 1, 1_000_000),
            "layers": self._regexes,
            "top_k": lambda k, v: self._int(k, v, 0, 1000),
            "max_series": lambda k, v: self._int(k, v, 1, 1000),
            "threshold": self._optional_positive,
            "clip": self._optional_positive,
        }
        clean = self._check_fields(key, fields, checks)
        if clean is _INVALID or not known:
            return _INVALID
        section = GradNormConfig(**clean)
        if section.top_k > section.max_series:
            return self._fail(f"{key}.top_k", f"must not exceed max_series ({section.max_series})", section.top_k)
        return section

    def _layernorm(self, key: str, value: Any) -> Any:
        fields, known = self._section(key, value, LayerNormConfig)
        checks = {
            "enable": self._bool,
            "every_n_steps": lambda k, v: self._int(k, v, 1, 1_000_000),
            "window": lambda k, v: self._int(k, v, 1, 10_000_000),
            "drift_threshold": self._optional_positive,
            "max_layers": lambda k, v: self._int(k, v, 1, 10_000),
        }
        clean = self._check_fields(key, fields, checks)
        return _INVALID if clean is _INVALID or not known else LayerNormConfig(**clean)

    def _otlp(self, key: str, value: Any) -> Any:
        fields, known = self._section(key, value, OtlpConfig)
        checks = {
            "endpoint": self._optional_url,
            "protocol": lambda k, v: None if v is None else self._choice(k, v, OTLP_PROTOCOLS),
            "interval": self._optional_positive,
            "timeout": self._positive_float,
            "headers": self._headers,
            "insecure": lambda k, v: None if v is None else self._bool(k, v),
        }
        clean = self._check_fields(key, fields, checks)
        return _INVALID if clean is _INVALID or not known else OtlpConfig(**clean)

    def _pushgateway(self, key: str, value: Any) -> Any:
        fields, known = self._section(key, value, PushgatewayConfig)
        checks = {
            "url": self._optional_url,
            "on": lambda k, v: self._names(k, v, PUSH_EVENTS),
            "interval": self._positive_float,
            "timeout": self._positive_float,
            "job": self._text,
        }
        clean = self._check_fields(key, fields, checks)
        return _INVALID if clean is _INVALID or not known else PushgatewayConfig(**clean)

    def _actions(self, key: str, value: Any) -> Any:
        fields, known = self._section(key, value, ActionsConfig)
        checks = {"early_stop": self._early_stop, "lr_backoff": self._lr_backoff, "snapshot": self._snapshot}
        clean = self._check_fields(key, fields, checks)
        return _INVALID if clean is _INVALID or not known else ActionsConfig(**clean)

    def _early_stop(self, key: str, value: Any) -> Any:
        fields, known = self._section(key, value, EarlyStopConfig)
        checks = {
            "enable": self._bool,
            "patience": lambda k, v: self._int(k, v, 1, 10_000_000),
            "min_delta": self._non_negative,
            "unit": lambda k, v: self._choice(k, v, EARLY_STOP_UNITS),
            "max_nonfinite": lambda k, v: None if v is None else self._int(k, v, 1, 1_000_000),
        }
        clean = self._check_fields(key, fields, checks)
        return _INVALID if clean is _INVALID or not known else EarlyStopConfig(**clean)

    def _lr_backoff(self, key: str, value: Any) -> Any:
        fields, known = self._section(key, value, LrBackoffConfig)
        checks = {
            "enable": self._bool,
            "factor": self._fraction,
            "rising_steps": lambda k, v: self._int(k, v, 1, 10_000_000),
            "on_grad_norm": self._bool,
            "cooldown": lambda k, v: self._int(k, v, 0, 10_000_000),
            "min_lr": self._non_negative,
        }
        clean = self._check_fields(key, fields, checks)
        return _INVALID if clean is _INVALID or not known else LrBackoffConfig(**clean)

    def _snapshot(self, key: str, value: Any) -> Any:
        fields, known = self._section(key, value, SnapshotConfig)
        checks = {
            "enable": self._bool,
            "spike_factor": lambda k, v: self._positive_float(k, v) if not _is_number(v) or v > 1 else
            self._fail(k, "must be a number greater than 1", v),
            "max_snapshots": lambda k, v: self._int(k, v, 1, 1000),
            "quiet_steps": lambda k, v: self._int(k, v, 1, 10_000_000),
        }
        clean = self._check_fields(key, fields, checks)
        return _INVALID if clean is _INVALID or not known else SnapshotConfig(**clean)

    def _non_negative(self, key: str, value: Any) -> Any:
        if not _is_number(value) or value < 0:
            return self._fail(key, "must be a number of at least 0", value)
        return float(value)

    def _fraction(self, key: str, value: Any) -> Any:
        if not _is_number(value) or not 0 < value < 1:
            return self._fail(key, "must be a number between 0 and 1 (exclusive)", value)
        return float(value)

    def _web(self, key: str, value: Any) -> Any:
        if isinstance(value, Mapping) and value.get("config_file"):
            value = {**_read_web_config_file(value["config_file"], self._problems), **value}
        fields, known = self._section(key, value, WebConfig)
        checks = {
            "config_file": lambda k, v: None if v is None else self._text(k, v),
            "tls_cert_file": self._readable_file,
            "tls_key_file": self._readable_file,
            "client_ca_file": self._readable_file,
            "client_auth_type": lambda k, v: self._choice(k, v, CLIENT_AUTH_TYPES),
            "basic_auth_users": self._password_hashes,
            "cache_seconds": lambda k, v: 0.0 if v == 0 else self._positive_float(k, v),
            "max_requests_per_second": lambda k, v: 0.0 if v == 0 else self._positive_float(k, v),
        }
        clean = self._check_fields(key, fields, checks)
        if clean is _INVALID or not known:
            return _INVALID
        web = WebConfig(**clean)
        if (web.tls_cert_file is None) != (web.tls_key_file is None):
            return self._fail(key, "tls_cert_file and tls_key_file go together: give both for TLS, or neither",
                              {"tls_cert_file": web.tls_cert_file, "tls_key_file": web.tls_key_file})
        if not web.tls and (web.client_ca_file or web.client_auth_type != "NoClientCert"):
            return self._fail(key, "client certificates (client_ca_file, client_auth_type) need TLS: "
                                   "set tls_cert_file and tls_key_file", web.client_auth_type)
        if web.client_auth_type != "NoClientCert" and not web.client_ca_file:
            return self._fail(f"{key}.client_auth_type", "needs client_ca_file, the CA that signs client "
                                                         "certificates", web.client_auth_type)
        return web

    def _readable_file(self, key: str, value: Any) -> Any:
        if value is None:
            return None
        if not isinstance(value, str) or not os.path.isfile(value) or not os.access(value, os.R_OK):
            return self._fail(key, "must be the path of a readable file", value)
        return value

    def _password_hashes(self, key: str, value: Any) -> Any:
        if value is None:
            return {}
        if not isinstance(value, Mapping):
            return self._fail(key, "must be a mapping of user name to password hash", REDACTED)
        for user, hashed in value.items():
            if not isinstance(user, str) or not user or ":" in user:
                return self._fail(key, "user names must be non-empty strings without ':'", user)
            if not isinstance(hashed, str) or not (_BCRYPT_HASH.match(hashed) or _SHA256_HASH.match(hashed)):
                return self._fail(key, f"the hash for user '{user}' must be a bcrypt hash ($2a$/$2b$/$2y$, e.g. "
                                       "from `htpasswd -nbBC 10 user password`) or sha256:<64 hex digits>",
                                  REDACTED)
        if any(_BCRYPT_HASH.match(h) for h in value.values()) and importlib.util.find_spec("bcrypt") is None:
            return self._fail(key, "bcrypt hashes need the bcrypt package: pip install 'ms-exporter[auth]' "
                                   "(or give sha256:<hex> hashes)", REDACTED)
        return dict(value)

    # -- section helpers ---------------------------------------------------------------------------------
    def _section(self, key: str, value: Any, kind: type) -> tuple[dict[str, Any], bool]:
        """The known sub-keys to check, and whether the section had no other problem."""
        if value is None:
            return {}, True
        if isinstance(value, kind):
            return {f.name: getattr(value, f.name) for f in dataclasses.fields(kind)}, True
        if not isinstance(value, Mapping):
            self._fail(key, "must be a mapping", value)
            return {}, False
        allowed = [f.name for f in dataclasses.fields(kind)]
        ok = True
        for sub_key in value:
            if sub_key not in allowed:
                close = difflib.get_close_matches(str(sub_key), allowed, n=1)
                hint = f"did you mean '{close[0]}'? " if close else ""
                self._problems.append(f"monitor_config.{key}.{sub_key}: unknown key ({self._where(key)}); {hint}"
                                      f"allowed keys: {', '.join(allowed)}")
                ok = False
        return {k: v for k, v in value.items() if k in allowed}, ok

    def _check_fields(self, key: str, fields: dict[str, Any], checks: dict[str, Any]) -> Any:
        clean = {}
        ok = True
        for name, value in fields.items():
            checked = checks[name](f"{key}.{name}", value)
            if checked is _INVALID:
                ok = False
            else:
                clean[name] = checked
        return clean if ok else _INVALID

    def _where(self, key: str) -> str:
        return self._origin.get(key.split(".")[0], "monitor_config")

    def _optional_positive(self, key: str, value: Any) -> Any:
        if value is None:
            return None
        return self._positive_float(key, value)

    def _choice(self, key: str, value: Any, allowed: tuple[str, ...]) -> Any:
        if value in allowed:
            return value
        return self._fail(key, f"must be one of {list(allowed)}", value)

    def _optional_url(self, key: str, value: Any) -> Any:
        if value is None:
            return None
        if not isinstance(value, str) or not re.match(r"^[a-zA-Z][a-zA-Z0-9+.-]*://[^/\s]+", value):
            return self._fail(key, "must be a URL such as http://host:port", value)
        return value

    def _headers(self, key: str, value: Any) -> Any:
        """A mapping, or the OTEL_EXPORTER_OTLP_HEADERS form `name=value,name2=value2`."""
        if value is None:
            return None
        if isinstance(value, str):
            pairs = [part.split("=", 1) for part in value.split(",") if part.strip()]
            if not all(len(pair) == 2 and pair[0].strip() for pair in pairs):
                return self._fail(key, "must be a mapping of header name to value, or 'name=value,name2=value2'",
                                  REDACTED)
            value = {name.strip(): text.strip() for name, text in pairs}
        if not isinstance(value, Mapping) or not all(isinstance(k, str) and isinstance(v, str)
                                                     for k, v in value.items()):
            # The value is a secret: never echo it.
            return self._fail(key, "must be a mapping of header name to string value", REDACTED)
        return dict(value)

    def _regexes(self, key: str, value: Any) -> Any:
        items = [value] if isinstance(value, str) else value
        if not isinstance(items, (list, tuple)) or not all(isinstance(v, str) for v in items):
            return self._fail(key, "must be a regular expression or a list of them", value)
        for pattern in items:
            try:
                re.compile(pattern)
            except re.error as exc:
                return self._fail(key, f"'{pattern}' is not a valid regular expression ({exc})", value)
        return tuple(items)


def _read_web_config_file(path: Any, problems: list[str]) -> dict[str, Any]:
    """A Prometheus web config file (exporter-toolkit format) as monitor_config.web keys."""
    if not isinstance(path, str):
        return {}
    try:
        data = yaml.safe_load(Path(path).read_text(encoding="utf-8")) or {}
    except (OSError, ValueError, yaml.YAMLError) as exc:  # ValueError: a NUL byte in the path, or not UTF-8
        problems.append(f"monitor_config.web.config_file: cannot read {path!r}: {exc}")
        return {}
    if not isinstance(data, Mapping):
        problems.append(f"monitor_config.web.config_file: {path} must hold a mapping")
        return {}
    out: dict[str, Any] = {}
    unknown = [k for k in data if k not in ("tls_server_config", "basic_auth_users")]
    tls = data.get("tls_server_config") or {}
    names = {"cert_file": "tls_cert_file", "key_file": "tls_key_file", "client_ca_file": "client_ca_file",
             "client_auth_type": "client_auth_type"}
    if isinstance(tls, Mapping):
        unknown += [f"tls_server_config.{k}" for k in tls if k not in names]
        out.update({names[k]: v for k, v in tls.items() if k in names})
    if data.get("basic_auth_users") is not None:
        out["basic_auth_users"] = data["basic_auth_users"]
    if unknown:
        problems.append(f"monitor_config.web.config_file: {path} has keys this exporter does not support: "
                        f"{sorted(map(str, unknown))}; supported: tls_server_config.{{{', '.join(names)}}}, "
                        "basic_auth_users")
    return out


def _bound(spec: Any, default_direction: Literal["max", "min"]) -> Bound | None:
    if isinstance(spec, Mapping) and len(spec) == 1:
        ((direction, number),) = spec.items()
        if direction in ("max", "min") and _is_number(number):
            return Bound(direction, float(number))
        return None
    if _is_number(spec):
        return Bound(default_direction, float(spec))
    return None


def _is_number(value: Any) -> bool:
    return not isinstance(value, bool) and isinstance(value, (int, float)) and math.isfinite(value)


def _range_text(low: int, high: int | None) -> str:
    return f" from {low} to {high}" if high is not None else f" of at least {low}"


_STRING_KEYS = ("project", "save_dir", "bind_address", "attention_mask_column", "input_ids_column", "file_sd_dir")


def _parse_env(key: str, text: str) -> Any:
    """Environment values are YAML scalars or flow collections; list keys also take `a,b`."""
    try:
        value = yaml.safe_load(text)
    except yaml.YAMLError:
        return text
    if key in ("backend", "metrics") and isinstance(value, str) and "," in value:
        return [part.strip() for part in value.split(",") if part.strip()]
    if key in _STRING_KEYS and value is not None:
        return text  # keep strings verbatim: a project named "1e3" stays a string
    if key == "pushgateway":
        return _yaml_on_key(value)
    return value
