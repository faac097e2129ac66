"""Which phase a rank is in and since when, exported as `mindspore_train_phase{phase}` and `_phase_seconds`.

| phase | from | to |
|---|---|---|
| compile | train begin; a step in which our train cell first runs its norm graph | that step's end (compilation) |
| step | a step's begin | its end (compute and the collectives inside it) |
| data_wait | a step's end | the next step's begin (the data pipeline, host work) |
| eval | an evaluation's begin | its end |
| checkpoint | a ModelCheckpoint's step or epoch hook, a loop's `with monitor.checkpointing():`, begins | it returns |
| callbacks | another callback's step or epoch hook begins | it returns |
| ended | training ended normally, or the process ends as asked (SIGTERM, Ctrl-C, sys.exit) | the next train begin |

After a checkpoint or callbacks hook the phase it interrupted goes on, counted from the hook's return. The time
spent in those hooks and in evaluations is kept `aside` and taken out of the step or data wait it fell in. A
training call that raised keeps the phase it was in: the rank did not end normally.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable

from ms_exporter.core import catalogue
from ms_exporter.core.analysis.ledger import TimeLedger
from ms_exporter.core.store import MetricStore


class PhaseClock:
    """The training thread's hooks change the phase with move() (`state` is one tuple assignment, so a reader never
    sees a phase with the previous phase's start); scrapes and other threads read `state`. The goodput ledger,
    when there is one, books every change."""

    __slots__ = ("state", "aside", "ledger", "_store", "_bound")

    def __init__(self, store: MetricStore) -> None:
        self.state: tuple[str | None, float] = (None, time.perf_counter())  # (phase, perf_counter at its start)
        self.aside = 0.0  # seconds in other callbacks and evaluations since take_aside() was last called
        self.ledger: TimeLedger | None = None
        self._store = store
        self._bound = False

    @property
    def phase(self) -> str | None:
        return self.state[0]

    def move(self, phase: str | None, now: float) -> None:
        """`phase` begins at `now` (a perf_counter reading), or begins again after a hook interrupted it."""
        ledger = self.ledger
        if ledger is not None:
            ledger.move(phase, now)
        self.state = (phase, now)

    def enter(self, phase: str, now: float | None = None) -> None:
        self.move(phase, time.perf_counter() if now is None else now)
        if not self._bound:
            self._bind()

    def apart(self, phase: str) -> _Apart:
        """`with clock.apart(phase):` the block is `phase` (a save, another callback's hook), its time kept aside;
        after it the phase it interrupted goes on, counted from the block's end. The training thread's only."""
        return _Apart(self, phase)

    def take_aside(self) -> float:
        aside, self.aside = self.aside, 0.0
        return aside

    def seconds(self) -> float:
        """Time in the current phase; NaN before training began."""
        phase, since = self.state
        return math.nan if phase is None else time.perf_counter() - since

    def _is_in(self, name: str) -> Callable[[], float]:
        return lambda: 1.0 if self.state[0] == name else 0.0

    def _bind(self) -> None:
        """The series appear when training begins: before it, no phase was measured."""
        self._bound = True
        family = self._store.register(catalogue.PHASE)
        for name in catalogue.PHASES:
            family.bind(self._is_in(name), phase=name)
        self._store.register(catalogue.PHASE_SECONDS).bind(self.seconds)


class _Apart:
    """PhaseClock.apart's block: a class, not a generator, for the hooks of other callbacks it wraps every step."""

    __slots__ = ("_clock", "_phase", "_before", "_began")

    def __init__(self, clock: PhaseClock, phase: str) -> None:
        self._clock = clock
        self._phase = phase
        self._before: str | None = None
        self._began = 0.0

    def __enter__(self) -> None:
        clock = self._clock
        self._before = clock.state[0]
        self._began = began = time.perf_counter()
        clock.move(self._phase, began)

    def __exit__(self, *exc_info: object) -> None:
        clock = self._clock
        now = time.perf_counter()
        clock.aside += now - self._began
        # The phase it interrupted goes on from now: its seconds measure how long it has been waiting since.
        clock.move(self._before, now)
