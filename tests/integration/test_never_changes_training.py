"""The monitor never changes the training it watches: it does not call user code that may
keep state between calls, such as a learning-rate schedule of the user's own."""

from __future__ import annotations

from typing import Any

import mindspore as ms
import numpy as np
import pytest
from mindspore import Parameter, Tensor, nn, ops
from mindspore.train import Model

from ms_exporter import TrainingMonitor
from ms_exporter.demo import build_network, synthetic_dataset
from tests.support.scrape import scrape

pytestmark = pytest.mark.integration

BATCH = 8
STEPS = 6


class CountingSchedule(nn.learning_rate_schedule.LearningRateSchedule):
    """A user's schedule with state: each call counts, and the LR halves with every call."""

    def __init__(self) -> None:
        super().__init__()
        self.counter = Parameter(Tensor(0, ms.int32), name="schedule_calls", requires_grad=False)

    def construct(self, global_step: Any) -> Any:
        calls = ops.assign_add(self.counter, Tensor(1, ms.int32))
        return ops.zeros_like(ops.cast(global_step, ms.float32)) + 0.01 * ops.pow(0.5, ops.cast(calls, ms.float32))

    @property
    def calls(self) -> int:
        return int(self.counter.asnumpy())


def train(
    schedule: nn.learning_rate_schedule.LearningRateSchedule, monitored: bool = True, **options: Any
) -> tuple[float | None, np.ndarray]:
    """Six PYNATIVE steps; the LR /metrics showed at the end (None when not exported) and the trained weights."""
    ms.set_context(mode=ms.PYNATIVE_MODE)
    ms.set_seed(0)
    network = build_network(layers=1, d_model=16, heads=2)
    model = Model(network, optimizer=nn.Momentum(network.trainable_params(), schedule, 0.9))
    monitor = TrainingMonitor(port=0, project="pure", interval=0.2, web={"cache_seconds": 0}, **options)
    try:
        model.train(
            1,
            synthetic_dataset(size=STEPS * BATCH, batch=BATCH),
            callbacks=[monitor] if monitored else [],
            dataset_sink_mode=False,
        )
        page = scrape(monitor.url)
        found = page.find("mindspore_train_learning_rate")
        if monitored:
            assert page.value("mindspore_train_learning_rate_scheduled") == 1
        weights = np.concatenate([p.asnumpy().reshape(-1) for p in network.trainable_params()])
        return (found[0] if found else None), weights
    finally:
        monitor.close()


def test_a_schedule_of_the_users_own_is_never_called_by_the_monitor() -> None:
    schedule = CountingSchedule()
    learning_rate, weights = train(schedule)
    assert schedule.calls == STEPS  # the optimizer's calls, one a step, and none of the monitor's
    assert learning_rate is None  # not read, so not exported: no invented value
    _, unmonitored = train(CountingSchedule(), monitored=False)
    np.testing.assert_array_equal(weights, unmonitored)  # the same training as without the monitor


def test_a_schedule_named_pure_is_read_and_mindspores_own_always_are() -> None:
    named = CountingSchedule()
    learning_rate, _ = train(named, pure_lr_schedules=["CountingSchedule"])
    assert named.calls > STEPS and learning_rate is not None  # the user said it may be called
    learning_rate, _ = train(nn.ExponentialDecayLR(0.01, 0.9, 1))
    assert learning_rate == pytest.approx(0.01 * 0.9 ** (STEPS - 1), rel=1e-5)


def test_the_lr_a_train_cell_returns_is_exported_without_calling_the_schedule() -> None:
    """A cell with MindSpore Transformers' outputs (loss, overflow, scale, lr, global_norm): the lr comes from them."""

    class ReportsItsLr(nn.Cell):
        def __init__(self, step_cell: nn.Cell, schedule: CountingSchedule) -> None:
            super().__init__()
            self.step_cell = step_cell
            self.schedule = schedule
            self.optimizer = step_cell.optimizer

        def construct(self, *inputs: Any) -> Any:
            loss = self.step_cell(*inputs)
            applied = 0.01 * 0.5**self.schedule.calls  # what this step's optimizer call got
            return loss, Tensor(False), Tensor(1.0), Tensor(applied, ms.float32), Tensor(1.0)

    ms.set_context(mode=ms.PYNATIVE_MODE)
    ms.set_seed(0)
    network = build_network(layers=1, d_model=16, heads=2)
    schedule = CountingSchedule()
    cell = ReportsItsLr(nn.TrainOneStepCell(network, nn.Momentum(network.trainable_params(), schedule, 0.9)), schedule)
    monitor = TrainingMonitor(port=0, project="pure", interval=0.2, web={"cache_seconds": 0})
    try:
        Model(cell).train(
            1, synthetic_dataset(size=STEPS * BATCH, batch=BATCH), callbacks=[monitor], dataset_sink_mode=False
        )
        assert schedule.calls == STEPS
        assert scrape(monitor.url).value("mindspore_train_learning_rate") == pytest.approx(0.01 * 0.5**STEPS)
    finally:
        monitor.close()
