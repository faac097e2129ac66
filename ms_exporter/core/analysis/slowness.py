"""Fail-slow: each rank's own work per step, scored against its own best and flagged at the step a slowdown starts
(docs/failslow.md).

A rank's *own work* is the part of its step cycle that is its alone: its data wait (the time from one step's end to
the next one's begin, hooks taken out), and in the loop API the time up to the collective where the loop marks it.
In a synchronous job every rank's cycle is the slowest rank's: the waiters wait inside the step's all-reduce, so a
slow rank's step time does not stand out, but its own work does, and the waiters' does not move.

The detector works on the own work as a share of the rank's clean cycle (so that one threshold holds for 50 ms and
5 s steps) and runs a one-sided CUSUM per rank:

    x_t = own_t / cycle_0            excess_t = x_t - x_0
    S_t = min(CEILING, max(0, S_{t-1} + min(excess_t, CAP) - DRIFT))        flagged when S_t >= THRESHOLD

x_0 and cycle_0 are the rank's clean baseline: the median of its first WARMUP_STEPS steps, then followed by a median
tracker (a step of TRACK toward each new value) while the CUSUM is at 0, so a slowdown never becomes the baseline. A
slowdown that adds d (as a share of the cycle) adds min(d, CAP) - DRIFT per step: 10% of the cycle is flagged at its
third step, and no single slow step (a collection pause, an epoch's first batch) can flag on its own, however long:
nor can it tip over an S that jitter left high, since a flag needs MIN_SLOW_STEPS steps over DRIFT since its onset.
The onset is the first step of the run above 0 from which every step carried at least half the excess it was flagged
at (`_onset`), the size the mean excess since. CUSUM rather than Bayesian online change-point detection: O(1) per
step and rank with a fixed memory (64 steps of the current run), one threshold with a known meaning (a share of the
cycle), and it needs no model of the clean series' distribution, which a data pipeline does not follow.

The probe runs one detector for its rank; benchmarks/failslow.py runs one per simulated rank, the same code.
"""

from __future__ import annotations

import collections
import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass

# The first steps of a training call settle (caches, the allocator, the data pipeline's first prefetch): none is
# judged, nor part of the baseline.
SETTLING_STEPS = 50
WARMUP_STEPS = 32  # clean steps whose median is the first baseline
DRIFT = 0.025  # a step's excess (share of the cycle) that adds nothing: the clean jitter of a data pipeline
CAP = 0.10  # the most one step adds: three slow steps in a row flag, one never does
THRESHOLD = 0.18  # S at which a rank is flagged
CEILING = 2 * THRESHOLD  # S no higher: a slowdown that ended is let go of within ~13 clean steps
TRACK = 0.001  # the baseline's step toward each clean value (share of the cycle; relative for the cycle)
RUN_MEMORY = 64  # steps of a run above 0 kept to find its onset in
MIN_SLOW_STEPS = 2  # steps from the onset found that carried more than DRIFT: fewer is a hiccup, not a slowdown
SCORE_WEIGHT = 0.1  # the score's exponential average: about the last 10 steps


@dataclass(frozen=True)
class Onset:
    """A slowdown flagged: where it began and how large it is (a share of the rank's clean cycle)."""

    step: int  # the first slow step
    flagged_at: int  # the step it was flagged at
    size: float  # mean excess since `step`, as a share of the clean cycle


class SlownessDetector:
    """One rank's detector: observe(step, own, cycle) once per step (seconds) returns the onset flagged at this
    step, if one was. `score` is the rank's individual score in (0, 1]: its clean cycle over the cycle its own work
    would make now (1 / (1 + recent excess)), the best-over-now ratio of the anchors. Plain floats: the probe calls
    it on every step, and a numpy call on one value costs more than this whole step of arithmetic."""

    __slots__ = (
        "warmup",
        "drift",
        "cap",
        "threshold",
        "_warm_own",
        "_warm_cycle",
        "baseline_share",
        "baseline_cycle",
        "cusum",
        "flagged",
        "_run",
        "_excess_sum",
        "_excess_steps",
        "recent_excess",
        "onset_step",
        "size",
        "lost_seconds",
    )

    def __init__(
        self, *, warmup: int = WARMUP_STEPS, drift: float = DRIFT, cap: float = CAP, threshold: float = THRESHOLD
    ) -> None:
        self.warmup, self.drift, self.cap, self.threshold = warmup, drift, cap, threshold
        self._warm_own: list[float] = []
        self._warm_cycle: list[float] = []
        self.baseline_share = math.nan  # x_0: own work over the clean cycle
        self.baseline_cycle = math.nan  # cycle_0, seconds
        self.cusum = 0.0
        self.flagged = False
        # (step, excess) of the current run of S above 0, its last RUN_MEMORY steps: where the onset is looked for.
        self._run: collections.deque[tuple[int, float]] = collections.deque(maxlen=RUN_MEMORY)
        self._excess_sum = 0.0  # of the steps since the onset (since S last was 0, until one is flagged)
        self._excess_steps = 0
        self.recent_excess = 0.0
        self.onset_step = -1  # of the current (or last) flagged slowdown
        self.size = math.nan  # its mean excess so far
        self.lost_seconds = 0.0  # the cycles' excess while flagged

    @property
    def warm(self) -> bool:
        return len(self._warm_own) >= self.warmup

    @property
    def score(self) -> float:
        return 1.0 / (1.0 + max(self.recent_excess, 0.0))

    def observe(self, step: int, own: float, cycle: float) -> Onset | None:
        if len(self._warm_own) < self.warmup:
            self._warm_own.append(own)
            self._warm_cycle.append(cycle)
            if len(self._warm_own) == self.warmup:
                self.baseline_cycle = max(statistics.median(self._warm_cycle), 1e-9)
                self.baseline_share = statistics.median(self._warm_own) / self.baseline_cycle
            return None
        excess = own / self.baseline_cycle - self.baseline_share
        self.recent_excess += SCORE_WEIGHT * (excess - self.recent_excess)
        before = self.cusum
        cusum = before + (excess if excess < self.cap else self.cap) - self.drift
        cusum = 0.0 if cusum < 0.0 else CEILING if cusum > CEILING else cusum
        self.cusum = cusum
        if cusum <= 0.0:  # back to 0: a slowdown that was flagged ended; the baseline follows this clean step
            self.flagged = False
            self._track(own, cycle)
            return None
        if before <= 0.0:  # a run above 0 begins
            self._run.clear()
            self._excess_sum = 0.0
            self._excess_steps = 0
        self._run.append((step, excess))
        self._excess_sum += excess
        self._excess_steps += 1
        onset = None
        if not self.flagged and cusum >= self.threshold:
            first = self._onset()
            # A slowdown is two slow steps at least: S left high by jitter and tipped over by one hiccup is not one.
            slow = sum(1 for at, excess in self._run if at >= first and excess > self.drift)
            if slow >= MIN_SLOW_STEPS:
                self.flagged = True
                self.onset_step = first
                onset = Onset(first, step, self._excess_sum / self._excess_steps)
        if self.flagged:
            self.size = self._excess_sum / self._excess_steps
            if excess > 0.0:
                self.lost_seconds += excess * self.baseline_cycle
        return onset

    def _onset(self) -> int:
        """The first slow step of the run that crossed the threshold, and the excess counted from it.

        CUSUM's own estimate is the run's first step, which noise can put several steps early: jitter of a few
        percent can keep S above 0 for a while before a slowdown begins. The onset is instead the earliest step
        from which every step of the run carried at least half the excess of the last three (the level it was
        flagged at)."""
        run = self._run
        recent = [excess for _, excess in list(run)[-3:]]
        half = sum(recent) / len(recent) / 2
        first = len(run) - 1
        while first > 0 and run[first - 1][1] >= half:
            first -= 1
        since = list(run)[first:]
        self._excess_sum = sum(excess for _, excess in since)
        self._excess_steps = len(since)
        return since[0][0]

    def _track(self, own: float, cycle: float) -> None:
        """Move the baseline one step toward this clean step's values (a median tracker)."""
        share = own / self.baseline_cycle
        if share > self.baseline_share:
            self.baseline_share += TRACK
        elif share < self.baseline_share:
            self.baseline_share -= TRACK
        if cycle > self.baseline_cycle:
            self.baseline_cycle *= 1.0 + TRACK
        elif cycle < self.baseline_cycle:
            self.baseline_cycle *= 1.0 - TRACK


def relative_scores(own: Sequence[float], cycles: Sequence[float]) -> list[float]:
    """Each rank's relative score in (0, 1]: the job's cycle over the cycle it would have were this rank's own work
    the best rank's, 1 / (1 + (own - min own) / the rank's clean cycle). The slow rank scores low; the ranks that wait
    for it do not, since their own work did not grow. The clean cycle is the rank's own: a flagged rank's detector
    holds the cycle from before its slowdown, where the ranks that wait track the slower cycle (their own work did not
    move), so the job's largest would understate the cost the longer a slowdown lasts. Plain floats: `ms-exporter top`
    runs where numpy is not installed."""
    least = min(own)
    return [1.0 / (1.0 + max(value - least, 0.0) / max(cycle, 1e-9)) for value, cycle in zip(own, cycles)]


def culprits(flagged: Sequence[int], groups: Sequence[Sequence[int]] = ()) -> list[tuple[int, ...]]:
    """Whom to name for the flagged ranks: each group of two or more (a node, a replica, a pipeline stage:
    `groups`, as the layout is known) whose every rank is flagged, as the group's ranks; then each flagged rank
    outside such a group, alone."""
    left = set(flagged)
    named: list[tuple[int, ...]] = []
    for members in groups:
        if len(members) > 1 and set(members) <= left:
            named.append(tuple(sorted(members)))
            left -= set(members)
    return named + [(rank,) for rank in sorted(left)]
