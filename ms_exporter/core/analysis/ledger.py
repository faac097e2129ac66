"""Where this process's wall time went: the goodput ledger, kept from the phase clock's transitions.

| name | type | labels | unit |
|---|---|---|---|
| mindspore_train_time_seconds_total | counter | bucket | seconds |

Every second from the process's start belongs to exactly one bucket (catalogue.TIME_BUCKETS); where two could
claim it, the first of these wins:

1. `stalled`: the part of a phase past the hang deadline it had when it began (hang.enable)
2. `startup`: from the process's start to the first train begin
3. `compile`: the compile phase (graph compilation and the first step of each training call)
4. `redo`: the step and data_wait phases of steps the run had taken before, in a process that died
5. the phase's own bucket: step is `productive`; `data_wait`, `checkpoint` and `eval` are theirs; other
   callbacks' hooks and the time after training ended are `other`
"""

from __future__ import annotations

import functools
import math
import os
import threading
import time
from collections.abc import Mapping

from ms_exporter.core import catalogue as c
from ms_exporter.core.store import MetricStore

INDEX = {bucket: index for index, bucket in enumerate(c.TIME_BUCKETS)}
_STALLED, _REDO = INDEX[c.STALLED], INDEX[c.REDO]
_PHASE_BUCKET: dict[str | None, int] = {
    None: INDEX[c.STARTUP],
    c.COMPILE: INDEX[c.COMPILE],
    c.STEP_PHASE: INDEX[c.PRODUCTIVE],
    c.DATA_WAIT_PHASE: INDEX[c.DATA_WAIT_PHASE],
    c.CHECKPOINT: INDEX[c.CHECKPOINT],
    c.EVAL_PHASE: INDEX[c.EVAL_PHASE],
    c.CALLBACKS: INDEX[c.OTHER],
    c.ENDED: INDEX[c.OTHER],
}
_REDOABLE = (c.STEP_PHASE, c.DATA_WAIT_PHASE)
_CHECKPOINT = INDEX[c.CHECKPOINT]
# A checkpoint hook that took this long saved (a ModelCheckpoint's hook that does not save returns in tens of µs;
# writing even a small model's file takes milliseconds).
SAVE_MIN_SECONDS = 0.001


class Saves:
    """The checkpoint hooks that saved, as the ledger saw them close: how many, their seconds, the first and the
    last one's end (perf_counter)."""

    __slots__ = ("count", "seconds", "first_end", "last_end")

    def __init__(self) -> None:
        self.count = 0
        self.seconds = 0.0
        self.first_end = math.nan
        self.last_end = math.nan

    def add(self, seconds: float, end: float) -> None:
        if self.count == 0:
            self.first_end = end
        self.count += 1
        self.seconds += seconds
        self.last_end = end

    @property
    def mean_save(self) -> float:
        """Seconds per save; NaN before the first."""
        return self.seconds / self.count if self.count else math.nan

    @property
    def interval(self) -> float:
        """Seconds of work between two saves (from one save's end to the next one's, less a save); NaN before the
        second."""
        if self.count < 2:
            return math.nan
        return (self.last_end - self.first_end) / (self.count - 1) - self.mean_save


class TimeLedger:
    """The training thread calls move() at each phase change (through PhaseClock.move); readers call seconds().

    One lock keeps the closed totals and the open segment consistent for a reader: a counter that dipped for a
    moment, between a segment's close and the next one's open, would read as a reset to Prometheus.
    """

    def __init__(self, store: MetricStore, started: float, deadlines: Mapping[str | None, float] | None) -> None:
        self._totals = [0.0] * len(c.TIME_BUCKETS)
        self.started = started  # perf_counter at the process's start
        self._open = (INDEX[c.STARTUP], started, math.inf)  # (bucket, since, stalled from): perf_counter times
        self._stopped_at: float | None = None
        self._read_at = started  # the latest moment a reader counted up to
        # Each phase's hang deadline in seconds as of now (HangDeadlineProbe.deadlines keeps it current): one look-up
        # per phase change, the deadline a phase had when it began; a phase without one is never stalled.
        self._deadlines: Mapping[str | None, float] = deadlines if deadlines is not None else {}
        self._lock = threading.Lock()
        # True while the steps ahead are steps the run already took in an earlier process (set at each step end).
        self.redoing = False
        self.saves = Saves()  # written under the lock, at a checkpoint segment's close
        family = store.register(c.TIME_SECONDS)
        for index, bucket in enumerate(c.TIME_BUCKETS):
            family.bind(functools.partial(self.seconds_in, index), bucket=bucket)

    def move(self, phase: str | None, now: float) -> None:
        """`phase` begins at `now` (perf_counter): the segment that was open is booked."""
        bucket = _REDO if self.redoing and phase in _REDOABLE else _PHASE_BUCKET[phase]
        deadline = self._deadlines.get(phase, math.inf)
        with self._lock:
            if self._stopped_at is not None:
                return
            # A reader may have counted the open segment up to a moment after `now` was read: end it there.
            now = max(now, self._read_at)
            closing, since, _ = self._open
            if closing == _CHECKPOINT and now - since >= SAVE_MIN_SECONDS:
                self.saves.add(now - since, now)
            _book(self._totals, self._open, now)
            self._open = (bucket, now, now + deadline)

    def stop(self, now: float | None = None) -> None:
        """Book the open segment and stop counting (the monitor closed: it sees nothing after this)."""
        with self._lock:
            if self._stopped_at is None:
                self._stopped_at = max(time.perf_counter() if now is None else now, self._read_at)
                _book(self._totals, self._open, self._stopped_at)
                self._open = (self._open[0], self._stopped_at, math.inf)

    def seconds(self) -> list[float]:
        """Seconds in each bucket of catalogue.TIME_BUCKETS up to now; they sum to the process's age."""
        with self._lock:
            totals = list(self._totals)
            if self._stopped_at is None:
                self._read_at = time.perf_counter()
                _book(totals, self._open, self._read_at)
        return totals

    def seconds_in(self, index: int) -> float:
        return self.seconds()[index]


def _book(totals: list[float], segment: tuple[int, float, float], now: float) -> None:
    bucket, since, stalled_from = segment
    end = max(now, since)
    if end > stalled_from:
        totals[bucket] += stalled_from - since
        totals[_STALLED] += end - stalled_from
    else:
        totals[bucket] += end - since


def process_started() -> float:
    """This process's start as a perf_counter() reading (so the ledger counts the interpreter's start and the
    imports before the monitor existed too); the monitor's construction where the start cannot be read.

    Linux: /proc/self/stat's start time against CLOCK_BOOTTIME, both from boot, to 10 ms; psutil's create_time()
    adds the boot time, which /proc gives in whole seconds only.
    """
    try:
        with open("/proc/self/stat", encoding="ascii") as stat:
            fields = stat.read().rsplit(")", 1)[1].split()
        started_after_boot = int(fields[19]) / os.sysconf("SC_CLK_TCK")  # field 22, starttime, in clock ticks
        age = time.clock_gettime(time.CLOCK_BOOTTIME) - started_after_boot
    except (OSError, ValueError, IndexError, AttributeError):
        try:
            import psutil

            age = time.time() - psutil.Process().create_time()
        except Exception:
            age = 0.0
    return time.perf_counter() - max(0.0, age)
