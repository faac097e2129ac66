"""The endpoint's request budget: a token bucket that makes requests over the rate wait, never refuses them."""

from __future__ import annotations

import pytest

from ms_exporter.config import ConfigError, load_config
from ms_exporter.endpoint.request_budget import MAX_CHARGE, REQUEST_SECONDS, RequestBudget


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


def test_an_expensive_answer_is_paid_for_by_the_requests_after_it() -> None:
    """The budget counts work, not requests: an answer that took 5 ms of CPU costs 5 plain requests' tokens, and
    one answer's charge is capped, so clients queued behind it wait at most MAX_CHARGE tokens longer."""
    clock = FakeClock()
    budget = RequestBudget(10.0, clock=clock, sleep=clock.sleep)
    for _ in range(10):
        budget.wait()  # the burst
    budget.charge(5 * REQUEST_SECONDS)  # 4 tokens more than the one paid up front
    budget.wait()
    assert clock.slept == pytest.approx([0.5])  # its own token plus the 4 the answer owed
    budget.charge(REQUEST_SECONDS / 10)  # a cheap answer owes nothing more
    budget.charge(1000 * REQUEST_SECONDS)  # a very expensive one owes MAX_CHARGE
    assert budget.reserve(0) == pytest.approx(0.5 + MAX_CHARGE / 10)
