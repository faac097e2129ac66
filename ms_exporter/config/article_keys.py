"""The articles' own configuration forms, read as what they mean (docs/configuration.md, "The articles' forms").

The product comes from three articles on monitoring MindSpore (Transformers) training with callbacks
(docs/articles.md). A user who copies their configuration blocks gets a running monitor: each of their keys that
means one of ours is rewritten into ours before the block is checked, and `read` says how, for the log and
`ms-exporter check-config`. A key given both ways with different values is a problem, as is a form the articles do
not use (an unknown strategy, a callback type that is no monitor).

- The monitor_config article's block: `tensorboard: true` (a switch, where ours is a section) adds the
  `tensorboard` backend; `callback: {type: MindSporeTransformersMonitor, params: {...}}` names the callback class
  and puts its settings under `params`, which are read as the block's own keys.
- The strategy-container article's configuration file: `log_path` (its JSON Lines file), `enable_hardware_monitor`
  and a list of `strategies`, each `{name, config}`, whose built-in names are read as our settings (STRATEGIES).
"""

from __future__ import annotations

import posixpath
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from ms_exporter.config.walker import shown_value

# The callback classes the articles construct; ms_exporter's TrainingMonitor is each of them (ms_exporter.aliases).
MONITOR_CLASSES = ("TrainingMonitor", "MindSporeTransformersMonitor", "TransformersMonitorCallback")

# The strategy-container article's built-in strategies: its name -> (its config key -> our key), and the settings
# the strategy itself stands for (what choosing it switches on).
STRATEGIES: dict[str, tuple[dict[str, str], dict[str, Any]]] = {
    # "loss滑动平均窗口": the window of the smoothed loss.
    "LossMonitorStrategy": ({"window_size": "loss_window"}, {}),
    "GradNormStrategy": ({"monitor_layers": "grad_norm.layers", "threshold": "grad_norm.threshold"}, {}),
    # The article's strategies run at every step end: its patience counts steps.
    "EarlyStoppingStrategy": (
        {"patience": "actions.early_stop.patience", "min_delta": "actions.early_stop.min_delta"},
        {"actions.early_stop.enable": True, "actions.early_stop.unit": "step"},
    ),
    "HardwareHealthStrategy": ({}, {"hardware.enable": True}),
    # Named in its section 6.2 (label entropy per batch, 5 low steps in a row); its keys are our section's own.
    "DataQualityStrategy": (
        {
            key: f"data_quality.{key}"
            for key in ("label_column", "token_column", "vocab_size", "baseline_steps", "drop_ratio", "streak")
        },
        {"data_quality.enable": True},
    ),
}
# Top-level keys of the articles that are one of ours under another name.
RENAMED = {"enable_hardware_monitor": "hardware.enable"}
# The monitor_config article's `callback.params`, and the keys of the block around them. Its build_monitor_callbacks
# hands the class the params alone, so whatever the block says beyond them never reaches the monitor.
CALLBACK_PARAMS = frozenset({"log_level", "warn_on_value"})
BLOCK_KEYS = ("enable", "backend", "project", "interval", "save_dir", "tensorboard", "metrics")


@dataclass
class ArticleReading:
    """What became of the articles' keys in one block."""

    read: list[str] = field(default_factory=list)  # "tensorboard: true -> backend += tensorboard", ...
    origins: dict[str, str] = field(default_factory=dict)  # our key -> the article key it came from
    problems: list[str] = field(default_factory=list)

    def notes(self) -> list[str]:
        """One line per article key, for the log and check-config."""
        return [f"read as the articles mean it: {line}" for line in self.read]


def translate(raw: dict[str, Any]) -> ArticleReading:
    """Rewrite the articles' keys in `raw` (a monitor_config block) into ours, in place."""
    reading = ArticleReading()
    _callback(raw, reading)  # first: its params may hold any of the others
    for theirs, ours in RENAMED.items():
        if theirs in raw:
            _put(raw, reading, ours, raw.pop(theirs), f"monitor_config.{theirs}")
            reading.read.append(f"{theirs} -> {ours}")
    _tensorboard_switch(raw, reading)
    _log_path(raw, reading)
    _strategies(raw, reading)
    return reading


def params_alone(source: Any, backend: Any, interval: float, save_dir: str) -> str | None:
    """What to tell the user when `source`, the settings a monitor was given, is the monitor_config article's
    `callback.params` without its block (`MindSporeTransformersMonitor(cfg["callback"]["params"])`, as its
    build_monitor_callbacks writes it); None for anything else. The block's other keys cannot be seen from here,
    only named: the message says which defaults apply instead and how to hand the whole block over."""
    if not isinstance(source, Mapping) or not source:
        return None
    keys = sorted(map(str, source))
    if set(keys) != CALLBACK_PARAMS:  # both, as the article writes them: a dict of one is as likely a user's own
        return None
    backends = ", ".join(backend) if isinstance(backend, (list, tuple)) else str(backend)
    return (
        f"the settings given hold only {', '.join(keys)}: this looks like the monitor_config article's "
        f"callback.params alone. The block's other keys ({', '.join(BLOCK_KEYS)}) were not given, so the "
        f"monitor runs with backend: {backends}, interval: {interval:g} s, save_dir: {save_dir}, whatever the "
        "block says. Pass the whole block: MindSporeTransformersMonitor(cfg) (or the YAML file's path); its "
        "callback entry is read as well (docs/articles.md)"
    )


def _callback(raw: dict[str, Any], reading: ArticleReading) -> None:
    if "callback" not in raw:
        return
    callback = raw.pop("callback")
    where = "monitor_config.callback"
    if not isinstance(callback, Mapping):
        reading.problems.append(f"{where}: must be a mapping with `type` and `params`, got {shown_value(callback)}")
        return
    extra = sorted(map(str, set(callback) - {"type", "params"}))
    if extra:
        reading.problems.append(f"{where}: unknown key(s) {', '.join(map(str, extra))}; allowed: type, params")
    kind = callback.get("type", MONITOR_CLASSES[0])
    if kind not in MONITOR_CLASSES and str(kind).rsplit(".", 1)[-1] not in MONITOR_CLASSES:
        allowed = ", ".join(MONITOR_CLASSES)
        reading.problems.append(f"{where}.type: {shown_value(kind)} is not a monitor class; allowed: {allowed}")
    params = callback.get("params") or {}
    if not isinstance(params, Mapping):
        reading.problems.append(f"{where}.params: must be a mapping of monitor_config keys, got {shown_value(params)}")
        return
    for key, value in params.items():
        _put(raw, reading, str(key), value, f"{where}.params.{key}")
    reading.read.append(f"callback.type {kind} -> ms_exporter.TrainingMonitor, callback.params -> monitor_config")


def _tensorboard_switch(raw: dict[str, Any], reading: ArticleReading) -> None:
    switch = raw.get("tensorboard")
    if not isinstance(switch, bool):
        return
    del raw["tensorboard"]
    backends = raw.get("backend", ["prometheus"])
    backends = [backends] if isinstance(backends, str) else list(backends) if isinstance(backends, list) else backends
    if not isinstance(backends, list):
        return  # the backend check names it
    if switch and "tensorboard" not in backends:
        raw["backend"] = [*backends, "tensorboard"]
        reading.read.append("tensorboard: true -> backend += tensorboard")
    elif not switch and "tensorboard" in backends:
        reading.problems.append(
            "monitor_config.tensorboard: false, but monitor_config.backend lists tensorboard; give it once"
        )
    elif not switch:
        reading.read.append("tensorboard: false -> no tensorboard backend")


def _log_path(raw: dict[str, Any], reading: ArticleReading) -> None:
    if "log_path" not in raw:
        return
    value = raw.pop("log_path")
    if not isinstance(value, str) or not value.strip():
        reading.problems.append(
            f"monitor_config.log_path: must be the JSON Lines file's path, got {shown_value(value)}"
        )
        return
    where = "monitor_config.log_path"
    folder, name = posixpath.split(value.replace("\\", "/"))
    stem, suffix = posixpath.splitext(name)
    _put(raw, reading, "save_dir", folder or ".", where)
    _put(raw, reading, "jsonl_name", stem if suffix == ".jsonl" else name, where)
    backends = raw.get("backend", ["prometheus"])
    backends = [backends] if isinstance(backends, str) else backends
    if isinstance(backends, list) and "local" not in backends:
        raw["backend"] = [*backends, "local"]
    reading.read.append(
        f"log_path {value} -> backend += local, save_dir {folder or '.'}, "
        f"JSON Lines files {raw.get('jsonl_name')}-rank<N>.jsonl (one per rank)"
    )


def _strategies(raw: dict[str, Any], reading: ArticleReading) -> None:
    """The built-in names are read as our settings; every other entry (a user's strategy by import path, or a
    mistake) stays under `strategies`, where the schema's check judges it."""
    strategies = raw.get("strategies")
    if not isinstance(strategies, (list, tuple)):
        return
    own = []
    for index, strategy in enumerate(strategies):
        name = strategy.get("name") if isinstance(strategy, Mapping) else None
        if not isinstance(name, str) or name not in STRATEGIES:
            own.append(strategy)
            continue
        where = f"monitor_config.strategies[{index}]"
        options = strategy.get("config") or {}
        extra = sorted(map(str, set(strategy) - {"name", "config"}))
        if extra:
            reading.problems.append(f"{where}: unknown key(s) {', '.join(extra)}; allowed: name, config")
        if not isinstance(options, Mapping):
            reading.problems.append(f"{where}.config: must be a mapping, got {shown_value(options)}")
            continue
        keys, implied = STRATEGIES[name]
        unknown = sorted(map(str, set(options) - set(keys)))
        if unknown:
            allowed = ", ".join(keys) or "none"
            reading.problems.append(f"{where}.config: unknown key(s) {', '.join(unknown)}; allowed: {allowed}")
        became = []
        for key, value in implied.items():
            _put(raw, reading, key, value, f"{where} {name}")
            became.append(f"{key}: {_shown(value)}")
        for theirs, ours in keys.items():
            if theirs in options:
                _put(raw, reading, ours, options[theirs], f"{where}.config.{theirs}")
                became.append(ours)
        reading.read.append(f"strategies[{index}] {name} -> {', '.join(became) or 'always on'}")
    if own:
        raw["strategies"] = own
        for strategy in own:
            if isinstance(strategy, Mapping) and isinstance(strategy.get("name"), str):
                reading.read.append(f"strategies {strategy['name']} -> your own strategy (docs/strategies.md)")
    else:
        del raw["strategies"]


def _put(raw: dict[str, Any], reading: ArticleReading, path: str, value: Any, where: str) -> None:
    """Set `path` (a.b.c) in raw to value; a different value already there is a problem (given both ways)."""
    node = raw
    *sections, key = path.split(".")
    for section in sections:
        inner = node.get(section)
        if inner is None:
            inner = node[section] = {}
        elif not isinstance(inner, dict):
            if not isinstance(inner, Mapping):
                return  # the section check names it
            inner = node[section] = dict(inner)
        node = inner
    if key in node and node[key] != value and _as_list(node[key]) != _as_list(value):
        reading.problems.append(
            f"monitor_config.{path}: given both as {where} ({_shown(value)}) and as {_shown(node[key])}; give it once"
        )
        return
    node[key] = value
    reading.origins[path] = where


def _as_list(value: Any) -> Any:
    return list(value) if isinstance(value, (list, tuple)) else value


def _shown(value: Any) -> str:
    return str(value).lower() if isinstance(value, bool) else shown_value(value)
