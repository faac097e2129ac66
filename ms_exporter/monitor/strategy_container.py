"""The strategy-container article's container, `TransformersMonitorCallback(strategies, config)`: the monitor,
with each strategy object run as a probe of its own (probes/strategies.py; docs/strategies.md)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ms_exporter.config import ConfigError
from ms_exporter.config.article_strategies import ArticleStrategy, settings_of
from ms_exporter.config.walker import shown_value
from ms_exporter.core.part import PartContext
from ms_exporter.monitor.callback import TrainingMonitor
from ms_exporter.probes.strategies import StrategyProbe


class TransformersMonitorCallback(TrainingMonitor):
    """`TrainingMonitor(config)` plus `strategies`: objects with `on_step_end(metrics, cb_params)` (an
    ms_exporter.Strategy, or a class written as the article writes one). `config` is what TrainingMonitor takes;
    the article's own dict (log_path, enable_hardware_monitor, strategies by name) is read as it means.

    The article's built-in classes (`LossMonitorStrategy(config)` ...; config/article_strategies.py) are read as
    the settings their YAML entries stand for, given as keywords: where the file says otherwise they win, as the
    article's container runs its objects whatever the file's `strategies:` say. A keyword of yours that sets the
    same key to another value is a ConfigError."""

    def __init__(self, strategies: Sequence[Any] = (), config: Any = None, **overrides: Any) -> None:
        if isinstance(strategies, (str, bytes)) or not isinstance(strategies, Sequence):
            raise ConfigError([f"strategies: must be a list of strategy objects, got {type(strategies).__name__}"])
        # type(), not isinstance: a user's object may answer __class__ with anything, or raise.
        builtin = [item for item in strategies if issubclass(type(item), ArticleStrategy)]
        strategies = [item for item in strategies if not issubclass(type(item), ArticleStrategy)]
        if builtin:
            settings, problems = settings_of(builtin)
            problems += _clashes(settings, overrides, "")
            if problems:
                raise ConfigError(problems)
            overrides = _merged(overrides, settings)
        try:  # the user's objects: a __getattr__ of theirs may raise anything
            lacking = [type(item).__name__ for item in strategies if not callable(getattr(item, "on_step_end", None))]
        except BaseException as exc:
            raise ConfigError([f"strategies: cannot be read: {type(exc).__name__}: {exc!s:.300}"]) from exc
        if lacking:
            raise ConfigError(
                [f"strategies: {', '.join(lacking)} has no on_step_end(metrics, cb_params) (docs/strategies.md)"]
            )
        probes = [*overrides.pop("probes", ()), *(_as_probe(item) for item in strategies)]
        super().__init__(config, probes=probes, **overrides)


def _clashes(settings: dict[str, Any], given: dict[str, Any], path: str) -> list[str]:
    """The keys the strategy objects set that a keyword argument sets to another value."""
    found = []
    for key, value in settings.items():
        if key not in given:
            continue
        where = f"{path}.{key}" if path else key
        if isinstance(value, dict) and isinstance(given[key], dict):
            found += _clashes(value, given[key], where)
        elif given[key] != value and not _same_list(given[key], value):
            found.append(
                f"monitor_config.{where}: given both by a strategy object ({shown_value(value)}) and as the keyword "
                f"argument ({shown_value(given[key])}); give it once"
            )
    return found


def _same_list(one: Any, other: Any) -> bool:
    return isinstance(one, (list, tuple)) and isinstance(other, (list, tuple)) and list(one) == list(other)


def _merged(given: dict[str, Any], settings: dict[str, Any]) -> dict[str, Any]:
    merged = dict(given)
    for key, value in settings.items():
        inner = merged.get(key)
        merged[key] = _merged(inner, value) if isinstance(value, dict) and isinstance(inner, dict) else value
    return merged


def _as_probe(strategy: Any) -> Any:
    def build(context: PartContext) -> StrategyProbe:
        return StrategyProbe(strategy, context)

    return build
