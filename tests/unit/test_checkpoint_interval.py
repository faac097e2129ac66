"""The checkpoint interval advisor's formulas (core/analysis/checkpoint_interval.py) and the saves the ledger
counts for it."""

from __future__ import annotations

import math

import pytest

from ms_exporter.core import catalogue as c
from ms_exporter.core.analysis.checkpoint_interval import (
    advise,
    advised_interval,
    chi2_quantile_even,
    daly_interval,
    expected_goodput,
    mtbf_range,
    young_interval,
)
from ms_exporter.core.analysis.ledger import TimeLedger
from ms_exporter.core.store import MetricStore
from ms_exporter.features.checkpoint_advice import CheckpointAdvisor

HOUR = 3600.0


def test_daly_is_young_less_the_save_and_higher_order_terms_and_the_mtbf_past_twice_it() -> None:
    save, mtbf = 300.0, 12 * HOUR
    ratio = save / (2 * mtbf)
    assert young_interval(save, mtbf) == pytest.approx(math.sqrt(2 * 300 * 43200))
    assert daly_interval(save, mtbf) == pytest.approx(
        math.sqrt(2 * save * mtbf) * (1 + math.sqrt(ratio) / 3 + ratio / 9) - save
    )
    assert daly_interval(3 * HOUR, HOUR) == HOUR
    with pytest.raises(ValueError, match="positive"):
        daly_interval(0, HOUR)


def test_daly_interval_is_where_the_complete_models_goodput_peaks() -> None:
    save, mtbf, lost = 300.0, 12 * HOUR, 1800.0
    best = daly_interval(save, mtbf)
    around = [best * factor for factor in (0.5, 0.8, 0.95, 1.05, 1.25, 2.0)]
    assert all(expected_goodput(best, save, mtbf, lost) > expected_goodput(t, save, mtbf, lost) for t in around)
    # Detection and restart cost goodput, not the optimum.
    assert expected_goodput(best, save, mtbf, lost) < expected_goodput(best, save, mtbf, 0.0)
    assert expected_goodput(1e9, save, mtbf) == 0.0  # no overflow: nothing is kept


@pytest.mark.parametrize(
    ("p", "dof", "expected"),
    [(0.95, 2, 5.991465), (0.05, 2, 0.102587), (0.95, 10, 18.307038), (0.05, 20, 10.850811), (0.95, 2000, 2105.154236)],
)
def test_the_chi2_quantiles_are_the_tables(p: float, dof: int, expected: float) -> None:
    assert chi2_quantile_even(p, dof) == pytest.approx(expected, rel=1e-5)


def test_the_mtbf_range_narrows_as_failures_accumulate() -> None:
    widths = []
    for failures in (1, 3, 5, 10, 100):
        low, estimate, high = mtbf_range(failures * 10 * HOUR, failures)
        assert low < estimate < high and estimate == pytest.approx(10 * HOUR)
        widths.append(high / low)
    assert widths == sorted(widths, reverse=True) and widths[-1] < 1.5


def test_the_advice_follows_daly_as_failures_accumulate_and_says_nothing_before_a_failure_and_a_save() -> None:
    save, lost = 300.0, 1800.0
    assert advise(100 * HOUR, 0, save, lost) is None
    assert advise(100 * HOUR, 3, 0.0, lost) is None
    many = advised_interval(save, 1000 * 12 * HOUR, 1000, lost)
    assert many == pytest.approx(daly_interval(save, 12 * HOUR), rel=0.02)
    advice = advise(5 * 12 * HOUR, 5, save, lost, current=6 * HOUR)
    assert advice is not None and advice.low < advice.interval < advice.high
    # What is served as the best is the interval averaged over the MTBF's posterior, not Daly's at the estimate.
    assert advice.interval == advised_interval(save, 5 * 12 * HOUR, 5, lost) != daly_interval(save, 12 * HOUR)
    after_one = advise(12 * HOUR, 1, save, lost)
    assert after_one is not None and after_one.interval > daly_interval(save, 12 * HOUR) * 1.03
    assert advice.loss is not None and 0 < advice.loss < 0.2
    assert advise(5 * 12 * HOUR, 5, save, lost).loss is None  # type: ignore[union-attr]


def test_the_ledger_counts_checkpoint_hooks_that_saved_and_the_advisor_publishes_after_a_restart() -> None:
    store = MetricStore()
    ledger = TimeLedger(store, 0.0, None)
    clock = 10.0
    for step in range(1, 301):
        ledger.move(c.STEP_PHASE, clock)
        clock += 0.1
        ledger.move(c.CHECKPOINT, clock)
        clock += 0.5 if step % 100 == 0 else 0.00001  # ModelCheckpoint's hook: a save every 100 steps
        ledger.move(c.DATA_WAIT_PHASE, clock)
    ledger.move(c.STEP_PHASE, clock)
    assert ledger.saves.count == 3 and ledger.saves.mean_save == pytest.approx(0.5)
    assert ledger.saves.interval == pytest.approx(100 * 0.10001 - 0.00001, rel=1e-3)
    advisor = CheckpointAdvisor(store, ledger, restarts=2, previous_saved=1000.0, started=1030.0)
    advisor.refresh([3 * HOUR, 0.0])
    assert store.value_of(c.CHECKPOINT_SAVE_SECONDS) == pytest.approx(0.5)
    assert store.value_of(c.MTBF) == pytest.approx(1.5 * HOUR)
    assert store.value_of(c.FAILURE_COST) >= 30.0
    assert advisor.advice is not None
    assert store.value_of(c.CHECKPOINT_GOODPUT_LOSS) == pytest.approx(advisor.advice.loss)


def test_a_first_process_publishes_its_saves_but_no_advice() -> None:
    store = MetricStore()
    ledger = TimeLedger(store, 0.0, None)
    advisor = CheckpointAdvisor(store, ledger, restarts=0, previous_saved=None, started=0.0)
    advisor.refresh([HOUR])
    assert store.get(c.MTBF.name) is None and store.get(c.CHECKPOINT_INTERVAL_ADVISED.name) is None
