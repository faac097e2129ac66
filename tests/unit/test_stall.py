"""The stall verdict `ms-exporter top` and the live page both show (ms_exporter/core/stall.py): amber after a few
step cycles without a step, red past the hang deadline, never for a rank that ended."""

from __future__ import annotations

import math

import pytest

from ms_exporter.core.stall import STALE_SECONDS, median_cycle, stall_of
from ms_exporter.core.thresholds import STALL_CYCLES, STALL_FLOOR_SECONDS


def test_a_rank_is_stalled_after_a_few_cycles_and_at_least_the_floor() -> None:
    slow = 4.0  # 3 cycles: 12 s, over the floor
    assert stall_of(STALL_CYCLES * slow - 0.1, "step", slow, 11.0, 120.0, ended=False) is None
    amber = stall_of(STALL_CYCLES * slow + 0.1, "step", slow, 12.0, 120.0, ended=False)
    assert amber is not None and not amber.past_deadline and amber.deadline == 120.0
    fast = 0.01  # 3 cycles: 30 ms, under the floor
    assert stall_of(STALL_FLOOR_SECONDS - 0.1, "step", fast, 4.0, 120.0, ended=False) is None
    assert stall_of(STALL_FLOOR_SECONDS + 0.1, "step", fast, 5.0, 120.0, ended=False) is not None


def test_past_its_deadline_a_rank_is_red_whatever_its_cycle() -> None:
    red = stall_of(1.0, "data_wait", 100.0, 130.0, 120.0, ended=False)
    assert red is not None and red.past_deadline and red.phase == "data_wait" and red.phase_seconds == 130.0


def test_no_deadline_or_no_step_or_an_ended_rank_is_never_red() -> None:
    undated = stall_of(6.0, "step", 1.0, 500.0, math.nan, ended=False)
    assert undated is not None and not undated.past_deadline and undated.deadline is None
    assert stall_of(None, "compile", None, 500.0, 120.0, ended=False) is None  # no step yet: the age is unknown
    assert stall_of(3600.0, "ended", 1.0, 3600.0, 120.0, ended=True) is None


def test_without_a_cycle_a_rank_waits_until_the_latest_time() -> None:
    assert stall_of(STALE_SECONDS - 1, "step", None, 1.0, None, ended=False) is None
    assert stall_of(STALE_SECONDS + 1, "step", None, 1.0, None, ended=False) is not None
    assert stall_of(11.0, "step", None, 1.0, None, ended=False, at_latest=10.0) is not None
    assert stall_of(11.0, "step", 100.0, 1.0, None, ended=False, at_latest=10.0) is not None  # the cap


def test_the_cycle_is_the_lower_median_of_the_recent_gaps() -> None:
    assert median_cycle([]) is None and median_cycle([5.0]) is None
    assert median_cycle([0.0, 1.0, 3.0, 6.0]) == pytest.approx(2.0)  # gaps 1, 2, 3
    assert median_cycle([0.0, 1.0, 3.0]) == pytest.approx(1.0)  # gaps 1, 2: the lower one
    assert median_cycle([0.0, None, 2.0, 3.0]) == pytest.approx(1.0)  # a gap next to an unread time is skipped
    old = [float(i) * 10 for i in range(100)] + [1000.0 + i for i in range(40)]
    assert median_cycle(old) == pytest.approx(1.0)  # only the last 32 cycles count
