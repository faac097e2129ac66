"""The endpoint's request budget: a token bucket that makes requests over the rate wait, never refuses them."""

from __future__ import annotations

import pytest

from ms_exporter.config import ConfigError, load_config
from ms_exporter.sinks.request_budget import REQUEST_SECONDS, RequestBudget


class FakeClock:
    def __init__(self) -> None:
        self.now = 100.0
        self.slept: list[float] = []

    def __call__(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.slept.append(seconds)


def test_a_second_of_requests_passes_then_each_waits_its_turn() -> None:
    clock = FakeClock()
    budget = RequestBudget(10.0, clock=clock, sleep=clock.sleep)
    for _ in range(10):  # the burst: a second's worth
        budget.wait()
    assert clock.slept == []
    for _ in range(3):  # no time passed: each further request reserves the next free slot, 0.1 s apart
        budget.wait()
    assert clock.slept == pytest.approx([0.1, 0.2, 0.3])


def test_the_budget_refills_with_time_up_to_one_second_of_requests() -> None:
    clock = FakeClock()
    budget = RequestBudget(10.0, clock=clock, sleep=clock.sleep)
    for _ in range(10):
        budget.wait()
    clock.now += 0.5  # five requests' worth came back
    for _ in range(5):
        budget.wait()
    assert clock.slept == []
    clock.now += 60.0  # idle for a minute: still only a second's worth
    for _ in range(11):
        budget.wait()
    assert clock.slept == pytest.approx([0.1])


def test_max_requests_per_second_is_zero_or_positive() -> None:
    assert load_config({"web": {"max_requests_per_second": 0}}).web.max_requests_per_second == 0
    assert load_config({}).web.max_requests_per_second == 20
    with pytest.raises(ConfigError, match="web.max_requests_per_second"):
        load_config({"web": {"max_requests_per_second": -1}})


def test_finding_4_an_expensive_answer_is_paid_for_by_the_requests_after_it() -> None:
    """The budget counts work, not requests: an answer that took 30 ms of CPU costs 30 plain requests' tokens."""
    clock = FakeClock()
    budget = RequestBudget(10.0, clock=clock, sleep=clock.sleep)
    budget.wait()
    budget.charge(30 * REQUEST_SECONDS)  # 29 tokens more than the one paid up front
    budget.wait()
    assert clock.slept == pytest.approx([(1 + 29 + 1 - 10) / 10])  # it waits for the work the first one did
    budget.charge(REQUEST_SECONDS / 10)  # a cheap answer owes nothing more
    assert budget.reserve(0) == pytest.approx(2.1)
