"""Every default threshold, in one place: the config's defaults, the alerting rules and the dashboard read them.

docs/alerts.md explains each number. A user's monitor_config moves some of them
(`ms_exporter.config.alert_thresholds.thresholds_of`): warn_on_value bounds, grad_norm.threshold,
layernorm.drift_threshold, goodput.alert_below and flops.alert_below; the rest are changed by editing the rendered
rules. This module imports nothing of the package, so that the config can read its defaults here.
"""

from __future__ import annotations

from dataclasses import dataclass

# An exploding gradient norm is this many times the "high" one.
EXPLODING_FACTOR = 10.0
# The snapshot and rollback actions: a loss above this many times the smoothed loss is a spike (no alert reads it).
LOSS_SPIKE_FACTOR = 3.0
# The health score's hardware term falls from 1 at device_hot_celsius to 0 this many degrees above it.
HOT_TO_ZERO_CELSIUS = 15.0
# data_quality (docs/data-quality.md): a measured batch whose quantity is below this share of its baseline is low,
# and this many low batches in a row are a drop (the strategy-container article's "entropy low 5 steps in a row"). The
# rank compares; MindSporeTrainingDataQualityDrop reads its flag, so no rule repeats these numbers.
DATA_QUALITY_DROP_RATIO = 0.5
DATA_QUALITY_STREAK = 5
# The pictures (the live page and `ms-exporter top`; docs/live.md, docs/top.md): a rank with no step for longer than
# STALL_CYCLES times its recent step cycle, and at least STALL_FLOOR_SECONDS (a step is published within a second and
# the page polls every 2 s), shows "stalled" in amber, in red once its phase is past its hang deadline (the rank's
# own, MindSporeTrainingStalled's rule); the values of its last step are then greyed as stale. ms_exporter/core/stall.py
# decides it for both; no alert reads these.
STALL_CYCLES = 3.0
STALL_FLOOR_SECONDS = 5.0


@dataclass(frozen=True)
class Thresholds:
    """Every number the alerts compare with."""

    loss_high: float = 50.0
    grad_norm_high: float = 10.0
    # None: EXPLODING_FACTOR x grad_norm_high, resolved at construction (a number given here stands as given).
    grad_norm_exploding: float = None  # type: ignore[assignment]
    tokens_per_second_low: float = 1000.0
    # ThroughputDrop: the recent level below this share of the run's own recent best (0.6: a 2x drop pages).
    throughput_drop_ratio: float = 0.6
    memory_growth_ratio: float = 0.3
    # MemoryGrowth: still growing at least this fast (bytes/s, the least-squares slope of the recent samples).
    memory_growth_rate: float = 2**20 / 60  # 1 MiB a minute: 1.4 GiB a day
    loss_rising_steps: int = 5
    overflow_fraction: float = 0.5
    layernorm_drift: float = 0.3
    # LayerFrozen: a layer whose update ratio is under this share of its rank's median layer's (the TensorBoard
    # article's classification head that barely moved while the loss fell).
    update_ratio_frozen_fraction: float = 0.01
    # A rank the job waits for: its data wait (or step cycle) over this many times the job's median ...
    straggler_factor: float = 1.5
    # ... and, for the data wait, at least this share of its step cycle.
    straggler_wait_fraction: float = 0.2
    # FailSlow: a flagged rank whose relative slowness score is under this (its own work adds more than ~5% to the
    # job's cycle over the best rank's: failslow.alert_below).
    failslow_relative: float = 0.95
    # GoodputLow: productive time under this share of all the project's time in the last hour (goodput.alert_below).
    goodput_low: float = 0.5
    # MfuLow: the project's model FLOPs utilisation under this (flops.alert_below); None: no such alert.
    mfu_low: float | None = None
    # DeviceHot: an accelerator at or above this temperature (°C). Data-centre GPUs and Ascend 910s begin to slow
    # down a few degrees above it (docs/hardware.md); the health score's hardware term is 0 at HOT_TO_ZERO above.
    device_hot_celsius: float = 85.0

    def __post_init__(self) -> None:
        if self.grad_norm_exploding is None:
            object.__setattr__(self, "grad_norm_exploding", self.grad_norm_high * EXPLODING_FACTOR)


DEFAULTS = Thresholds()
