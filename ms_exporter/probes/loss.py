"""The loss: last value, a smoothed mean, how long it has been rising, and how often it was NaN/Inf."""

from __future__ import annotations

import math
from collections import deque

from ms_exporter import catalogue
from ms_exporter.monitor.sample import StepSample
from ms_exporter.monitor.store import MetricStore
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
        self._loss = store.register(catalogue.LOSS).series()
        self._smoothed = store.register(catalogue.LOSS_SMOOTHED).series()
        self._rising = store.register(catalogue.LOSS_RISING).series()
        self._nonfinite = store.register(catalogue.NONFINITE_LOSS).series()
        self._window: deque[float] = deque(maxlen=window)
        self._previous: float | None = None

    def on_step(self, sample: StepSample) -> None:
        loss = sample.loss
        if loss is None:
            return
        self._loss.value = loss
        if not math.isfinite(loss):
            # A NaN is not "higher" than anything: count it, keep the rising streak and the window as they were.
            self._nonfinite.value += sample.steps
            return
        self._window.append(loss)
        self._smoothed.value = sum(self._window) / len(self._window)
        if self._previous is not None and loss > self._previous:
            self._rising.value += 1
        else:
            self._rising.value = 0
        self._previous = loss
