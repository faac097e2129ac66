"""The loss: last value, a smoothed mean, how long it has been rising, and how often it was NaN/Inf."""

from __future__ import annotations

import math
from collections import deque

from ms_exporter import catalogue
from ms_exporter.monitor.sample import StepSample
from ms_exporter.monitor.store import MetricStore, Series
from ms_exporter.probes.base import Probe


class LossProbe(Probe):
    """Reads nothing itself: the callback already read the loss once into the sample.

    | name | type | labels | unit |
    |---|---|---|---|
    | mindspore_train_loss | gauge | | loss units (NaN/Inf exported as is) |
    | mindspore_train_loss_smoothed | gauge | | mean of the last `loss_window` finite losses |
    | mindspore_train_loss_consecutive_increases | gauge | | steps |
    | mindspore_train_nonfinite_loss_total | counter | | steps |
    """

    name = "loss"

    def __init__(self, store: MetricStore, window: int) -> None:
        # The gauges appear with the first loss read (the first finite one for the smoothed loss and the streak):
        # before that a 0 would be a loss nobody measured. The count of non-finite steps is 0 from the start.
        self._families = (store.register(catalogue.LOSS), store.register(catalogue.LOSS_SMOOTHED),
                          store.register(catalogue.LOSS_RISING))
        self._loss: Series | None = None
        self._smoothed: Series | None = None
        self._rising: Series | None = None
        self._nonfinite = store.register(catalogue.NONFINITE_LOSS).series()
        self._window: deque[float] = deque(maxlen=window)
        self._previous: float | None = None

    def on_step(self, sample: StepSample) -> None:
        loss = sample.loss
        if loss is None:
            return
        if self._loss is None:
            self._loss = self._families[0].series()
        self._loss.value = loss
        if not math.isfinite(loss):
            # A NaN is not "higher" than anything: count it, keep the rising streak and the window as they were.
            self._nonfinite.value += sample.steps
            return
        smoothed, rising = self._smoothed, self._rising
        if smoothed is None or rising is None:
            smoothed = self._smoothed = self._families[1].series()
            rising = self._rising = self._families[2].series()
        self._window.append(loss)
        smoothed.value = sum(self._window) / len(self._window)
        if self._previous is not None and loss > self._previous:
            rising.value += 1
        else:
            rising.value = 0
        self._previous = loss
