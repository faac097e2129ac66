"""The replica checks of every step say once when they cost a rank more than their share of its step cycle."""

from __future__ import annotations

import logging

import pytest

from ms_exporter.features.check_cost import CHECK_BUDGET, CHECK_WINDOW, CheckCost


def test_checks_within_their_share_say_nothing(caplog: pytest.LogCaptureFixture) -> None:
    cost = CheckCost(399_367)
    with caplog.at_level(logging.WARNING, logger="ms_exporter"):
        for _ in range(10 * CHECK_WINDOW):
            cost.observe(0.0001, 0.012)  # 0.8% of a 12 ms cycle: the demo model's figures
    assert not cost.warned and caplog.records == []


def test_checks_over_their_share_warn_once_with_the_figures_and_the_setting(caplog: pytest.LogCaptureFixture) -> None:
    cost = CheckCost(1_200_000_000)
    with caplog.at_level(logging.WARNING, logger="ms_exporter"):
        for _ in range(CHECK_WINDOW - 1):
            cost.observe(1.0, 0.5)
        assert caplog.records == []  # not before a whole window
        for _ in range(5 * CHECK_WINDOW):
            cost.observe(1.0, 0.5)
    assert cost.warned and len(caplog.records) == 1
    message = caplog.records[0].getMessage()
    assert (
        "1,200,000,000 values in 1000.00 ms every 1 step(s), 66.7% of this rank's median 1500.0 ms between two checks"
        in message
    )
    assert "divergence.check_every_step: false" in message and "check_every_n_steps" not in message


def test_a_rare_slow_check_is_not_a_costly_one() -> None:
    cost = CheckCost(1000)
    for index in range(2 * CHECK_WINDOW):
        slow = index % 8 == 0  # a collection pause now and then
        cost.observe(0.05 if slow else 0.00005, 0.01)
    assert not cost.warned
    assert CHECK_BUDGET == 0.01


@pytest.mark.parametrize(
    ("check", "rest", "every", "compared_every", "said"),
    [
        # 2 ms of checks on a 12 ms step: 17 steps would do; the least divisor of 100 from there is 20.
        (0.002, 0.012, 1, 100, "divergence.check_every_n_steps: 20 on every rank"),
        # Already every 5 steps (a 5 x 12 ms cycle between checks), 2 ms each: 20 again.
        (0.002, 0.060, 5, 100, "divergence.check_every_n_steps: 20 on every rank"),
        # A second of checks on a 0.5 s step: 200 steps, more than the 100 between comparisons: only off.
        (1.0, 0.5, 1, 100, "divergence.check_every_step: false"),
    ],
)
def test_the_warning_names_the_least_interval_within_the_budget(
    caplog: pytest.LogCaptureFixture, check: float, rest: float, every: int, compared_every: int, said: str
) -> None:
    cost = CheckCost(1000, every, compared_every)
    with caplog.at_level(logging.WARNING, logger="ms_exporter"):
        for _ in range(CHECK_WINDOW):
            cost.observe(check, rest)
    (record,) = caplog.records
    assert said in record.getMessage()
    if "check_every_n_steps" not in said:
        assert "check_every_n_steps" not in record.getMessage()
