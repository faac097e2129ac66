"""The fail-slow detector (ms_exporter/core/analysis/slowness.py) and its probe, on series whose answer is known."""

from __future__ import annotations

import mindspore as ms
import numpy as np
import pytest

from ms_exporter.core import catalogue as c
from ms_exporter.core.analysis.slowness import (
    SETTLING_STEPS,
    WARMUP_STEPS,
    SlownessDetector,
    culprits,
    relative_scores,
)
from ms_exporter.core.ranks import RankInfo
from ms_exporter.core.sample import StepSample
from ms_exporter.core.store import MetricStore
from ms_exporter.probes.slowness import SlownessProbe

CYCLE = 0.1  # seconds


def _run(own_share: np.ndarray) -> tuple[list[SlownessDetector], list[tuple[int, int, int, float]]]:
    """own_share: (steps, ranks) own work as a share of CYCLE; the job's cycle grows with the slowest rank."""
    detectors = [SlownessDetector() for _ in range(own_share.shape[1])]
    flagged = []
    for step, shares in enumerate(own_share):
        cycle = CYCLE + max(0.0, float(np.max(shares)) - 0.05) * CYCLE
        for rank, (detector, share) in enumerate(zip(detectors, shares)):
            onset = detector.observe(step, float(share) * CYCLE, cycle)
            if onset is not None:
                flagged.append((rank, onset.step, onset.flagged_at, onset.size))
    return detectors, flagged


def _clean(steps: int, ranks: int, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    return 0.05 + rng.normal(0, 0.003, size=(steps, ranks))


def test_a_slowdown_of_a_tenth_of_the_cycle_is_flagged_at_its_third_step_with_its_onset_and_size() -> None:
    shares = _clean(300, 4)
    shares[200:, 2] += 0.10
    detectors, flagged = _run(shares)
    assert [(rank, onset, at) for rank, onset, at, _ in flagged] == [(2, 200, 202)]
    assert flagged[0][3] == pytest.approx(0.10, abs=0.01)
    assert [detector.flagged for detector in detectors] == [False, False, True, False]
    # The waiters' own work did not grow: their scores stay at 1, the slow rank's is 1 / 1.1.
    assert [detectors[rank].score for rank in (0, 1, 3)] == pytest.approx([1.0] * 3, abs=0.01)
    assert detectors[2].score == pytest.approx(1 / 1.1, abs=0.01)
    # It cost the job 0.01 s per step since step 200, as long as it was flagged (from 202 on).
    assert detectors[2].lost_seconds == pytest.approx(98 * 0.01, rel=0.05)


def test_the_onset_is_where_the_slowdown_began_not_where_noise_before_it_lifted_the_sum() -> None:
    shares = _clean(300, 1)
    shares[190:200, 0] += 0.03  # ten steps a little slow: S creeps above 0 without a flag
    shares[200:, 0] += 1.0  # then the rank's own work doubles the cycle
    detectors, flagged = _run(shares)
    assert [(onset, at) for _, onset, at, _ in flagged] == [(200, 201)]
    assert detectors[0].size == pytest.approx(1.0, abs=0.05)


def test_one_slow_step_however_long_never_flags_and_two_in_a_row_do_not_either() -> None:
    shares = _clean(300, 1)
    shares[150, 0] += 50.0  # a 5 s collection pause: one step
    shares[220:222, 0] += 1.0  # two steps of a whole cycle more
    _, flagged = _run(shares)
    assert flagged == []


def test_one_hiccup_that_tips_over_a_sum_left_high_by_small_slow_steps_does_not_flag() -> None:
    shares = _clean(300, 1)
    shares[186:200, 0] += 0.035  # fourteen steps a little slow: S at 0.14, under the threshold
    shares[200, 0] += 1.0  # one step a whole cycle more: S over the threshold, from one slow step
    _, flagged = _run(shares)
    assert flagged == []
    shares[201, 0] += 1.0  # a second such step: a slowdown, from step 200
    _, flagged = _run(shares)
    assert [(onset, at) for _, onset, at, _ in flagged] == [(200, 201)]


def test_a_slowdown_that_ends_is_let_go_of_and_the_next_one_is_flagged_with_its_own_onset() -> None:
    shares = _clean(400, 1)
    shares[100:130, 0] += 0.25
    shares[250:, 0] += 0.25
    detectors, flagged = _run(shares)
    assert [(onset, at) for _, onset, at, _ in flagged] == [(100, 102), (250, 252)]
    assert detectors[0].onset_step == 250


def test_nothing_is_judged_before_the_baseline_and_no_clean_rank_is_ever_flagged() -> None:
    shares = _clean(WARMUP_STEPS + 5000, 64, seed=3)
    shares[:WARMUP_STEPS] += 0.5  # noisy first steps would be judged against nothing
    detectors, flagged = _run(shares)
    assert all(detector.warm for detector in detectors) and flagged == []


def test_a_group_whose_every_rank_is_flagged_is_named_as_the_group() -> None:
    groups = [range(0, 4), range(4, 8)]
    assert culprits([4, 5, 6, 7], groups) == [(4, 5, 6, 7)]
    assert culprits([1, 4, 5, 6, 7], groups) == [(4, 5, 6, 7), (1,)]
    assert culprits([4, 5], groups) == [(4,), (5,)]


def test_the_relative_score_is_low_for_the_rank_the_job_waits_for_and_one_for_the_others() -> None:
    scores = relative_scores([0.001, 0.021, 0.002], cycles=[0.1, 0.1, 0.1])
    assert scores[1] == pytest.approx(1 / 1.2) and scores[0] == 1.0 and scores[2] == pytest.approx(1 / 1.01)


def test_a_long_slowdown_keeps_its_relative_score_while_the_ranks_that_wait_track_the_slower_cycle() -> None:
    """Rank 2's own work grows by half the cycle from step 200 and the job's cycle with it. 800 steps on, the
    ranks that wait have taken the slower cycle as their clean one (their own work did not move); rank 2's detector
    still holds the cycle from before, and its score is the job's cost, 1 / 1.5: by the largest clean cycle of the
    job it would read 1 / (1 + 0.5 / 1.5)."""
    shares = _clean(1000, 4)
    shares[200:, 2] += 0.5
    detectors, flagged = _run(shares)
    assert [(rank, onset) for rank, onset, _, _ in flagged] == [(2, 200)]
    waiting = [detectors[rank].baseline_cycle for rank in (0, 1, 3)]
    assert min(waiting) > 1.4 * CYCLE and detectors[2].baseline_cycle == pytest.approx(CYCLE, rel=0.02)
    own = [float(shares[-100:, rank].mean()) * CYCLE for rank in range(4)]
    scores = relative_scores(own, [detector.baseline_cycle for detector in detectors])
    assert scores[2] == pytest.approx(1 / 1.5, abs=0.01) and min(scores[0], scores[1], scores[3]) > 0.99


def _sample(step: int, wait: float, duration: float = 0.09, hooks: float = 0.0, own_compute: float = 0.0) -> StepSample:
    return StepSample(step, 1, 1, 1.0, duration, wait, 8, 0, 0.0, float(step), hooks=hooks, own_compute=own_compute)


def test_the_probe_publishes_nothing_while_it_settles_then_the_score_and_an_onset_with_its_step() -> None:
    store = MetricStore((("rank", "0"), ("project", "p")))
    probe = SlownessProbe(store)
    probe.on_train_begin(None)
    ready = SETTLING_STEPS + WARMUP_STEPS
    for step in range(1, ready):
        probe.on_step(_sample(step, 0.005))
    assert store.get(c.SLOWNESS_SCORE.name) is None
    probe.on_step(_sample(ready, 0.005))
    probe.on_step(_sample(ready + 1, 0.005))
    assert store.value_of(c.SLOWNESS_SCORE) == pytest.approx(1.0)
    assert store.value_of(c.FAILSLOW) == 0.0 and store.get(c.FAILSLOW_ONSET_STEP.name) is None
    # The loader slows down by 0.02 s, a callback takes 0.005 s more and the loop's own computation up to its
    # collective 0.005 s more: 0.03 s of own work, 30% of the 0.1 s cycle.
    for step in range(ready + 2, ready + 12):
        probe.on_step(_sample(step, 0.025, duration=0.085, hooks=0.005, own_compute=0.005))
    assert store.value_of(c.FAILSLOW) == 1.0
    assert store.value_of(c.FAILSLOW_ONSET_STEP) == ready + 2
    assert store.value_of(c.FAILSLOW_SIZE) == pytest.approx(0.30, abs=0.02)
    assert store.value_of(c.FAILSLOW_ONSETS) == 1.0
    assert store.value_of(c.SLOWNESS_SCORE) < 0.9
    assert store.value_of(c.OWN_WORK) > 0.02 and store.value_of(c.CLEAN_CYCLE) == pytest.approx(0.095, rel=0.02)


def test_a_sink_call_and_the_first_step_of_a_call_are_not_judged() -> None:
    store = MetricStore()
    probe = SlownessProbe(store)
    for step in range(1, 200):
        probe.on_step(StepSample(step * 10, 1, 10, 1.0, 1.0, 0.01, 80, 0, 0.0, float(step)))  # a sink of 10
        probe.on_step(_sample(step, None))  # type: ignore[arg-type]  # no data wait: a call's first step
    assert store.get(c.SLOWNESS_SCORE.name) is None


def test_a_device_that_runs_under_its_best_clock_lowers_the_score_where_own_work_shows_nothing() -> None:
    store = MetricStore((("rank", "0"), ("project", "p")))
    clock = store.register(c.DEVICE_CLOCK)
    fast, other = clock.series(device="gpu0"), clock.series(device="gpu1")
    fast.value = other.value = 1.98e9
    probe = SlownessProbe(store)
    probe.on_train_begin(None)
    for step in range(1, SETTLING_STEPS + WARMUP_STEPS + 5):
        probe.on_step(_sample(step, 0.005))
    assert store.value_of(c.SLOWNESS_SCORE) == pytest.approx(1.0)
    fast.value = 1.98e9 * 0.6  # held down for heat: a compiled step slows, the data wait does not
    probe.on_step(_sample(SETTLING_STEPS + WARMUP_STEPS + 5, 0.005))
    assert store.value_of(c.SLOWNESS_SCORE) == pytest.approx(0.6)
    assert store.value_of(c.FAILSLOW) == 0.0  # the detector reads own work only: no onset
    fast.value = float("nan")  # a reading that failed is no reading
    probe.on_step(_sample(SETTLING_STEPS + WARMUP_STEPS + 6, 0.005))
    assert store.value_of(c.SLOWNESS_SCORE) == pytest.approx(1.0)


def test_the_probe_publishes_the_ranks_node_and_its_parallel_groups_once() -> None:
    store = MetricStore((("rank", "5"), ("project", "p")))
    probe = SlownessProbe(store, RankInfo(5, 1, 8, "node-b"), model_parallel=2)
    ms.set_auto_parallel_context(parallel_mode=ms.ParallelMode.SEMI_AUTO_PARALLEL, pipeline_stages=2)
    try:
        probe.on_train_begin(None)
    finally:
        ms.reset_auto_parallel_context()
    probe.on_train_begin(None)  # a second call finds the context reset: the first reading stands
    series = store.series_of(c.PARALLEL_GROUP_INFO)
    published = {(dict(s.labels)["kind"], dict(s.labels)["group"]) for s in series if s.value == 1.0}
    assert published == {("node", "node-b"), ("stage", "1"), ("replica", "0")}
