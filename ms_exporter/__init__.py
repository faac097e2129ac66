"""ms_exporter: Prometheus metrics, alerts and dashboards for MindSpore training runs."""

from __future__ import annotations

import importlib.util
from typing import TYPE_CHECKING, Any

from ms_exporter._version import __version__
from ms_exporter.config import ConfigError, MonitorConfig, load_config

if TYPE_CHECKING:
    from ms_exporter.cells.train_cells import GradNormTrainOneStepCell, LossScaleTrainOneStepCell
    from ms_exporter.config.article_strategies import (
        DataQualityStrategy,
        EarlyStoppingStrategy,
        GradNormStrategy,
        HardwareHealthStrategy,
        LossMonitorStrategy,
    )
    from ms_exporter.monitor.callback import TrainingMonitor
    from ms_exporter.monitor.strategy_container import TransformersMonitorCallback
    from ms_exporter.probes.strategies import Strategy

    MindSporeTransformersMonitor = TrainingMonitor

__all__ = [
    "ConfigError",
    "DataQualityStrategy",
    "EarlyStoppingStrategy",
    "GradNormStrategy",
    "GradNormTrainOneStepCell",
    "HardwareHealthStrategy",
    "LossMonitorStrategy",
    "LossScaleTrainOneStepCell",
    "MindSporeTransformersMonitor",
    "MissingDependencyError",
    "MonitorConfig",
    "Strategy",
    "TrainingMonitor",
    "TransformersMonitorCallback",
    "__version__",
    "load_config",
]

# What the `mindspore` extra installs (pyproject.toml); the base install serves only the operator commands.
_TRAINING_SIDE = {"mindspore": "MindSpore", "numpy": "numpy", "psutil": "psutil"}
_TRAINING_INSTALL = "pip install 'ms-exporter[mindspore]' (or pip install mindspore 'numpy<2' psutil)"


_ARTICLE_STRATEGIES = (
    "LossMonitorStrategy",
    "GradNormStrategy",
    "EarlyStoppingStrategy",
    "HardwareHealthStrategy",
    "DataQualityStrategy",
)


class MissingDependencyError(ImportError):
    """The training side (MindSpore, numpy, psutil) is not installed; the message says what to install."""


def _require_training_side(user: str) -> None:
    """Raise MissingDependencyError naming what `user` needs and lacks, before any half-done import."""
    missing = [name for name in _TRAINING_SIDE if importlib.util.find_spec(name) is None]
    if missing:
        names = [_TRAINING_SIDE[name] for name in missing]
        names_text = names[0] if len(names) == 1 else ", ".join(names[:-1]) + " and " + names[-1]
        verb = "is" if len(missing) == 1 else "are"
        raise MissingDependencyError(
            f"{user} needs {names_text}, which {verb} not installed here: {_TRAINING_INSTALL}", name=missing[0]
        )


def __getattr__(name: str) -> Any:
    # Importing MindSpore takes seconds and the base install has none: only these need it, so the operator
    # commands (check-config, rules, top ...) stay fast and work on a machine without it.
    # The monitor_config article's class name (its `callback.type`): the same class, not a copy (docs/articles.md).
    if name in ("TrainingMonitor", "MindSporeTransformersMonitor"):
        _require_training_side(name)
        from ms_exporter.monitor.callback import TrainingMonitor

        return TrainingMonitor
    if name == "TransformersMonitorCallback":  # the strategy-container article's container (docs/articles.md)
        _require_training_side(name)
        from ms_exporter.monitor.strategy_container import TransformersMonitorCallback

        return TransformersMonitorCallback
    if name == "Strategy":  # a measurement of your own (docs/strategies.md); needs no MindSpore to subclass
        from ms_exporter.probes.strategies import Strategy

        return Strategy
    if name in _ARTICLE_STRATEGIES:  # the strategy-container article's built-in strategy classes: our settings
        from ms_exporter.config import article_strategies

        return getattr(article_strategies, name)
    if name in ("GradNormTrainOneStepCell", "LossScaleTrainOneStepCell"):
        _require_training_side(name)
        from ms_exporter.cells import train_cells

        return getattr(train_cells, name)
    raise AttributeError(f"module 'ms_exporter' has no attribute {name!r}")
