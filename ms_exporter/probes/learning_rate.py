"""The learning rate the optimizer used for the step that just ended, per parameter group.

Where it is read from, in order (docs/metrics.md#learning-rate):
1. the train cell's outputs, when the cell returns the LR it applied (MindSpore Transformers' cells do);
2. a fixed LR or a list LR: the optimizer's Parameter, read (nothing is called);
3. a schedule the monitor may evaluate itself: MindSpore's own (`mindspore.nn.learning_rate_schedule`), whose
   construct computes from the step only, or a class named in `pure_lr_schedules`.
Any other schedule is user code that may keep state between calls (a counter, a plateau detector): calling it
would change the training it watches, so it is never called, and without (1) no LR is exported.
"""

from __future__ import annotations

import functools
import logging
import time
from collections.abc import Callable
from typing import Any

import numpy as np

from ms_exporter.core import catalogue
from ms_exporter.core.cb_params import step_of
from ms_exporter.core.device.optimizer_step import find_optimizer, step_offset
from ms_exporter.core.part import PartContext
from ms_exporter.core.probe import Probe
from ms_exporter.core.registry import ProbeEntry
from ms_exporter.core.sample import StepSample, read_scalar
from ms_exporter.core.store import MetricStore, Series

logger = logging.getLogger("ms_exporter")

TABLE_STEPS = 1024  # schedule values evaluated per device call
FIXED_REFRESH_SECONDS = 1.0  # a plain LR Parameter is re-read at most this often
SCALAR_REFRESH_SECONDS = 1.0  # a schedule that cannot be evaluated on a step vector: at most this often
PURE_SCHEDULE_MODULES = frozenset({"mindspore.nn.learning_rate_schedule"})


class LearningRateProbe(Probe):
    """Evaluates a LearningRateSchedule for 1024 steps in one call and looks the step up on the host.

    Evaluating a schedule cell costs 0.3 ms (GRAPH) to 3 ms (PYNATIVE) per call, too much for every step;
    MindSpore's schedules are element-wise in the step, so one call over a vector of steps gives the same
    numbers. A list LR is read once as the array it is. The first table is checked against a scalar call; a
    schedule that is not element-wise falls back to a scalar call at most once a second.

    | name | type | labels | unit |
    |---|---|---|---|
    | mindspore_train_learning_rate | gauge | group (only with several groups) | LR |
    | mindspore_train_learning_rate_scheduled | gauge | group (likewise) | 1 for a schedule or list, 0 for a fixed LR |
    """

    name = "learning_rate"

    def __init__(self, store: MetricStore, pure_schedules: tuple[str, ...] = ()) -> None:
        self._family = store.register(catalogue.LEARNING_RATE)
        self._scheduled = store.register(catalogue.LEARNING_RATE_SCHEDULED)
        self._pure_schedules = frozenset(pure_schedules)
        self._readers: list[_Reader] = []
        self._groups = 1
        self._applied: Series | None = None  # the LR from the cell's outputs (one group only)
        self._optimizer: Any = None
        self._offset = 0

    def on_train_begin(self, cb_params: Any) -> None:
        self._readers = []
        self._groups = 1
        self._optimizer = find_optimizer(cb_params)
        if self._optimizer is None:
            logger.warning(
                "ms_exporter: no optimizer in cb_params; %s is exported only if the train cell returns "
                "the learning rate",
                catalogue.LEARNING_RATE.name,
            )
            return
        # The optimizer's own step counter may differ from cur_step_num (resumed runs): read it once.
        step = step_of(cb_params)
        self._offset = step_offset(cb_params)
        rates = self._optimizer.learning_rate
        groups = list(rates) if getattr(self._optimizer, "is_group_lr", False) else [rates]
        self._groups = len(groups)
        for index, rate in enumerate(groups):
            labels = {"group": str(index)} if len(groups) > 1 else {}
            reader = _reader_for(rate, functools.partial(self._family.series, **labels), self._pure_schedules)
            # No reader: a schedule the monitor may not call, which is still a schedule.
            self._scheduled.series(**labels).value = 0.0 if isinstance(reader, _FixedReader) else 1.0
            if reader is not None:
                self._readers.append(reader)
        # Read once now: a schedule's first evaluation compiles it (~0.1 s), which belongs to start-up, not to a step.
        for reader in self._readers:
            reader.update(step + self._offset, time.perf_counter())

    def on_step(self, sample: StepSample) -> None:
        index = sample.layout.learning_rate
        if index is not None and self._groups == 1:
            applied = read_scalar(sample.outputs[index])
            if applied is not None:  # what the cell applied: exact, and nobody's code was called for it
                if self._applied is None:
                    self._applied = self._family.series()
                self._applied.value = applied
                return
        if not self._readers:
            return
        # global_step has already advanced at step end: the step just taken used index step - 1.
        used = sample.step + self._offset - 1
        for reader in self._readers:
            reader.update(used, sample.monotonic)

    def on_train_end(self, step: int, completed: bool) -> None:
        self._optimizer = None

    def set_scale(self, scale: float) -> None:
        """lr_backoff scaled the optimizer's learning rate: report the LR the optimizer now uses."""
        for reader in self._readers:
            reader.rescaled(scale)


class _Reader:
    # lr_backoff's scale on a schedule (a fixed LR Parameter is rewritten in place and read as it is).
    scale = 1.0

    def update(self, step: int, now: float) -> None:
        raise NotImplementedError

    def rescaled(self, scale: float) -> None:
        self.scale = scale


class _FixedReader(_Reader):
    def __init__(self, parameter: Any, series: Series) -> None:
        self._parameter = parameter
        self._series = series
        self._read_at = -float("inf")

    def update(self, step: int, now: float) -> None:
        if now - self._read_at >= FIXED_REFRESH_SECONDS:
            self._read_at = now
            self._series.value = float(np.asarray(self._parameter.asnumpy()).reshape(-1)[0])

    def rescaled(self, scale: float) -> None:
        self._read_at = -float("inf")  # the Parameter was just rewritten: read it at the next step


class _ListReader(_Reader):
    def __init__(self, values: np.ndarray, series: Series) -> None:
        self._values = values
        self._series = series

    def update(self, step: int, now: float) -> None:
        if 0 <= step < len(self._values):
            self._series.value = float(self._values[step]) * self.scale


class _ScheduleReader(_Reader):
    def __init__(self, schedule: Any, series: Series) -> None:
        self._schedule = schedule
        self._series = series
        self._start = 0
        self._table: np.ndarray | None = None
        self._elementwise: bool | None = None
        self._read_at = -float("inf")

    def update(self, step: int, now: float) -> None:
        step = max(step, 0)
        if self._elementwise is False:
            if now - self._read_at >= SCALAR_REFRESH_SECONDS:
                self._read_at = now
                self._series.value = self._scalar(step) * self.scale
            return
        table = self._table
        if table is None or not self._start <= step < self._start + len(table):
            table = self._fill(step)
            if table is None:
                self._series.value = self._scalar(step) * self.scale
                return
        self._series.value = float(table[step - self._start]) * self.scale

    def _fill(self, step: int) -> np.ndarray | None:
        from mindspore import Tensor

        steps = np.arange(step, step + TABLE_STEPS, dtype=np.int32)
        try:
            table = np.asarray(self._schedule(Tensor(steps)).asnumpy(), dtype=np.float64).reshape(-1)
        except Exception:
            table = None
        if self._elementwise is None:
            ok = table is not None and table.shape == (TABLE_STEPS,) and np.isclose(table[0], self._scalar(step))
            self._elementwise = bool(ok)
            if not ok:
                logger.info(
                    "ms_exporter: the learning-rate schedule %s is not element-wise in the step; reading "
                    "it at most every %.0f s",
                    type(self._schedule).__name__,
                    SCALAR_REFRESH_SECONDS,
                )
                return None
        if table is None or table.shape != (TABLE_STEPS,):
            self._elementwise = False
            return None
        self._start, self._table = step, table
        return table

    def _scalar(self, step: int) -> float:
        from mindspore import Tensor

        value = self._schedule(Tensor(np.int32(step))).asnumpy()
        return float(np.asarray(value).reshape(-1)[0])


def _reader_for(rate: Any, series: Callable[[], Series], pure_schedules: frozenset[str]) -> _Reader | None:
    """How to read this group's LR without running code that may keep state; None when there is no such way."""
    from mindspore.nn.learning_rate_schedule import LearningRateSchedule

    if type(rate).__name__ == "ScaledSchedule":  # lr_backoff's wrapper: read the schedule, scale it ourselves
        rate = rate.schedule
    values = getattr(rate, "learning_rate", None)
    if type(rate).__name__ == "_IteratorLearningRate" and values is not None:
        # A list LR: the whole list is one Parameter. Read it once; evaluating the gather past its end would
        # raise inside MindSpore asynchronously, in whatever call synchronises next.
        return _ListReader(np.asarray(values.asnumpy(), dtype=np.float64).reshape(-1), series())
    if isinstance(rate, LearningRateSchedule):
        kind = type(rate)
        # The exact class: a subclass of a MindSpore schedule may add state to its construct.
        if kind.__module__ in PURE_SCHEDULE_MODULES or kind.__name__ in pure_schedules:
            return _ScheduleReader(rate, series())
        logger.info(
            "ms_exporter: the learning-rate schedule %s is not MindSpore's own and not named in "
            "pure_lr_schedules: the monitor does not call it (a schedule may keep state between calls); "
            "%s is exported only if the train cell returns the LR it applied",
            kind.__name__,
            catalogue.LEARNING_RATE.name,
        )
        return None
    return _FixedReader(rate, series())


def build(context: PartContext) -> list[Probe]:
    return [LearningRateProbe(context.store, context.config.pure_lr_schedules)]


PART = ProbeEntry("learning_rate", build, ("lr",), order=50)
