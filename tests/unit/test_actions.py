"""The state machines behind monitor_config.actions, step by step."""

from __future__ import annotations

import math

from ms_exporter.actions.decisions import AnomalyEpisodes, EarlyStop, LrBackoff, anomaly_of


def test_early_stop_waits_patience_evaluations_without_improvement() -> None:
    stopper = EarlyStop(patience=3, min_delta=0.01, max_nonfinite=None)
    assert stopper.evaluate(1.0) is None  # first value: the best so far
    assert stopper.evaluate(0.995) is None  # not better by more than min_delta: 1 of 3
    assert stopper.evaluate(0.98) is None  # better by 0.02: waiting starts again
    assert stopper.waited == 0 and stopper.best == 0.98
    assert stopper.evaluate(0.975) is None
    assert stopper.evaluate(math.nan) is None  # a non-finite evaluation neither improves nor counts
    assert stopper.evaluate(0.99) is None
    reason = stopper.evaluate(0.98)
    assert reason is not None and "3 evaluations" in reason
    assert stopper.evaluate(0.1) is None  # stopped once, stays stopped


def test_early_stop_on_nonfinite_losses_in_a_row() -> None:
    stopper = EarlyStop(patience=100, min_delta=0.0, max_nonfinite=3)
    assert stopper.step(math.nan) is None
    assert stopper.step(math.inf) is None
    assert stopper.step(0.5) is None  # the run is broken by a finite loss
    assert stopper.step(math.nan) is None and stopper.step(math.nan) is None
    assert stopper.step(-math.inf) == "3 non-finite losses in a row"
    assert EarlyStop(100, 0.0, None).step(math.nan) is None  # max_nonfinite null: never


def test_lr_backoff_cooldown_and_floor() -> None:
    backoff = LrBackoff(factor=0.5, rising_steps=3, cooldown=10, min_scale=0.2)
    assert backoff.observe(1, rising=2, grad_norm_breach=False) is None
    first = backoff.observe(2, rising=3, grad_norm_breach=False)
    assert first is not None and first.scale == 0.5 and "rose 3 steps" in first.reason
    assert backoff.observe(5, rising=9, grad_norm_breach=True) is None  # cooling down until step 12
    second = backoff.observe(12, rising=0, grad_norm_breach=True)
    assert second is not None and second.scale == 0.25 and "gradient norm" in second.reason
    third = backoff.observe(22, rising=5, grad_norm_breach=False)
    assert third is not None and third.scale == 0.2  # not below min_lr's scale
    assert backoff.at_floor and backoff.observe(100, rising=50, grad_norm_breach=True) is None


def test_a_snapshot_is_due_once_per_episode() -> None:
    episodes = AnomalyEpisodes(quiet_steps=3)
    assert episodes.observe(1, None) is None
    assert episodes.observe(2, "loss_spike") == "loss_spike"  # opens an episode
    assert episodes.observe(3, "nonfinite_loss") is None  # same episode
    assert episodes.observe(4, None) is None and episodes.observe(5, None) is None
    assert episodes.observe(6, "grad_norm") is None  # 3 steps after the last anomaly: still inside
    assert episodes.observe(9, None) is None  # quiet for 3 steps: the episode ends
    assert episodes.observe(10, "grad_norm") == "grad_norm"


def test_what_counts_as_an_anomaly() -> None:
    assert anomaly_of(math.nan, 1.0, 3.0, None, 10.0) == "nonfinite_loss"
    assert anomaly_of(3.5, 1.0, 3.0, None, 10.0) == "loss_spike"
    assert anomaly_of(2.5, 1.0, 3.0, None, 10.0) is None
    assert anomaly_of(2.5, None, 3.0, None, 10.0) is None  # no smoothed loss yet: no spike
    assert anomaly_of(1.0, 1.0, 3.0, 12.0, 10.0) == "grad_norm"
    assert anomaly_of(1.0, 1.0, 3.0, 12.0, None) is None
