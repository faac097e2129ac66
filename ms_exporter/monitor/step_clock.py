"""The one clock of a step: when it began and ended, its data wait, and the time kept aside out of both.

Every driver (the Callback, the loop API, a trainer's callback) reads the time here and nowhere else:

| reading | from | to |
|---|---|---|
| step | the step's begin (its batch in hand) | its loss read, which waits for the device |
| data wait | the previous step's end | this step's begin, less the time kept aside |
| aside | another callback, an evaluation, the time between two loops | out of the step or wait it fell in |

The phase clock (core/phases.py) keeps the aside total, because the hooks that add to it (features/callback_timer.py)
move the phase too; only this clock takes it out.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from ms_exporter.core.catalogue import COMPILE, DATA_WAIT_PHASE, STEP_PHASE
from ms_exporter.core.phases import PhaseClock


class StepClock:
    """Driven on the training thread: begin(), then end() once the loss is read, then after_end()."""

    __slots__ = ("_phases", "began", "data_wait", "hooks", "collective", "_previous_end", "_compiles_next")

    def __init__(self, phases: PhaseClock) -> None:
        self._phases = phases
        self.reset()

    def reset(self, compiles_next: Callable[[], bool] | None = None) -> None:
        """A training run begins. `compiles_next`, when given, says whether the coming step compiles a graph its cell
        has not run yet (ms_exporter's own train cells know): that step is `compile`, not `step`."""
        self.began: float | None = None
        self.data_wait: float | None = None
        self.hooks = 0.0  # seconds of other callbacks' hooks and evaluations in this step's cycle
        self.collective: float | None = None  # when the loop said the step's collective began (mark_collective)
        self._previous_end: float | None = None
        self._compiles_next = compiles_next

    def begin(self) -> float:
        """The step begins now; returns the time. Its data wait is the time since the last step's end, less aside."""
        began = time.perf_counter()
        self.began = began
        phases = self._phases
        if phases.state[0] is not COMPILE:  # compilation lasts until the first step ends
            compiles = self._compiles_next
            phases.move(COMPILE if compiles is not None and compiles() else STEP_PHASE, began)
        aside = self.hooks = phases.take_aside()
        if self._previous_end is not None:
            self.data_wait = max(0.0, began - self._previous_end - aside)
        return began

    def end(self, fallback: float) -> float:
        """When the step that ends now began, moved later by the time kept aside inside it; `fallback` when no begin
        was seen (a driver that reports step ends only)."""
        began = self.began if self.began is not None else fallback
        inside = self._phases.take_aside()
        self.hooks += inside
        return began + inside

    def mark_collective(self) -> None:
        """The step's own computation is done and its collective (the gradient all-reduce) begins now."""
        if self.began is not None and self.collective is None:
            self.collective = time.perf_counter()

    def own_compute(self, began: float) -> float:
        """Seconds from the step's begin (`began`, aside taken out) to the collective the loop marked; 0 unmarked."""
        marked = self.collective
        return 0.0 if marked is None else max(0.0, marked - began)

    def after_end(self) -> float:
        """The step's bookkeeping is done: the data wait of the next one starts now."""
        self.began = None
        self.data_wait = None
        self.collective = None
        self._previous_end = now = time.perf_counter()
        self._phases.move(DATA_WAIT_PHASE, now)
        return now

    def set_aside(self, seconds: float) -> None:
        """Time spent outside the step and the data pipeline (an evaluation, the time between two loops)."""
        self._phases.aside += seconds

    @property
    def in_step(self) -> bool:
        """Whether a step began and has not ended."""
        return self.began is not None
