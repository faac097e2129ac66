"""The alert thresholds a user's monitor_config implies: thresholds.DEFAULTS moved by the config's own settings.

Apart from ms_exporter/core/thresholds.py so that the thresholds import nothing of the config, which reads its
defaults there: config -> thresholds, never back.
"""

from __future__ import annotations

from typing import Any

from ms_exporter.config import MonitorConfig
from ms_exporter.core.thresholds import Thresholds


def thresholds_of(config: MonitorConfig) -> Thresholds:
    """The alert thresholds the user's warn_on_value, grad_norm, layernorm, goodput, failslow and flops sections
    imply; the exploding gradient norm follows grad_norm.threshold (thresholds.EXPLODING_FACTOR times it)."""
    changes: dict[str, Any] = {}
    bounds = config.warn_on_value
    for key, field_name, direction in (
        ("loss", "loss_high", "max"),
        ("tokens_per_second", "tokens_per_second_low", "min"),
        ("memory_growth_ratio", "memory_growth_ratio", "max"),
    ):
        if key in bounds and bounds[key].direction == direction:
            changes[field_name] = bounds[key].value
    if config.grad_norm.threshold is not None:
        changes["grad_norm_high"] = config.grad_norm.threshold
    if config.layernorm.drift_threshold is not None:
        changes["layernorm_drift"] = config.layernorm.drift_threshold
    changes["update_ratio_frozen_fraction"] = config.update_ratio.frozen_fraction
    changes["goodput_low"] = config.goodput.alert_below
    changes["failslow_relative"] = config.failslow.alert_below
    if config.flops.enable:
        changes["mfu_low"] = config.flops.alert_below
    return Thresholds(**changes)
