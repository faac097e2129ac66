"""The phase clock's series and the hang deadline learned from recorded step cycles."""

from __future__ import annotations

import dataclasses
import math
import time

import pytest

from ms_exporter import catalogue
from ms_exporter.config import HangConfig, load_config
from ms_exporter.monitor.phases import PhaseClock
from ms_exporter.monitor.store import MetricStore
from ms_exporter.probes.hang_deadline import MIN_CYCLES, HangDeadlineProbe
from tests.unit.test_probes import sample


def phase_values(store: MetricStore) -> dict[str, float]:
    return {dict(s.labels)["phase"]: s.value for s in store.series_of(catalogue.PHASE)}


def test_no_phase_series_before_training_then_exactly_one_phase_is_1() -> None:
    store = MetricStore()
    clock = PhaseClock(store)
    assert store.series_of(catalogue.PHASE) == () and math.isnan(clock.seconds())
    clock.enter(catalogue.COMPILE)
    assert phase_values(store) == {name: float(name == catalogue.COMPILE) for name in catalogue.PHASES}
    clock.state = (catalogue.STEP_PHASE, time.perf_counter() - 2.0)  # what the step hook writes
    assert phase_values(store)[catalogue.STEP_PHASE] == 1 and sum(phase_values(store).values()) == 1
    assert 2.0 <= store.value_of(catalogue.PHASE_SECONDS) < 3.0


def learner(**hang: float) -> tuple[HangDeadlineProbe, PhaseClock]:
    store = MetricStore()
    clock = PhaseClock(store)
    probe = HangDeadlineProbe(store, dataclasses.replace(HangConfig(), **hang), clock)
    clock.enter(catalogue.COMPILE)
    probe.on_train_begin({})
    return probe, clock


def test_the_first_step_stands_in_until_enough_cycles_are_seen() -> None:
    probe, clock = learner(min_seconds=1.0, factor=3.0)
    probe.on_step(sample(1, duration=40.0))  # compilation: not a step cycle
    clock.enter(catalogue.DATA_WAIT_PHASE)
    assert probe.current() == 120.0  # 3 x the first step, while no cycle is known
    for step in range(2, 2 + MIN_CYCLES):
        probe.on_step(sample(step, duration=0.2, wait=0.05))
    assert probe.current() == 1.0  # 3 x 0.25 s is under the floor


def test_deadline_is_factor_times_the_percentile_of_recent_cycles() -> None:
    probe, clock = learner(min_seconds=0.1, factor=3.0, percentile=90, window=100)
    probe.on_step(sample(1, duration=30.0))
    clock.enter(catalogue.STEP_PHASE)
    for step in range(2, 102):  # cycles 0.01 .. 1.00 s
        probe.on_step(sample(step, duration=(step - 1) / 100, wait=0.0))
    assert probe.current() == pytest.approx(3 * 0.90)
    for step in range(102, 202):  # the window forgets: now 100 cycles of 0.1 s
        probe.on_step(sample(step, duration=0.1, wait=0.0))
    assert probe.current() == pytest.approx(0.3)


def test_a_cycle_longer_than_the_figure_in_use_raises_it_at_once() -> None:
    probe, clock = learner(min_seconds=0.1, factor=2.0, percentile=100)
    probe.on_step(sample(1, duration=5.0))
    clock.enter(catalogue.DATA_WAIT_PHASE)
    for step in range(2, 20):
        probe.on_step(sample(step, duration=0.1))
    assert probe.current() == pytest.approx(0.2)
    probe.on_step(sample(20, duration=0.5, wait=1.5))  # an epoch boundary's long wait
    assert probe.current() == pytest.approx(4.0)


def test_fixed_deadlines_for_compile_eval_checkpoint_and_none_once_ended() -> None:
    probe, clock = learner(compile_seconds=600, eval_seconds=300, checkpoint_seconds=200, min_seconds=30)
    assert probe.current() == 600
    clock.enter(catalogue.EVAL_PHASE)
    assert probe.current() == 300
    clock.enter(catalogue.CHECKPOINT)
    assert probe.current() == 200
    clock.enter(catalogue.DATA_WAIT_PHASE)
    assert probe.current() == 30
    clock.enter(catalogue.ENDED)
    assert math.isnan(probe.current())


def test_a_new_training_call_compiles_again_and_its_first_step_is_not_a_cycle() -> None:
    probe, clock = learner(min_seconds=0.1, factor=2.0, percentile=100)
    probe.on_step(sample(1, duration=10.0))
    for step in range(2, 10):
        probe.on_step(sample(step, duration=0.1))
    probe.on_train_begin({})
    probe.on_step(sample(10, duration=50.0))
    clock.enter(catalogue.STEP_PHASE)
    assert probe.current() == pytest.approx(0.2)


@pytest.mark.parametrize(("key", "value", "message"), [
    ("percentile", 20, "from 50 to 100"),
    ("factor", 0.5, "at least 1"),
    ("min_seconds", 0, "greater than 0"),
    ("window", 3, "from 10"),
])
def test_bad_hang_settings_say_what_is_allowed(key: str, value: float, message: str) -> None:
    with pytest.raises(ValueError, match=rf"monitor_config\.hang\.{key}: .*{message}"):
        load_config({"hang": {key: value}})
