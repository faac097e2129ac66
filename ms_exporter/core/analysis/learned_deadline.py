"""The learned hang deadline, the one formula that the hang-deadline probe and `ms-exporter report` share."""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Sequence
from typing import Protocol

# Cycles seen before the learned figure replaces the first step's: a few, so that one odd step does not set it.
MIN_CYCLES = 5
# The percentile is recomputed this often (or at once when a cycle is longer than the figure in use): sorting the
# window (500 cycles by default) on every step would cost the training loop more than the rest of the monitor.
_REFRESH_EVERY = 16


def nearest_rank(ordered: Sequence[float], percent: float) -> float:
    """The `percent` percentile of sorted values by nearest rank: the smallest value that at least `percent` % of
    them do not exceed (100: the largest). The package's one percentile definition."""
    if not ordered:
        raise ValueError("no values to take a percentile of")
    return ordered[max(0, math.ceil(len(ordered) * percent / 100) - 1)]


class HangSettings(Protocol):
    """What the formula reads of monitor_config.hang (config.HangConfig), named here so that this module imports
    nothing of the package."""

    @property
    def min_seconds(self) -> float: ...
    @property
    def factor(self) -> float: ...
    @property
    def percentile(self) -> float: ...
    @property
    def window(self) -> int: ...


class LearnedDeadline:
    """`hang.factor` x the `hang.percentile` of the last `hang.window` step cycles, at least `hang.min_seconds`.

    A cycle is the time from one step's end to the next. Until MIN_CYCLES cycles are in, the first step of the
    training call (compilation included) stands in for them. Feed it `first_step` once per training call, then
    `cycle` for every step after it; `seconds` is the deadline as of now.
    """

    def __init__(self, config: HangSettings) -> None:
        self._config = config
        self._cycles: deque[float] = deque(maxlen=config.window)
        self._first: float | None = None
        self._base = math.nan  # the percentile in use
        self._since_refresh = 0

    def restart(self) -> None:
        """A new training call compiles again: its first step is no cycle, and stands in until cycles are in."""
        self._first = None

    def first_step(self, seconds: float) -> None:
        """The first step of a training call took this long (its data wait included)."""
        self._first = seconds

    def cycle(self, seconds: float) -> bool:
        """One more step cycle; True when the deadline may have changed."""
        self._cycles.append(seconds)
        self._since_refresh += 1
        if self._since_refresh >= _REFRESH_EVERY or not seconds <= self._base:
            self._since_refresh = 0
            self._base = nearest_rank(sorted(self._cycles), self._config.percentile)
            return True
        return len(self._cycles) == MIN_CYCLES  # the learned figure takes over from the first step's

    def seconds(self) -> float:
        """The deadline of the step, data_wait and callbacks phases."""
        first = self._first if self._first is not None else 0.0
        base = self._base if len(self._cycles) >= MIN_CYCLES else first
        return max(self._config.min_seconds, self._config.factor * base)
