"""The loss: last value, a smoothed mean, how long it has been rising, and how often it was NaN/Inf."""

from __future__ import annotations

import math
from collections import deque

from ms_exporter.core import catalogue
from ms_exporter.core.part import PartContext
from ms_exporter.core.probe import Probe
from ms_exporter.core.registry import ProbeEntry
from ms_exporter.core.sample import StepSample
from ms_exporter.core.store import MetricStore, Series


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
        self._families = (
            store.register(catalogue.LOSS),
            store.register(catalogue.LOSS_SMOOTHED),
            store.register(catalogue.LOSS_RISING),
        )
        self._loss: Series | None = None
        self._smoothed: Series | None = None
        self._rising: Series | None = None
        self._nonfinite = store.register(catalogue.NONFINITE_LOSS).series()
        self._window: deque[float] = deque(maxlen=window)
        self._previous: float | None = None
        self._at_good_state: tuple[int, list[float], float | None] | None = None  # (step, window, previous)

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

    def on_good_state(self, step: int) -> None:
        self._at_good_state = (step, list(self._window), self._previous)

    def on_rollback(self, good_step: int) -> None:
        """The smoothed loss goes back to what it was at the good state: the spike that caused the rollback (and
        the steps before it) would otherwise stay in the mean for `loss_window` steps, raising the bar the next
        spike has to clear and keeping the health score low."""
        if self._at_good_state is None or self._at_good_state[0] != good_step:
            return
        _, window, self._previous = self._at_good_state
        self._window.clear()
        self._window.extend(window)
        if self._smoothed is not None and self._rising is not None:
            self._smoothed.value = sum(window) / len(window) if window else math.nan
            self._rising.value = 0


def build(context: PartContext) -> list[Probe]:
    return [LossProbe(context.store, context.config.loss_window)]


PART = ProbeEntry("loss", build, ("loss",), order=40)
