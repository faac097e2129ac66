"""Wall time per step and the gap between steps (data loading and host work)."""

from __future__ import annotations

from ms_exporter.core import catalogue
from ms_exporter.core.part import PartContext
from ms_exporter.core.probe import Probe
from ms_exporter.core.registry import ProbeEntry
from ms_exporter.core.sample import StepSample
from ms_exporter.core.store import MetricStore


class StepTimeProbe(Probe):
    """In sink mode one hook call covers `steps` steps: each is recorded with the call's mean duration.

    | name | type | labels | unit |
    |---|---|---|---|
    | mindspore_train_step_duration_seconds | histogram | | seconds |
    | mindspore_train_data_wait_seconds | histogram | | seconds |
    """

    name = "step_time"

    def __init__(self, store: MetricStore) -> None:
        self._duration = store.register(catalogue.STEP_DURATION).histogram()
        self._wait = store.register(catalogue.DATA_WAIT).histogram()

    def on_step(self, sample: StepSample) -> None:
        self._duration.observe(sample.duration / sample.steps, sample.steps)
        if sample.data_wait is not None:
            self._wait.observe(sample.data_wait)


def build(context: PartContext) -> list[Probe]:
    return [StepTimeProbe(context.store)]


PART = ProbeEntry("step_time", build, ("step_time",), order=60)
