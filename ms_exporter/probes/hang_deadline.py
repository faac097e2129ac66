"""The hang deadline: how long the current phase may last, learned from the run's own step cycles."""

from __future__ import annotations

import math
from typing import Any

from ms_exporter.config import HangConfig, MonitorConfig
from ms_exporter.core import catalogue
from ms_exporter.core.analysis.learned_deadline import MIN_CYCLES, LearnedDeadline
from ms_exporter.core.part import PartContext
from ms_exporter.core.phases import PhaseClock
from ms_exporter.core.probe import Probe
from ms_exporter.core.registry import ProbeEntry
from ms_exporter.core.sample import StepSample
from ms_exporter.core.store import MetricStore

__all__ = ["MIN_CYCLES", "HangDeadlineProbe"]

# The phases whose deadline is learned; the others have fixed ones.
_LEARNED = (catalogue.STEP_PHASE, catalogue.DATA_WAIT_PHASE, catalogue.CALLBACKS)


class HangDeadlineProbe(Probe):
    """`hang.factor` x the `hang.percentile` of the last `hang.window` step cycles, at least `hang.min_seconds`, for
    `step`, `data_wait` and `callbacks`; fixed deadlines for compile, eval and checkpoint. A cycle is the time from
    one step's end to the next (one hook call: a whole sink in sink mode), everything between included: a callback
    or a data wait that is regularly slow raises the deadline once it is more than the percentile leaves out. Until
    MIN_CYCLES cycles are in, the first step (compilation included) stands in for them. The formula is
    ms_exporter/core/analysis/learned_deadline.py, which `ms-exporter report` shares.

    | name | type | labels | unit |
    |---|---|---|---|
    | mindspore_train_hang_deadline_seconds | gauge | | seconds (NaN once training ended) |
    """

    name = "hang_deadline"

    def __init__(self, store: MetricStore, config: HangConfig, phases: PhaseClock) -> None:
        self._phases = phases
        self._family = store.register(catalogue.HANG_DEADLINE)
        self._bound = False
        self._learned = LearnedDeadline(config)
        self._previous_end: float | None = None  # perf_counter at the last step's end
        self._fixed = {
            catalogue.COMPILE: config.compile_seconds,
            catalogue.EVAL_PHASE: config.eval_seconds,
            catalogue.CHECKPOINT: config.checkpoint_seconds,
            catalogue.ENDED: math.nan,
        }
        # Every phase's deadline as of now, kept current here (where it changes, when steps are published) so that
        # the goodput ledger reads it with one look-up at each phase change; phases without a deadline are absent.
        self.deadlines: dict[str | None, float] = {
            phase: seconds for phase, seconds in self._fixed.items() if not math.isnan(seconds)
        }
        self._update_learned()

    def on_train_begin(self, cb_params: Any) -> None:
        self._learned.restart()  # a new call compiles again; its first cycle is not a step cycle
        self._previous_end = None
        self._update_learned()
        if not self._bound:
            self._bound = True
            self._family.bind(self.current)

    def on_step(self, sample: StepSample) -> None:
        previous, self._previous_end = self._previous_end, sample.monotonic
        if previous is None:  # the first step of a training call
            self._learned.first_step(sample.duration + (sample.data_wait or 0.0))
            self._update_learned()
        elif self._learned.cycle(sample.monotonic - previous):
            self._update_learned()

    def _update_learned(self) -> None:
        learned = self.learned()
        for phase in _LEARNED:
            self.deadlines[phase] = learned

    def learned(self) -> float:
        """The deadline of the step, data_wait and callbacks phases."""
        return self._learned.seconds()

    def current(self) -> float:
        """The deadline of the phase the rank is in now (read at scrape time)."""
        return self.deadline_of(self._phases.phase)

    def deadline_of(self, phase: str | None) -> float:
        """The deadline a phase entered now would have; NaN for none (before training, once it ended)."""
        if phase is None:
            return math.nan
        fixed = self._fixed.get(phase)
        return fixed if fixed is not None else self.learned()


def build(context: PartContext) -> list[Probe]:
    config: MonitorConfig = context.config
    return [HangDeadlineProbe(context.store, config.hang, context.phases)] if config.hang.enable else []


PART = ProbeEntry("hang_deadline", build, (), order=30)
