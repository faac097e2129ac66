"""Verdicts written once (ms_exporter/core/verdicts.py): the PromQL of their alert rules and the Python `top` runs
both come from the record, with the same thresholds."""

from __future__ import annotations

import dataclasses

from ms_exporter.core import catalogue as c
from ms_exporter.core.thresholds import DEFAULTS, Thresholds
from ms_exporter.core.verdicts import DEVICE_HOT, MEMORY_GROWTH, STRAGGLER, Over, Verdict
from ms_exporter.generate.alerts.verdicts import promql
from ms_exporter.generate.rules import live, render_rules


def straggler(wait: float, cycle: float, median_wait: float, median_cycle: float) -> bool:
    return STRAGGLER.holds(
        {
            c.RANK_WAIT_MEAN: wait,
            c.RANK_CYCLE_MEAN: cycle,
            c.PROJECT_WAIT_MEDIAN: median_wait,
            c.PROJECT_CYCLE_MEDIAN: median_cycle,
        }
    )


def test_the_straggler_verdict_names_the_rank_the_others_wait_for() -> None:
    # Synchronous ranks: equal cycles, the late one has the long data wait.
    assert straggler(wait=0.18, cycle=0.26, median_wait=0.001, median_cycle=0.26)
    assert not straggler(wait=0.001, cycle=0.26, median_wait=0.001, median_cycle=0.26)
    # A long wait that is a small part of a long step is not enough.
    assert not straggler(wait=0.02, cycle=0.12, median_wait=0.001, median_cycle=0.12)
    # Ranks at their own pace: a cycle over 1.5 times the median.
    assert straggler(wait=0.0, cycle=0.31, median_wait=0.0, median_cycle=0.2)
    assert not straggler(wait=0.0, cycle=0.29, median_wait=0.0, median_cycle=0.2)


def test_memory_growth_and_device_heat_hold_at_their_thresholds() -> None:
    ratio, rate = c.MEMORY_GROWTH_RATIO.name, c.MEMORY_GROWTH_RATE.name
    grown = DEFAULTS.memory_growth_ratio * 1.01
    assert MEMORY_GROWTH.holds({ratio: grown, rate: DEFAULTS.memory_growth_rate * 2})
    assert not MEMORY_GROWTH.holds({ratio: grown, rate: 0.0})  # grown, but no longer growing
    assert not MEMORY_GROWTH.holds({ratio: grown})  # no rate read: nothing holds on a missing value
    assert DEVICE_HOT.holds({c.RANK_DEVICE_TEMPERATURE: DEFAULTS.device_hot_celsius})  # at the bound: hot
    assert not DEVICE_HOT.holds({c.RANK_DEVICE_TEMPERATURE: DEFAULTS.device_hot_celsius - 0.5})


def test_a_users_thresholds_move_both_renderings_alike() -> None:
    hotter = dataclasses.replace(Thresholds(), device_hot_celsius=90.0)
    assert promql(DEVICE_HOT, hotter) == f"{c.RANK_DEVICE_TEMPERATURE} >= 90"
    assert not DEVICE_HOT.holds({c.RANK_DEVICE_TEMPERATURE: 88.0}, hotter)
    assert DEVICE_HOT.holds({c.RANK_DEVICE_TEMPERATURE: 88.0})


def test_each_rule_written_from_a_record_is_the_records_promql() -> None:
    rules = {
        rule["alert"]: rule["expr"] for group in render_rules()["groups"] for rule in group["rules"] if "alert" in rule
    }
    for verdict in (STRAGGLER, MEMORY_GROWTH, DEVICE_HOT):
        # The rules file limits raw series to scraped ones (`live`); recording-rule names stay as written.
        assert rules[verdict.alert] == live(promql(verdict, DEFAULTS)), verdict.alert


def test_clauses_and_comparisons_are_parenthesised_as_promql_needs() -> None:
    one = Over("a", "straggler_factor")
    two = Over("b", "straggler_wait_fraction", "c")
    of_project = Over("d", "straggler_factor", "e", scale_of_project=True)
    both = promql(Verdict("X", ((one, two), (of_project,))), DEFAULTS)
    assert both == "((a > 1.5) and (b > 0.2 * c)) or (d > on (project) group_left () (1.5 * e))"
