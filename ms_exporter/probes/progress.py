"""Where training is: global step, epoch, steps done, and when the last step ended (the heartbeat)."""

from __future__ import annotations

from ms_exporter.probes.base import Probe
from ms_exporter.sample import StepSample
from ms_exporter.store import MetricStore


class ProgressProbe(Probe):
    """Always on: the alerts for stalls and missing ranks depend on it.

    | name | type | labels | unit |
    |---|---|---|---|
    | mindspore_train_global_step | gauge | | steps |
    | mindspore_train_epoch | gauge | | epochs |
    | mindspore_train_steps_total | counter | | steps |
    | mindspore_train_last_step_timestamp_seconds | gauge | | unix seconds |
    """

    name = "progress"

    def __init__(self, store: MetricStore) -> None:
        self._step = store.gauge("mindspore_train_global_step",
                                 "Current global step (cb_params.cur_step_num).").series()
        self._epoch = store.gauge("mindspore_train_epoch", "Current epoch (cb_params.cur_epoch_num).").series()
        self._steps = store.counter("mindspore_train_steps_total", "Steps this process completed.").series()
        self._last = store.gauge("mindspore_train_last_step_timestamp_seconds",
                                 "Unix time the last step ended.").series()

    def on_step(self, sample: StepSample) -> None:
        self._step.value = sample.step
        self._epoch.value = sample.epoch
        self._steps.value += sample.steps
        self._last.value = sample.wall_time
