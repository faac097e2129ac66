"""Mixed-precision health: the current loss scale and the steps the loss-scale cell skipped as overflow."""

from __future__ import annotations

from typing import Any

from ms_exporter.core import catalogue
from ms_exporter.core.cb_params import loss_scale_manager_of, step_of
from ms_exporter.core.part import PartContext
from ms_exporter.core.probe import Probe
from ms_exporter.core.registry import ProbeEntry
from ms_exporter.core.sample import StepSample, read_scalar
from ms_exporter.core.store import MetricStore, Series


class LossScaleProbe(Probe):
    """The overflow flag is read every step (a skipped update is an event, not a sample); the scale on overflow
    steps and every `every_n_steps` steps. Without a scale in the outputs, a loss-scale manager's scale is used.
    In sink mode only the last step of a sink is visible.

    | name | type | labels | unit |
    |---|---|---|---|
    | mindspore_train_loss_scale | gauge | | scale factor |
    | mindspore_train_overflow_steps_total | counter | | steps |
    """

    name = "loss_scale"

    def __init__(self, store: MetricStore, every_n_steps: int) -> None:
        self._store = store
        self._every = every_n_steps
        self._scale: Series | None = None
        self._overflows: Series | None = None
        self._next_step = 0

    def on_train_begin(self, cb_params: Any) -> None:
        manager = loss_scale_manager_of(cb_params)
        get_scale = getattr(manager, "get_loss_scale", None)
        if callable(get_scale):
            scale = read_scalar(get_scale())
            if scale is not None:
                self._scale_series().value = scale
        self._next_step = step_of(cb_params)

    def on_step(self, sample: StepSample) -> None:
        layout = sample.layout
        if layout.overflow is None:
            return
        outputs = sample.outputs
        overflow = bool(read_scalar(outputs[layout.overflow]))
        if self._overflows is None:
            self._overflows = self._store.register(catalogue.OVERFLOW_STEPS).series()
        if overflow:
            self._overflows.value += 1
        if layout.scale is not None and (overflow or sample.step >= self._next_step):
            self._next_step = sample.step + self._every
            scale = read_scalar(outputs[layout.scale])
            if scale is not None:
                self._scale_series().value = scale

    def _scale_series(self) -> Series:
        if self._scale is None:
            self._scale = self._store.register(catalogue.LOSS_SCALE).series()
        return self._scale


def build(context: PartContext) -> list[Probe]:
    return [LossScaleProbe(context.store, context.config.grad_norm.every_n_steps)]


PART = ProbeEntry("loss_scale", build, (), order=100)
