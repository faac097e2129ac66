"""The first source article's strategy container, `TransformersMonitorCallback(strategies, config)`: the monitor,
with each strategy object run as a probe of its own (probes/strategies.py; docs/strategies.md)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ms_exporter.config import ConfigError
from ms_exporter.core.part import PartContext
from ms_exporter.monitor.callback import TrainingMonitor
from ms_exporter.probes.strategies import StrategyProbe


class TransformersMonitorCallback(TrainingMonitor):
    """`TrainingMonitor(config)` plus `strategies`: objects with `on_step_end(metrics, cb_params)` (an
    ms_exporter.Strategy, or a class written as the article writes one). `config` is what TrainingMonitor takes;
    the article's own dict (log_path, enable_hardware_monitor, strategies by name) is read as it means."""

    def __init__(self, strategies: Sequence[Any] = (), config: Any = None, **overrides: Any) -> None:
        if isinstance(strategies, (str, bytes)) or not isinstance(strategies, Sequence):
            raise ConfigError([f"strategies: must be a list of strategy objects, got {type(strategies).__name__}"])
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


def _as_probe(strategy: Any) -> Any:
    def build(context: PartContext) -> StrategyProbe:
        return StrategyProbe(strategy, context)

    return build
