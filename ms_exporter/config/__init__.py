"""YAML, dict, environment and keyword configuration -> one frozen MonitorConfig; every problem in one ConfigError.

Each field declares its constraint beside it: `setting(default, check=int_in(1, 100))`, or `section(Kind)` for a
nested section. One walker (`_build`) applies the declared checks to every field of every section, then a class's
`_cross_check` applies the rules that tie its fields together. A check returns the clean value or raises `_Bad`
with what is wrong and what is allowed; the walker adds the key and the source that set it.
"""

from __future__ import annotations

import dataclasses
import difflib
import importlib.util
import ipaddress
import math
import os
import re
import reprlib
import stat
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, TypeGuard, TypeVar

import yaml

from ms_exporter.config import mindformers_keys
from ms_exporter.core import catalogue
from ms_exporter.core.flops import PEAK_PRESETS, FlopsModel, ModelShape, from_per_token, from_shape
from ms_exporter.core.redaction import CONTROL_CHARACTERS, REDACTED, hide_url_passwords, url_for_logs
from ms_exporter.core.thresholds import DEFAULTS, LOSS_SPIKE_FACTOR

if TYPE_CHECKING:
    from _typeshed import DataclassInstance

ENV_PREFIX = "MS_EXPORTER_"
# Upper bounds: past them a value is a mistake, and some (an interval of 1e10 s) would break a thread's wait.
MAX_SECONDS = 7 * 24 * 3600  # intervals, timeouts and deadlines: a week
MAX_STEPS = 10**12  # step counts
MAX_RATIO = 1e12  # thresholds, factors and learning rates
MAX_FLOPS = 1e30  # FLOPs per token or per second (a 1e15-parameter model at a zettaFLOP/s is far below)
MAX_FILE_BYTES = 1024 * 1024  # a config file (a monitor_config is a few KiB)
MAX_YAML_VALUES = 100_000  # values a YAML document may stand for, aliases expanded
MAX_YAML_DEPTH = 64

# Outside the 9100-9999 range that the Prometheus project hands out to exporters (9100 node, 9400 DCGM,
# 9464 OpenTelemetry ...), below Linux's ephemeral range (32768+), so that base + 7 local ranks stay clear.
DEFAULT_PORT = 19420

BACKENDS = ("prometheus", "otlp", "local", "tensorboard", "wandb")
OTLP_PROTOCOLS = ("grpc", "http/protobuf")
PUSH_EVENTS = ("train_end", "interval")


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

# warn_on_value keys, which way a bare number bounds each, and the `metrics` group that must be on for it to see
# values: from the catalogue, where each key's family is.
WATCHABLE: dict[str, Literal["max", "min"]] = {
    key: catalogue.WATCHABLE[key].direction for key in catalogue.WARN_ON_VALUE_KEYS
}
WATCH_GROUP = {key: str(catalogue.WATCHABLE[key].group) for key in catalogue.WARN_ON_VALUE_KEYS}

# Host memory is read at least this often (psutil, ~20 µs on the sampler thread): the growth slope then spans
# `memory_window` x 5 s, and a leak is seen growing within seconds.
MEMORY_SAMPLE_SECONDS = 5.0

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
_URL = re.compile(r"^[a-zA-Z][a-zA-Z0-9+.-]*://[^/\s]+")


_HEADER = re.compile(r"invalid monitor_config \(\d+ problem\(s\)\):\n  - ")


class ConfigError(ValueError):
    """Raised at construction with every problem found; `problems` holds them one per item.

    Built from one string it is one problem, or, when the string is a ConfigError's own text with something put in
    front (MindSpore Transformers' registry re-raises `type(e)(f"{cls}: {e}")`), the same problems under that
    prefix: never one problem per character."""

    def __init__(self, problems: str | Iterable[str]) -> None:
        prefix = ""
        if isinstance(problems, str):
            found = _HEADER.search(problems)
            if found is None:
                problems = [problems]
            else:
                prefix, problems = problems[: found.start()], problems[found.end() :].split("\n  - ")
        self.problems = [hide_url_passwords(str(problem)) for problem in problems]
        lines = "\n  - ".join(self.problems)
        super().__init__(
            f"{hide_url_passwords(prefix)}invalid monitor_config ({len(self.problems)} problem(s)):\n  - {lines}"
        )


# -- constraints: a check returns the clean value, or raises _Bad saying what is wrong and what is allowed -----
Check = Callable[[Any], Any]
# Reports a problem of a section: (sub-key, or "" for the section itself; message; value shown, if any).
Say = Callable[..., None]
_UNSHOWN = object()  # a problem that shows no value


class _Bad(Exception):
    """A rejected value: (message, value to show) pairs; a secret shows as REDACTED."""

    def __init__(self, message: str, value: Any = _UNSHOWN) -> None:
        super().__init__(message)
        self.problems = [(message, value)]


def setting(default: Any = dataclasses.MISSING, *, check: Check, factory: Any = dataclasses.MISSING) -> Any:
    """A dataclass field and the check every value given for it must pass."""
    return field(default=default, default_factory=factory, metadata={"check": check})


def section(kind: type) -> Any:
    """A nested section: a mapping of its own fields, each checked by its own declaration."""
    return field(default_factory=kind, metadata={"check": kind})


def _rule(allowed: str, accepts: Callable[[Any], bool], clean: Callable[[Any], Any] = lambda value: value) -> Check:
    def check(value: Any) -> Any:
        if not accepts(value):
            raise _Bad(f"must be {allowed}", value)
        return clean(value)

    return check


def _is_number(value: Any) -> bool:
    if isinstance(value, bool):
        return False
    return isinstance(value, int) or (isinstance(value, float) and math.isfinite(value))  # an int of any size


def _upto(high: float | None) -> str:
    return "" if high is None else f" and at most {high:g}"


def boolean() -> Check:
    return _rule("true or false", lambda value: isinstance(value, bool))


def int_in(low: int, high: int) -> Check:
    return _rule(
        f"an integer from {low} to {high}",
        lambda value: isinstance(value, int) and not isinstance(value, bool) and low <= value <= high,
    )


def greater_than(low: int, high: float) -> Check:
    return _rule(
        f"a number greater than {low}{_upto(high)}", lambda value: _is_number(value) and low < value <= high, float
    )


def at_least(low: float, high: float) -> Check:
    return _rule(
        f"a number of at least {low:g}{_upto(high)}", lambda value: _is_number(value) and low <= value <= high, float
    )


def between(low: int, high: int) -> Check:
    return _rule(
        f"a number between {low} and {high} (exclusive)", lambda value: _is_number(value) and low < value < high, float
    )


def choice(*allowed: str, any_case: bool = False) -> Check:
    """One of `allowed`; with any_case, in any case and stored as written in `allowed` (upper case)."""
    fold: Callable[[Any], Any] = str.upper if any_case else lambda value: value
    return _rule(f"one of {list(allowed)}", lambda value: isinstance(value, str) and fold(value) in allowed, fold)


def text(*, label_value: bool = False) -> Check:
    """A non-empty string; a label value is also at most _MAX_LABEL_VALUE characters."""

    def check(value: Any) -> str:
        if not isinstance(value, str) or not value.strip():
            raise _Bad("must be a non-empty string", value)
        if label_value and len(value) > _MAX_LABEL_VALUE:
            raise _Bad(f"must be at most {_MAX_LABEL_VALUE} characters (it is a label value)", value)
        return value

    return check


def optional(check: Check) -> Check:
    """None (YAML null: leave it unset), or a value `check` accepts."""
    return lambda value: None if value is None else check(value)


def url() -> Check:
    return _rule("a URL such as http://host:port", lambda value: isinstance(value, str) and bool(_URL.match(value)))


def _runbook_url(value: Any) -> str:
    if not (isinstance(value, str) and re.match(r"^https?://[^/\s]+\S*$", value) and "#" not in value):
        raise _Bad(
            "must be the http(s) URL of the runbook page, without a #fragment (each alert adds its own), "
            "such as https://github.com/ORG/REPO/blob/main/docs/alerts.md",
            value,
        )
    return value


MAX_PATH_CHARS = 4096  # Linux's PATH_MAX


def file_path() -> Check:
    """A file or directory path: non-empty, at most MAX_PATH_CHARS characters, no control character (a NUL cannot be
    in a path at all, and a newline or escape in one garbles every log line and dump name that shows it)."""

    def check(value: Any) -> str:
        if not isinstance(value, str) or not value.strip():
            raise _Bad("must be a non-empty path", value)
        if (bad := CONTROL_CHARACTERS.search(value)) is not None:
            raise _Bad(f"must be a path without control characters (it has {bad.group()!r} at {bad.start()})", value)
        if len(value) > MAX_PATH_CHARS:
            raise _Bad(f"must be a path of at most {MAX_PATH_CHARS} characters", value)
        return value

    return check


def readable_file() -> Check:
    def check(value: Any) -> str:
        clean: str = file_path()(value)
        if not (os.path.isfile(clean) and os.access(clean, os.R_OK)):
            raise _Bad("must be the path of a readable file", value)
        return clean

    return check


def _strings(value: Any) -> list[str] | None:
    """A string or a list of strings, as a list; None for anything else."""
    items = [value] if isinstance(value, str) else value
    if isinstance(items, (list, tuple)) and all(isinstance(item, str) for item in items):
        return list(items)
    return None


def _close(word: Any, allowed: Sequence[str]) -> str | None:
    close = difflib.get_close_matches(str(word), list(allowed), n=1)
    return close[0] if close else None


def names(allowed: Sequence[str], *, at_least_one: bool = False) -> Check:
    """A name or a list of names from `allowed` (repeats dropped); a misspelt name gets a did-you-mean hint."""

    def check(value: Any) -> tuple[str, ...]:
        items = _strings(value)
        if items is None:
            raise _Bad(f"must be a name or a list of names from {list(allowed)}", value)
        bad = [
            f"'{item}' (did you mean '{close}'?)" if (close := _close(item, allowed)) else f"'{item}'"
            for item in items
            if item not in allowed
        ]
        if bad:
            raise _Bad(f"unknown name(s) {', '.join(bad)}; allowed: {list(allowed)}", value)
        if at_least_one and not items:
            raise _Bad(f"needs at least one of {list(allowed)}", value)
        return tuple(dict.fromkeys(items))

    return check


def class_names() -> Check:
    """A Python class name or a list of them."""

    def check(value: Any) -> tuple[str, ...]:
        items = _strings(value)
        if items is None:
            raise _Bad("must be a class name or a list of class names", value)
        bad = [f"'{item}'" for item in items if not item.isidentifier()]
        if bad:
            raise _Bad(f"{', '.join(bad)} is not a class name (a Python identifier such as UploadCallback)", value)
        return tuple(dict.fromkeys(items))

    return check


def regexes() -> Check:
    """A regular expression or a list of them."""

    def check(value: Any) -> tuple[str, ...]:
        items = _strings(value)
        if items is None:
            raise _Bad("must be a regular expression or a list of them", value)
        for pattern in items:
            try:
                re.compile(pattern)
            except re.error as exc:
                raise _Bad(f"'{pattern}' is not a valid regular expression ({exc})", value) from None
        return tuple(items)

    return check


def mapping(what: str, entry: Callable[[Any, Any], tuple[Any, Any]], *, secret: bool = False) -> Check:
    """A mapping of `what`, checked entry by entry (`entry` returns the clean key and value); each bad entry is its
    own problem. None is the empty mapping; a secret mapping is never shown."""

    def check(value: Any) -> dict[Any, Any]:
        if value is None:
            return {}
        if not isinstance(value, Mapping):
            raise _Bad(f"must be a mapping of {what}", REDACTED if secret else value)
        out, problems = {}, []
        for key, item in value.items():
            try:
                clean_key, clean_item = entry(key, item)
                out[clean_key] = clean_item
            except _Bad as bad:
                problems += bad.problems
        if problems:
            combined = _Bad(*problems[0])
            combined.problems = problems
            raise combined
        return out

    return check


# -- checks for one key each ---------------------------------------------------------------------------------
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


def _percentile(value: Any) -> float:
    if not _is_number(value) or not 50 <= value <= 100:
        raise _Bad("must be a percentile from 50 to 100 (99: the 99th percentile)", value)
    return float(value)


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


EARLY_STOP_UNITS = ("epoch", "step")


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


ROLLBACK_STORAGE = ("auto", "memory", "disk")


@dataclass(frozen=True)
class RollbackConfig:
    """monitor_config.actions.rollback: keep the last good state; on a divergence restore it, list the batches
    trained since, and go on (docs/rollback.md)."""

    enable: bool = setting(False, check=boolean())
    good_every: int = setting(100, check=int_in(1, 10_000_000))  # steps between good states
    quiet_steps: int = setting(20, check=int_in(1, 10_000_000))  # steps without a divergence before one is kept
    min_health: float = setting(0.8, check=at_least(0, 1))  # mindspore_train_health_score needed to keep one
    max_kept: int = setting(2, check=int_in(1, 100))
    # where good states live: host memory, files in save_dir/good-states, or auto (memory up to memory_limit_mb;
    # past 64 MiB a fresh host copy cost more to keep than a file did: docs/benchmarks.md)
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


ACTION_SECTIONS = {
    "early_stop": EarlyStopConfig,
    "lr_backoff": LrBackoffConfig,
    "snapshot": SnapshotConfig,
    "rollback": RollbackConfig,
}


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


# The characters of a run_id (it names the run's state file in save_dir); goodput derives ids from the same set.
RUN_ID_CHARACTERS = "A-Za-z0-9_.:-"
_RUN_ID = re.compile(rf"^[A-Za-z0-9][{RUN_ID_CHARACTERS}]{{0,127}}$")


def _run_id(value: Any) -> str:
    if not isinstance(value, str) or not _RUN_ID.match(value):
        raise _Bad(
            "must be 1 to 128 letters, digits and '_.:-', starting with a letter or digit (it names the "
            "run's state file in save_dir)",
            value,
        )
    return value


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
    """monitor_config.tensorboard: the `tensorboard` backend's event files in save_dir/tensorboard/rank<r>."""

    # Rank 0 only by default, as MindSpore Transformers' TensorBoard writer does: every rank writes with true.
    all_ranks: bool = setting(False, check=boolean())


@dataclass(frozen=True)
class WandbConfig:
    """monitor_config.wandb: the `wandb` backend's W&B runs, their files in save_dir/wandb (docs/configuration.md)."""

    # Rank 0 only by default, as the tensorboard backend: every rank logs a run of its own with true.
    all_ranks: bool = setting(False, check=boolean())
    # offline: files only, `wandb sync save_dir/wandb` uploads them later; online: wandb's own upload as it runs.
    mode: str = setting("offline", check=choice("offline", "online"))
    project: str | None = setting(None, check=optional(text()))  # the W&B project; unset: monitor_config.project
    entity: str | None = setting(None, check=optional(text()))  # the W&B team or user; unset: wandb's default


CLIENT_AUTH_TYPES = ("NoClientCert", "VerifyClientCertIfGiven", "RequireAndVerifyClientCert")
_BCRYPT_HASH = re.compile(r"^\$2[aby]\$\d\d\$[./A-Za-z0-9]{53}$")
_SHA256_HASH = re.compile(r"^sha256:[0-9a-f]{64}$")


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


SECTIONS = {
    "grad_norm": GradNormConfig,
    "layernorm": LayerNormConfig,
    "otlp": OtlpConfig,
    "pushgateway": PushgatewayConfig,
    "web": WebConfig,
    "actions": ActionsConfig,
    "hang": HangConfig,
    "goodput": GoodputConfig,
    "divergence": DivergenceConfig,
    "flops": FlopsConfig,
    "tensorboard": TensorBoardConfig,
    "wandb": WandbConfig,
}


@dataclass(frozen=True)
class MonitorConfig:
    """The effective configuration. Field names are the YAML keys and the MS_EXPORTER_<KEY> suffixes."""

    enable: bool = setting(True, check=boolean())
    backend: tuple[str, ...] = setting(("prometheus",), check=names(BACKENDS, at_least_one=True))
    project: str = setting("default", check=text(label_value=True))
    # The JSON Lines (TensorBoard, W&B) flush period and, up to MEMORY_SAMPLE_SECONDS, the memory sampling period:
    # twenty snapshots and samples a second at most (1e-9 s wrote 8 MB/s of JSON Lines and spun the sampler thread).
    interval: float = setting(30.0, check=at_least(0.05, MAX_SECONDS))
    save_dir: str = setting("./monitor_output", check=file_path())
    port: int = setting(DEFAULT_PORT, check=_base_port)
    bind_address: str = setting("127.0.0.1", check=_bind_address)
    metrics: tuple[str, ...] = setting(METRIC_GROUPS, check=names(METRIC_GROUPS))
    loss_window: int = setting(50, check=int_in(1, 1_000_000))
    warn_on_value: Mapping[str, Bound] = setting(
        factory=dict, check=mapping(f"metric to bound, metrics from {list(WATCHABLE)}", _watch)
    )
    tags: Mapping[str, str] = setting(factory=dict, check=mapping("label name to value", _tag))
    log_level: str = setting("INFO", check=choice(*LOG_LEVELS, any_case=True))
    # Keys below are not in MindSpore Transformers' vocabulary; docs/configuration.md explains each.
    warmup_steps: int = setting(10, check=int_in(0, MAX_STEPS))
    max_file_mb: float = setting(100.0, check=greater_than(0, 1024 * 1024))  # a TiB
    max_files: int = setting(5, check=int_in(1, 1000))
    attention_mask_column: str = setting("attention_mask", check=text())
    input_ids_column: str = setting("input_ids", check=text())
    memory_window: int = setting(10, check=int_in(2, 10_000))
    # LearningRateSchedule classes (beyond MindSpore's own) whose construct keeps no state: the monitor may call them.
    pure_lr_schedules: tuple[str, ...] = setting((), check=class_names())
    grad_norm: GradNormConfig = section(GradNormConfig)
    layernorm: LayerNormConfig = section(LayerNormConfig)
    weight_norm: bool = setting(False, check=boolean())
    file_sd_dir: str | None = setting(None, check=optional(file_path()))
    # Where the alerts' runbook_url links point (ms-exporter rules/kubernetes --config): the page that serves
    # docs/alerts.md with a heading anchor per alert; unset: the repository-relative docs/alerts.md.
    runbook_url: str | None = setting(None, check=optional(_runbook_url))
    otlp: OtlpConfig = section(OtlpConfig)
    pushgateway: PushgatewayConfig = section(PushgatewayConfig)
    web: WebConfig = section(WebConfig)
    actions: ActionsConfig = section(ActionsConfig)
    hang: HangConfig = section(HangConfig)
    # Which run this process belongs to: its restarts share the goodput ledger (derived when unset, docs/goodput.md).
    run_id: str | None = setting(None, check=optional(_run_id))
    goodput: GoodputConfig = section(GoodputConfig)
    divergence: DivergenceConfig = section(DivergenceConfig)
    flops: FlopsConfig = section(FlopsConfig)
    tensorboard: TensorBoardConfig = section(TensorBoardConfig)
    wandb: WandbConfig = section(WandbConfig)

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

    def to_dict(self) -> dict[str, Any]:
        """Plain data, the shape a YAML file would have (used by `ms-exporter check-config`)."""
        plain: dict[str, Any] = _plain(self)
        return plain


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


def load_config(
    source: str | os.PathLike[str] | Mapping[str, Any] | MonitorConfig | None = None, **overrides: Any
) -> MonitorConfig:
    """Build the effective config: defaults < file/dict < MS_EXPORTER_* environment < keyword overrides."""
    return read_config(source, **overrides)[0]


def read_config(
    source: str | os.PathLike[str] | Mapping[str, Any] | MonitorConfig | None = None, **overrides: Any
) -> tuple[MonitorConfig, list[str]]:
    """load_config, and what the caller should tell the user about the block: MindSpore Transformers' own keys
    found in it, read as ours or left to it (ms_exporter.config.mindformers_keys)."""
    problems = _Problems()
    raw: dict[str, Any] = {}
    notes: list[str] = []
    if isinstance(source, MonitorConfig):
        raw = source.to_dict()
    elif isinstance(source, Mapping):
        raw = _unwrap(dict(source), "the given dict", problems.found)
    elif source is not None:
        raw = _read_file(Path(source), problems.found)
    if not isinstance(source, MonitorConfig):
        translation = mindformers_keys.translate(raw)
        notes += [summary] if (summary := translation.summary()) else []
        for its_key, ours in translation.read.items():  # an error then names the key the user wrote
            problems.set_origin(ours, f"monitor_config.{its_key}, MindSpore Transformers' key read as ours")
    for key, text in _env_values().items():
        value = _parse_env(key, text)
        _merge(raw, key, value)
        problems.set_origin(key, f"environment variable {ENV_PREFIX}{key.upper()}", value)
    problems.found.extend(_unknown_env_names())
    for key, value in overrides.items():
        _merge(raw, key, value)
        problems.set_origin(key, f"keyword argument {key}=", value)
    config = _build(MonitorConfig, raw, "", problems)
    if problems.found or config is None:
        raise ConfigError(problems.found)
    return config, notes


def _merge(raw: dict[str, Any], key: Any, value: Any, kind: type[DataclassInstance] = MonitorConfig) -> None:
    """A later source replaces a key; in a section (also one inside a section) it replaces the sub-keys it names."""
    declared = {f.name: f.metadata["check"] for f in dataclasses.fields(kind)}.get(key)
    if _is_section(declared) and isinstance(raw.get(key), Mapping) and isinstance(value, Mapping):
        raw[key] = dict(raw[key])
        for sub_key, sub_value in value.items():
            _merge(raw[key], sub_key, sub_value, declared)
    else:
        raw[key] = value


_SHOWN = reprlib.Repr()
_SHOWN.maxlevel, _SHOWN.maxdict, _SHOWN.maxlist, _SHOWN.maxtuple = 3, 6, 6, 6
_SHOWN.maxstring = _SHOWN.maxother = 120


def shown_value(value: Any) -> str:
    """A bad value as an error message shows it: short whatever it is (a YAML alias bomb, a 400-digit number), a
    string quoted, a number as written."""
    if isinstance(value, int) and not isinstance(value, bool) and value.bit_length() > 64:
        try:
            return f"an integer of {len(str(abs(value)))} digits"
        except ValueError:  # past Python's int-to-text limit (4,300 digits)
            return f"an integer of about {int(value.bit_length() * math.log10(2)) + 1} digits"
    return _SHOWN.repr(value)


class _Problems:
    """Every problem found, each naming its key and the source that set it."""

    def __init__(self) -> None:
        self.found: list[str] = []
        # key path (a top-level key, or section.key) -> the environment variable, keyword argument or MindSpore
        # Transformers key that set it; a path not here was set where its longest listed prefix was
        self.origin: dict[str, str] = {}

    def set_origin(self, path: str, where: str, value: Any = None) -> None:
        """`path` was set by `where`; with a section's mapping `value`, only the sub-keys it names are (they are
        merged into what was there)."""
        for known in [known for known in self.origin if known.startswith(path + ".")]:
            if not isinstance(value, Mapping) or known[len(path) + 1 :].split(".")[0] in value:
                del self.origin[known]
        self.origin[path] = where

    def _where(self, path: str) -> str:
        parts = path.split(".")
        for end in range(len(parts), 0, -1):
            if (where := self.origin.get(".".join(parts[:end]))) is not None:
                return where
        return "monitor_config"

    def add(self, path: str, message: str, value: Any = _UNSHOWN) -> None:
        shown = "" if value is _UNSHOWN else f", got {shown_value(value)}"
        self.found.append(f"monitor_config.{path}: {message}{shown} (from {self._where(path)})")

    def unknown(self, path: str, key: Any, allowed: list[str]) -> None:
        close = _close(key, allowed)
        hint = f"did you mean '{close}'? " if close else ""
        self.found.append(
            f"monitor_config.{path}: unknown key ({self._where(path)}); {hint}allowed keys: {', '.join(allowed)}"
        )


_T = TypeVar("_T", bound="DataclassInstance")


def _is_section(check: object) -> TypeGuard[type[DataclassInstance]]:
    """A field whose declared check is a section class (a nested dataclass) rather than a check function."""
    return isinstance(check, type) and dataclasses.is_dataclass(check)


def _build(kind: type[_T], value: Any, path: str, problems: _Problems) -> _T | None:
    """The config (path "") or one section of it: each field through its declared check, unknown keys with a
    did-you-mean hint, then the class's cross-field rules. None when anything was wrong, all of it reported."""
    fields = dataclasses.fields(kind)
    allowed = [f.name for f in fields]

    def say(key: str, message: str, shown: Any = _UNSHOWN) -> None:
        problems.add(f"{path}.{key}" if path and key else path or key, message, shown)

    if value is None:
        value = {}
    elif isinstance(value, kind):
        value = {name: getattr(value, name) for name in allowed}
    elif not isinstance(value, Mapping):
        say("", f"must be a mapping (keys: {', '.join(allowed)})", value)
        return None
    before = len(problems.found)
    expand = getattr(kind, "_expand", None)
    if expand is not None:
        value = expand(value, say)
    for key in value:
        if key not in allowed:
            problems.unknown(f"{path}.{key}" if path else str(key), key, allowed)
    clean = {}
    for f in fields:
        if f.name not in value:
            continue
        check = f.metadata["check"]
        if _is_section(check):
            clean[f.name] = _build(check, value[f.name], f"{path}.{f.name}" if path else f.name, problems)
            continue
        try:
            clean[f.name] = check(value[f.name])
        except _Bad as bad:
            for message, shown in bad.problems:
                say(f.name, message, shown)
    if len(problems.found) > before:
        return None
    config = kind(**clean)
    if hasattr(config, "_cross_check"):
        config._cross_check(say)
    return config if len(problems.found) == before else None


def _read_file(path: Path, problems: list[str]) -> dict[str, Any]:
    try:
        text = read_small_file(path)
    except (OSError, ValueError) as exc:  # ValueError: not UTF-8, or a NUL byte in the path
        problems.append(f"cannot read config file {str(path)!r}: {getattr(exc, 'strerror', None) or exc}")
        return {}
    try:
        data = load_yaml(text)
    except yaml.YAMLError as exc:
        problems.append(f"{path} is not valid YAML: {exc}")
        return {}
    if data is None:
        return {}
    raw = _unwrap(data, str(path), problems)
    if "pushgateway" in raw:
        raw["pushgateway"] = _yaml_on_key(raw["pushgateway"])
    return raw


def read_small_file(path: Path | str) -> str:
    """A config file's text: a regular file of at most MAX_FILE_BYTES (a FIFO or /dev/zero would hang or fill
    memory), UTF-8. OSError or ValueError with what is wrong."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))  # a FIFO: no wait for a writer
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise ValueError("not a regular file (a directory, FIFO or device cannot hold a config)")
        if info.st_size > MAX_FILE_BYTES:
            raise ValueError(f"{info.st_size:,} bytes; a config file is at most {MAX_FILE_BYTES:,}")
        chunks, size = [], 0
        while chunk := os.read(fd, 65536):
            chunks.append(chunk)
            size += len(chunk)
            if size > MAX_FILE_BYTES:  # it grew while read
                raise ValueError(f"more than {MAX_FILE_BYTES:,} bytes; a config file is at most that")
    finally:
        os.close(fd)
    return b"".join(chunks).decode("utf-8")


class YamlTooLarge(yaml.YAMLError):
    """A document whose aliases or nesting would make it far larger than any config."""


def load_yaml(text: str) -> Any:
    """yaml.safe_load, refusing documents that expand past MAX_YAML_VALUES values (aliases of aliases: a few lines
    can stand for billions of values) or nest deeper than MAX_YAML_DEPTH."""
    loader = yaml.SafeLoader(text)
    try:
        try:
            node = loader.get_single_node()
        except RecursionError:
            raise YamlTooLarge(f"nested deeper than {MAX_YAML_DEPTH} levels") from None
        if node is None:
            return None
        _count_values(node, {}, set(), 0)
        return loader.construct_document(node)
    finally:
        loader.dispose()


def _count_values(node: yaml.Node, counted: dict[int, int], open_nodes: set[int], depth: int) -> int:
    """How many values `node` stands for once every alias is expanded; each node is counted once (memo)."""
    key = id(node)
    if key in counted:
        return counted[key]
    if key in open_nodes:
        raise YamlTooLarge("an alias refers to a node that contains it (a recursive document)")
    if depth > MAX_YAML_DEPTH:
        raise YamlTooLarge(f"nested deeper than {MAX_YAML_DEPTH} levels")
    open_nodes.add(key)
    total = 1
    if isinstance(node, yaml.MappingNode):
        for name, value in node.value:
            total += _count_values(name, counted, open_nodes, depth + 1)
            total += _count_values(value, counted, open_nodes, depth + 1)
    elif isinstance(node, yaml.SequenceNode):
        for item in node.value:
            total += _count_values(item, counted, open_nodes, depth + 1)
    if total > MAX_YAML_VALUES:
        raise YamlTooLarge(f"stands for more than {MAX_YAML_VALUES:,} values once its aliases are expanded")
    open_nodes.discard(key)
    counted[key] = total
    return total


def _yaml_on_key(raw: Any) -> Any:
    """YAML 1.1 (PyYAML) reads a bare `on:` key as the boolean true: give pushgateway.on its name back."""
    if isinstance(raw, Mapping) and any(key is True for key in raw):
        return {"on" if key is True else key: value for key, value in raw.items()}
    return raw


def _unwrap(data: Any, where: str, problems: list[str]) -> dict[str, Any]:
    if not isinstance(data, Mapping):
        problems.append(
            f"{where}: expected a mapping with a monitor_config key (or a bare mapping of its keys), "
            f"got {type(data).__name__}"
        )
        return {}
    # A MindSpore Transformers run YAML: its other top-level keys are its own (docs/mindformers.md).
    run_config = bool(mindformers_keys.RUN_CONFIG_KEYS.intersection(map(str, data)))
    if "monitor_config" in data or run_config:
        extra = [k for k in data if k != "monitor_config"]
        if extra and not run_config:
            problems.append(
                f"{where}: only the top-level key monitor_config is read; unexpected {sorted(map(str, extra))}"
            )
        inner = data.get("monitor_config")
        if inner is None:
            return {}
        if not isinstance(inner, Mapping):
            problems.append(f"{where}: monitor_config must be a mapping, got {type(inner).__name__}")
            return {}
        return {str(k): v for k, v in inner.items()}
    return {str(k): v for k, v in data.items()}


# MS_EXPORTER_* variables that are not config keys: `ms-exporter top` reads its password from this one.
OTHER_ENV_NAMES = ("MS_EXPORTER_TOP_PASSWORD",)


def _unknown_env_names() -> list[str]:
    """A misspelt MS_EXPORTER_* variable is an error, as a misspelt key in the file is: silently ignored, it would
    leave the setting it meant at its default."""
    known = [ENV_PREFIX + key.upper() for key in KEYS]
    found = []
    for name in sorted(os.environ):
        if name.startswith(ENV_PREFIX) and name not in known and name not in OTHER_ENV_NAMES:
            close = _close(name, known)
            hint = f"did you mean {close}? " if close else ""
            found.append(
                f"environment variable {name}: not a monitor_config key; {hint}the variables are "
                f"{ENV_PREFIX}<KEY> for the top-level keys: {', '.join(k.upper() for k in KEYS)}"
            )
    return found


def _env_values() -> dict[str, str]:
    values = {}
    for key in KEYS:
        text = os.environ.get(ENV_PREFIX + key.upper())
        if text is not None:
            values[key] = text
    return values


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


# Environment values of these keys stay verbatim (a project named "1e3" stays a string); list keys take `a,b`.
_STRING_KEYS = tuple(f.name for f in dataclasses.fields(MonitorConfig) if f.type in ("str", "str | None"))
_LIST_KEYS = tuple(f.name for f in dataclasses.fields(MonitorConfig) if str(f.type).startswith("tuple["))


def _parse_env(key: str, text: str) -> Any:
    """Environment values are YAML scalars or flow collections; list keys also take `a,b`."""
    try:
        value = load_yaml(text)
    except yaml.YAMLError:
        return text
    if key in _LIST_KEYS and isinstance(value, str) and "," in value:
        return [part.strip() for part in value.split(",") if part.strip()]
    if key in _STRING_KEYS and value is not None:
        return text
    if key == "pushgateway":
        return _yaml_on_key(value)
    return value
