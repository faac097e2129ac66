"""Where training is: global step, epoch, steps done, and when the last step ended (the heartbeat)."""

from __future__ import annotations

import time
from typing import Any

from ms_exporter.core import catalogue
from ms_exporter.core.cb_params import dataset_of, epoch_of, epochs_of, sink_mode_of, step_of, steps_per_epoch_of
from ms_exporter.core.part import PartContext
from ms_exporter.core.probe import Probe
from ms_exporter.core.registry import ProbeEntry
from ms_exporter.core.sample import StepSample
from ms_exporter.core.store import MetricStore, Series


class ProgressProbe(Probe):
    """Always on: the alerts for stalls and missing ranks depend on it.

    | name | type | labels | unit |
    |---|---|---|---|
    | mindspore_train_global_step | gauge | | steps |
    | mindspore_train_epoch | gauge | | epochs |
    | mindspore_train_steps_total | counter | | steps |
    | mindspore_train_last_step_timestamp_seconds | gauge | | unix seconds (train begin until the first step) |
    | mindspore_train_planned_steps | gauge | | global step at which the current Model.train call ends |
    """

    name = "progress"

    def __init__(self, store: MetricStore) -> None:
        # The step, the epoch and the heartbeat appear at train begin, when they are known: a monitor constructed
        # long before training (imports, data loading) must not show step 0 or a heartbeat from 1970.
        step, epoch = store.register(catalogue.GLOBAL_STEP), store.register(catalogue.EPOCH)
        self._steps = store.register(catalogue.STEPS).series()
        self._families = (step, epoch, store.register(catalogue.LAST_STEP_TIMESTAMP))
        self._step: Series | None = None
        self._epoch: Series | None = None
        self._last: Series | None = None
        self._planned = store.register(catalogue.PLANNED_STEPS)

    def on_train_begin(self, cb_params: Any) -> None:
        step_family, epoch_family, last_family = self._families
        self._step, self._epoch, self._last = step_family.series(), epoch_family.series(), last_family.series()
        self._step.value = step_of(cb_params)
        self._epoch.value = epoch_of(cb_params)
        # A hang in the very first step (graph compilation, the first batch) must look like a stall too.
        self._last.value = time.time()
        # MindSpore sets epoch_num to the epochs of this call and batch_num to the steps per epoch, or to the sink
        # size when one is given, even where it then trains without sinking (CPU falls back to a step per batch and
        # says so with dataset_sink_mode False): then an epoch is the whole dataset.
        epochs = epochs_of(cb_params)
        per_epoch = steps_per_epoch_of(cb_params)
        if not sink_mode_of(cb_params):
            per_epoch = _dataset_size(dataset_of(cb_params), per_epoch)
        if epochs > 0 and per_epoch > 0:
            self._planned.series().value = step_of(cb_params) + epochs * per_epoch

    def on_step(self, sample: StepSample) -> None:
        if self._step is None or self._epoch is None or self._last is None:
            self._step, self._epoch, self._last = (family.series() for family in self._families)
        self._step.value = sample.step
        self._epoch.value = sample.epoch
        self._steps.value += sample.steps
        self._last.value = sample.wall_time


def _dataset_size(dataset: Any, fallback: int) -> int:
    try:
        return int(dataset.get_dataset_size())
    except Exception:  # not a MindSpore dataset (a test's stand-in), or one that cannot tell
        return fallback


def build(context: PartContext) -> list[Probe]:
    return [ProgressProbe(context.store)]


PART = ProbeEntry("progress", build, (), order=20)
