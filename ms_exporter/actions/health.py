"""The health score: how healthy a step looks, 0 to 1, from four terms (docs/rollback.md#the-health-score).

- loss: the smoothed loss now against its value `span` steps ago: 1 while it falls or holds, falling linearly to 0
  at a rise of LOSS_RISE_AT_ZERO (50%); 0 for a non-finite loss.
- gradient norm: 1 up to `grad_high` (grad_norm.threshold), falling linearly to 0 at `grad_exploding` (10 x that);
  0 when non-finite; 1 while no norm was read (no evidence against).
- memory: 1 - (memory growth ratio / its alert threshold), clamped to [0, 1]; 1 while unknown.
- hardware (the strategy-container article's "hardware temperature"): the hottest accelerator this rank reads, 1 up to
  `device_hot_celsius` (DeviceHot's threshold), falling linearly to 0 at HOT_TO_ZERO_CELSIUS above it; 1 while no
  accelerator is read (a CPU-only rank: a host CPU's thermal limits are its own business).

The score is the worst of the four. Loss and gradient norm are the same on every replica (an all-reduced loss,
the norm of all-reduced gradients); memory and hardware are not, so `replica_score` leaves them out for decisions
that every rank of a data-parallel job must take alike.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass

from ms_exporter.core import catalogue
from ms_exporter.core.device.reading import HOST
from ms_exporter.core.store import MetricStore
from ms_exporter.core.thresholds import DEFAULTS, HOT_TO_ZERO_CELSIUS

LOSS_RISE_AT_ZERO = 0.5


@dataclass(frozen=True)
class Health:
    loss: float
    grad: float
    memory: float
    hardware: float = 1.0

    @property
    def score(self) -> float:
        return min(self.loss, self.grad, self.memory, self.hardware)

    @property
    def replica_score(self) -> float:
        return min(self.loss, self.grad)


def hottest_accelerator(store: MetricStore) -> float:
    """The highest temperature the hardware monitor read on this rank's accelerators (not the host); NaN if none.
    A lock-free read of the gauges the hardware thread writes: a step sees the last full reading or the one before."""
    readings = [
        series.value
        for series in store.series_of(catalogue.DEVICE_TEMPERATURE)
        if ("device", HOST) not in series.labels
    ]
    return max(readings, default=math.nan)


def _falling(value: float, full: float, zero: float) -> float:
    """1 at or below `full`, 0 at or above `zero`, linear between."""
    if value <= full:
        return 1.0
    if value >= zero:
        return 0.0
    return (zero - value) / (zero - full)


class HealthScore:
    def __init__(
        self,
        span: int,
        grad_high: float,
        grad_exploding: float,
        memory_growth_limit: float,
        hot_celsius: float = DEFAULTS.device_hot_celsius,
    ) -> None:
        self._smoothed: deque[float] = deque(maxlen=span + 1)
        self._grad_high = grad_high
        self._grad_exploding = max(grad_exploding, grad_high * (1 + 1e-9))
        self._memory_limit = memory_growth_limit
        self._hot = hot_celsius

    def observe(
        self,
        loss: float | None,
        smoothed: float,
        grad_norm: float,
        memory_growth: float,
        device_temperature: float = math.nan,
    ) -> Health:
        """One step: its loss, the smoothed loss after it, the last gradient norm read, the memory growth ratio and
        the hottest accelerator's temperature in °C (NaN where not measured)."""
        if math.isfinite(smoothed):
            self._smoothed.append(smoothed)
        return Health(
            self._loss_term(loss),
            self._grad_term(grad_norm),
            self._memory_term(memory_growth),
            self._hardware_term(device_temperature),
        )

    def restart(self) -> None:
        """Training went back to a good state: the trend of the path it left says nothing of the one it takes."""
        self._smoothed.clear()

    def _loss_term(self, loss: float | None) -> float:
        if loss is not None and not math.isfinite(loss):
            return 0.0
        if len(self._smoothed) < 2 or self._smoothed[0] == 0:
            return 1.0
        rise = (self._smoothed[-1] - self._smoothed[0]) / abs(self._smoothed[0])
        return _falling(rise, 0.0, LOSS_RISE_AT_ZERO)

    def _grad_term(self, grad_norm: float) -> float:
        if math.isnan(grad_norm):
            return 1.0
        if math.isinf(grad_norm):
            return 0.0
        return _falling(grad_norm, self._grad_high, self._grad_exploding)

    def _memory_term(self, growth: float) -> float:
        if not math.isfinite(growth):
            return 1.0
        return _falling(growth, 0.0, self._memory_limit)

    def _hardware_term(self, temperature: float) -> float:
        if math.isnan(temperature):
            return 1.0
        return _falling(temperature, self._hot, self._hot + HOT_TO_ZERO_CELSIUS)
