"""A stalled rank, decided once for the pictures: `ms-exporter top` and the live page (docs/top.md, docs/live.md).

A rank is stalled when its last step ended longer ago than STALL_CYCLES times its recent step cycle and at least
STALL_FLOOR_SECONDS (at the latest `at_latest` seconds, also while no cycle is known), or when its phase has outlasted
its hang deadline (MindSporeTrainingStalled's condition, on the rank's own numbers); a rank that ended never is.
`top` judges from scraped values, the live page's endpoint from its step history; the page only draws the result.
No alert reads this: the rules' stall is MindSporeTrainingStalled (ms_exporter/generate/alerts/hangs.py).
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass

from ms_exporter.core.thresholds import STALL_CYCLES, STALL_FLOOR_SECONDS

# Without a known step cycle (no step yet on `top`, a single step on the live page), a rank counts as stalled only
# this long after its last step: a first step's compilation takes minutes and is not a stall.
STALE_SECONDS = 60.0
CYCLES_SEEN = 32  # the step cycles the median cycle is taken over


@dataclass(frozen=True)
class Stall:
    """A stalled rank: since when, where, and whether its phase is past its hang deadline (red) or not (amber)."""

    seconds: float  # since the last step ended
    phase: str | None
    phase_seconds: float | None  # in that phase
    deadline: float | None  # the rank's hang deadline for its phase; None where it exports none
    past_deadline: bool


def stall_of(
    age: float | None,
    phase: str | None,
    cycle: float | None,
    phase_seconds: float | None,
    deadline: float | None,
    ended: bool,
    at_latest: float = STALE_SECONDS,
) -> Stall | None:
    """The stall of a rank whose last step ended `age` seconds ago (None before a step), in `phase` for
    `phase_seconds` with hang `deadline` (None or NaN: none exported), its step cycle `cycle` (None: not known)."""
    if ended or age is None:
        return None
    after = min(at_latest, max(STALL_CYCLES * cycle, STALL_FLOOR_SECONDS)) if cycle is not None else at_latest
    if deadline is not None and not math.isfinite(deadline):
        deadline = None  # NaN: no deadline for this phase
    past = phase is not None and phase_seconds is not None and deadline is not None and phase_seconds > deadline
    if not past and age <= after:
        return None
    return Stall(age, phase, phase_seconds, deadline, past)


def median_cycle(times: Sequence[float | None]) -> float | None:
    """The median gap between the last CYCLES_SEEN + 1 step end times (None where unread): a rank's recent step
    cycle; None with fewer than two times."""
    recent = list(times)[-(CYCLES_SEEN + 1) :]
    gaps = [
        later - earlier
        for earlier, later in zip(recent, recent[1:])
        if earlier is not None and later is not None and math.isfinite(earlier) and math.isfinite(later)
    ]
    return statistics.median_low(gaps) if gaps else None
