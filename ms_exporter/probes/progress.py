"""Where training is: global step, epoch, steps done, and when the last step ended (the heartbeat)."""

from __future__ import annotations

import time
from typing import Any

from ms_exporter import catalogue
from ms_exporter.monitor.sample import StepSample
from ms_exporter.monitor.store import MetricStore
from ms_exporter.probes.base import Probe


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
        self._step = store.register(catalogue.GLOBAL_STEP).series()
        self._epoch = store.register(catalogue.EPOCH).series()
        self._steps = store.register(catalogue.STEPS).series()
        self._last = store.register(catalogue.LAST_STEP_TIMESTAMP).series()
        self._planned = store.register(catalogue.PLANNED_STEPS)

    def on_train_begin(self, cb_params: Any) -> None:
        # A hang in the very first step (graph compilation, the first batch) must look like a stall too.
        self._last.value = time.time()
        # MindSpore sets epoch_num to the epochs of this call and batch_num to the steps per epoch (the sink size
        # in sink mode).
        epochs = int(cb_params.get("epoch_num", 0) or 0)
        per_epoch = int(cb_params.get("batch_num", 0) or 0)
        if epochs > 0 and per_epoch > 0:
            self._planned.series().value = int(cb_params.get("cur_step_num", 0) or 0) + epochs * per_epoch

    def on_step(self, sample: StepSample) -> None:
        self._step.value = sample.step
        self._epoch.value = sample.epoch
        self._steps.value += sample.steps
        self._last.value = sample.wall_time
