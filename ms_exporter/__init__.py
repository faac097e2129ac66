"""ms_exporter: Prometheus metrics, alerts and dashboards for MindSpore training runs."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ms_exporter._version import __version__
from ms_exporter.config import ConfigError, MonitorConfig, load_config

if TYPE_CHECKING:
    from ms_exporter.monitor.callback import TrainingMonitor
    from ms_exporter.monitor.train_cells import GradNormTrainOneStepCell, LossScaleTrainOneStepCell

__all__ = ["ConfigError", "GradNormTrainOneStepCell", "LossScaleTrainOneStepCell", "MonitorConfig",
           "TrainingMonitor", "__version__", "load_config"]


def __getattr__(name: str) -> Any:
    # Importing MindSpore takes seconds: only these need it, so `ms-exporter check-config` stays fast.
    if name == "TrainingMonitor":
        from ms_exporter.monitor.callback import TrainingMonitor

        return TrainingMonitor
    if name in ("GradNormTrainOneStepCell", "LossScaleTrainOneStepCell"):
        from ms_exporter.monitor import train_cells

        return getattr(train_cells, name)
    raise AttributeError(f"module 'ms_exporter' has no attribute {name!r}")
