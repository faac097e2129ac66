"""The phase clock's series and the hang deadline learned from recorded step cycles."""

from __future__ import annotations

import dataclasses
import math
import time

import pytest
from mindspore.train import Callback, ModelCheckpoint

from ms_exporter.config import HangConfig, load_config
from ms_exporter.core import catalogue
from ms_exporter.core.phases import PhaseClock
from ms_exporter.core.store import MetricStore
from ms_exporter.features.callback_timer import CallbackTimer, overridden_hooks, phase_of
from ms_exporter.probes.hang_deadline import MIN_CYCLES, HangDeadlineProbe
from tests.support.samples import sample


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


class Run:
    """Feeds a deadline probe step samples on a clock: each step ends `aside + wait + duration` after the previous
    one (`aside`: other callbacks' hooks and evaluations, which the sample's duration and wait leave out)."""

    def __init__(self, **hang: float) -> None:
        store = MetricStore()
        self.clock = PhaseClock(store)
        self.probe = HangDeadlineProbe(store, dataclasses.replace(HangConfig(), **hang), self.clock)
        self.clock.enter(catalogue.COMPILE)
        self.probe.on_train_begin({})
        self.step = 0
        self.t = 0.0

    def steps(self, count: int, duration: float, wait: float = 0.0, aside: float = 0.0) -> None:
        for _ in range(count):
            self.step += 1
            self.t += aside + wait + duration
            self.probe.on_step(sample(self.step, duration=duration, wait=wait, t=self.t))

    def deadline_in(self, phase: str) -> float:
        self.clock.enter(phase)
        return self.probe.current()


def test_the_first_step_stands_in_until_enough_cycles_are_seen() -> None:
    run = Run(min_seconds=1.0, factor=3.0)
    run.steps(1, duration=40.0)  # compilation: not a step cycle
    assert run.deadline_in(catalogue.DATA_WAIT_PHASE) == 120.0  # 3 x the first step, while no cycle is known
    run.steps(MIN_CYCLES, duration=0.2, wait=0.05)
    assert run.deadline_in(catalogue.DATA_WAIT_PHASE) == 1.0  # 3 x 0.25 s is under the floor


def test_deadline_is_factor_times_the_percentile_of_recent_cycles() -> None:
    run = Run(min_seconds=0.1, factor=3.0, percentile=90, window=100)
    run.steps(1, duration=30.0)
    for step in range(1, 101):  # cycles 0.01 .. 1.00 s
        run.steps(1, duration=step / 100)
    assert run.deadline_in(catalogue.STEP_PHASE) == pytest.approx(3 * 0.90)
    run.steps(100, duration=0.1)  # the window forgets: now 100 cycles of 0.1 s
    assert run.deadline_in(catalogue.STEP_PHASE) == pytest.approx(0.3)


def test_a_cycle_longer_than_the_figure_in_use_raises_it_at_once() -> None:
    run = Run(min_seconds=0.1, factor=2.0, percentile=100)
    run.steps(1, duration=5.0)
    run.steps(18, duration=0.1)
    assert run.deadline_in(catalogue.DATA_WAIT_PHASE) == pytest.approx(0.2)
    run.steps(1, duration=0.5, wait=1.5)  # an epoch boundary's long wait
    assert run.deadline_in(catalogue.DATA_WAIT_PHASE) == pytest.approx(4.0)


def test_a_regularly_slow_callback_raises_the_deadline_of_step_data_wait_and_callbacks() -> None:
    """A callback's time is out of the step duration and the data wait, but in the cycle the deadline learns from:
    one slow cycle in 20 is more than the 1% the 99th percentile leaves out."""
    run = Run(min_seconds=1.0, factor=3.0, percentile=99, window=100)
    run.steps(1, duration=10.0)
    for _ in range(5):
        run.steps(19, duration=0.1)
        run.steps(1, duration=0.1, aside=5.0)  # a 5 s upload every 20 steps
    deadlines = [
        run.deadline_in(phase) for phase in (catalogue.STEP_PHASE, catalogue.DATA_WAIT_PHASE, catalogue.CALLBACKS)
    ]
    assert deadlines == pytest.approx([3 * 5.1] * 3)


def test_fixed_deadlines_for_compile_eval_checkpoint_and_none_once_ended() -> None:
    run = Run(compile_seconds=600, eval_seconds=300, checkpoint_seconds=200, min_seconds=30)
    assert run.probe.current() == 600
    assert run.deadline_in(catalogue.EVAL_PHASE) == 300
    assert run.deadline_in(catalogue.CHECKPOINT) == 200
    assert run.deadline_in(catalogue.CALLBACKS) == 30  # learned, like data_wait
    assert run.deadline_in(catalogue.DATA_WAIT_PHASE) == 30
    assert math.isnan(run.deadline_in(catalogue.ENDED))


def test_a_new_training_call_compiles_again_and_its_first_step_is_not_a_cycle() -> None:
    run = Run(min_seconds=0.1, factor=2.0, percentile=100)
    run.steps(1, duration=10.0)
    run.steps(8, duration=0.1)
    run.probe.on_train_begin({})
    run.steps(1, duration=50.0)
    assert run.deadline_in(catalogue.STEP_PHASE) == pytest.approx(0.2)


@pytest.mark.parametrize(
    ("key", "value", "message"),
    [
        ("percentile", 20, "from 50 to 100"),
        ("factor", 0.5, "at least 1"),
        ("min_seconds", 0, "greater than 0"),
        ("window", 3, "from 10"),
    ],
)
def test_bad_hang_settings_say_what_is_allowed(key: str, value: float, message: str) -> None:
    with pytest.raises(ValueError, match=rf"monitor_config\.hang\.{key}: .*{message}"):
        load_config({"hang": {key: value}})


class Saver(ModelCheckpoint):
    pass


class Logger(Callback):
    def epoch_end(self, run_context: object) -> None:  # the older name: on_train_epoch_end calls it
        self.phase_inside = clock_under_test.phase


clock_under_test = PhaseClock(MetricStore())


def test_other_callbacks_are_timed_as_checkpoint_or_callbacks_and_left_as_found() -> None:
    clock = clock_under_test
    timer = CallbackTimer(clock)
    saver, logger, plain = Saver(directory="unused"), Logger(), Callback()
    assert overridden_hooks(plain) == [] and overridden_hooks(logger) == ["on_train_epoch_end"]
    monitor = Logger()
    timer.wrap([saver, logger, plain, monitor], monitor)  # the monitor itself is not timed
    assert {(type(c).__name__, hook) for c, hook in timer.wrapped} == {
        ("Saver", "on_train_step_end"),
        ("Logger", "on_train_epoch_end"),
    }
    clock.enter(catalogue.DATA_WAIT_PHASE)
    clock.aside = 0.0
    logger.on_train_epoch_end(None)
    assert logger.phase_inside == catalogue.CALLBACKS
    assert clock.phase == catalogue.DATA_WAIT_PHASE and clock.take_aside() > 0 and clock.aside == 0.0
    timer.unwrap()
    assert timer.wrapped == [] and "on_train_epoch_end" not in vars(logger)


class Uploader(Callback):
    pass


class NightlyUploader(Uploader):
    pass


def test_callbacks_named_in_hang_checkpoint_callbacks_count_as_checkpoint() -> None:
    names = load_config({"hang": {"checkpoint_callbacks": ["Uploader"]}}).hang.checkpoint_callbacks
    assert names == ("Uploader",)
    assert phase_of(NightlyUploader(), names) == catalogue.CHECKPOINT  # a subclass too
    assert phase_of(Logger(), names) == catalogue.CALLBACKS
    assert phase_of(Saver(directory="unused")) == catalogue.CHECKPOINT
    with pytest.raises(ValueError, match=r"hang\.checkpoint_callbacks: 'my-saver' is not a class name"):
        load_config({"hang": {"checkpoint_callbacks": "my-saver"}})


def test_the_deadline_table_the_ledger_reads_is_the_deadline_of_every_phase_at_each_step() -> None:
    """HangDeadlineProbe.deadlines is kept current where the deadline changes, for the goodput ledger's one look-up
    per phase change: it must say what deadline_of says, for every phase, whatever the steps did."""
    run = Run(min_seconds=1.0, factor=2.0, window=20)

    def agree() -> None:
        for phase in (None, *catalogue.PHASES):
            expected = run.probe.deadline_of(phase)
            assert run.probe.deadlines.get(phase, math.nan) == pytest.approx(expected, nan_ok=True), (run.step, phase)

    agree()
    for duration, count in ((5.0, 1), (0.2, 3), (0.3, 2), (4.0, 1), (0.1, 40), (9.0, 2), (0.1, 30)):
        run.steps(count, duration)
        agree()
    run.probe.on_train_begin({})
    agree()
