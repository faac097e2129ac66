"""monitor_config.actions in real Model.train runs: faults injected into the loss, the monitor acts on them."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import mindspore as ms
import numpy as np
import pytest
from mindspore import Tensor, nn, ops
from mindspore.train import Callback, Model

from ms_exporter import GradNormTrainOneStepCell, TrainingMonitor
from ms_exporter.demo import build_network, synthetic_dataset
from tests.integration.boosted import Boosted
from tests.support.scrape import scrape

pytestmark = pytest.mark.integration

BATCH = 8


class Inject(Callback):
    """Placed before the monitor: multiplies the loss of chosen steps (ops.assign reaches the compiled graph)."""

    def __init__(self, network: Boosted, boosts: dict[int, float]) -> None:
        super().__init__()
        self.network = network
        self.boosts = boosts

    def on_train_step_begin(self, run_context: Any) -> None:
        step = run_context.original_args().cur_step_num
        value = next((v for first, v in sorted(self.boosts.items(), reverse=True) if step >= first), 1.0)
        ops.assign(self.network.boost, Tensor(np.float32(value)))


class WeightSteps(Callback):
    """Placed after the monitor: how far one weight moved at each step."""

    def __init__(self, parameter: Any) -> None:
        super().__init__()
        self.parameter = parameter
        self.previous = parameter.asnumpy().copy()
        self.moved: dict[int, float] = {}
        self.last_step = 0

    def on_train_step_end(self, run_context: Any) -> None:
        step = run_context.original_args().cur_step_num
        now = self.parameter.asnumpy().copy()
        self.moved[step] = float(np.abs(now - self.previous).sum())
        self.previous = now
        self.last_step = step


def setup(learning_rate: Any) -> tuple[Boosted, nn.Optimizer, Model]:
    ms.set_context(mode=ms.GRAPH_MODE)
    ms.set_seed(0)
    network = Boosted(build_network(layers=1, d_model=32, heads=2))
    optimizer = nn.SGD(network.trainable_params(), learning_rate)  # no momentum: a step moves by lr x gradient
    return network, optimizer, Model(GradNormTrainOneStepCell(network, optimizer))


def test_a_gradient_spike_backs_off_the_learning_rate_the_optimizer_uses(tmp_path: Path) -> None:
    network, optimizer, model = setup(0.05)
    monitor = TrainingMonitor(
        port=0,
        save_dir=str(tmp_path),
        warmup_steps=2,
        web={"cache_seconds": 0},
        grad_norm={"every_n_steps": 1, "threshold": 5.0},
        actions={"lr_backoff": {"enable": True, "factor": 0.001, "cooldown": 1000}},
    )
    weight = network.body.head.weight
    moved = WeightSteps(weight)
    try:
        model.train(
            1,
            synthetic_dataset(size=16 * BATCH, batch=BATCH),
            dataset_sink_mode=False,
            callbacks=[Inject(network, {8: 100.0, 9: 1.0}), monitor, moved],
        )
        page = scrape(monitor.url)
        assert page.value("mindspore_train_actions_total", action="lr_backoff") == 1  # the cooldown holds it at one
        assert page.value("mindspore_train_lr_backoff_factor") == pytest.approx(0.001)
        assert page.value("mindspore_train_learning_rate") == pytest.approx(0.05 * 0.001)
        assert float(optimizer.learning_rate.asnumpy()) == pytest.approx(0.05 * 0.001)
        # What the compiled step does with it: the weight moves ~1000 times less per step than before the spike.
        before = np.mean([moved.moved[s] for s in range(2, 8)])
        after = np.mean([moved.moved[s] for s in range(10, 17)])
        assert after < before * 0.01, (before, after)
    finally:
        monitor.close()


def test_a_schedule_is_scaled_not_replaced(tmp_path: Path) -> None:
    schedule = nn.ExponentialDecayLR(0.05, 0.9, 4)
    network, optimizer, model = setup(schedule)
    monitor = TrainingMonitor(
        port=0,
        save_dir=str(tmp_path),
        warmup_steps=2,
        web={"cache_seconds": 0},
        grad_norm={"every_n_steps": 1, "threshold": 5.0},
        actions={"lr_backoff": {"enable": True, "factor": 0.5, "cooldown": 1000}},
    )
    try:
        model.train(
            1,
            synthetic_dataset(size=16 * BATCH, batch=BATCH),
            dataset_sink_mode=False,
            callbacks=[Inject(network, {8: 100.0, 9: 1.0}), monitor],
        )
        wrapper = optimizer.learning_rate
        assert type(wrapper).__name__ == "ScaledSchedule" and wrapper.schedule is schedule
        page = scrape(monitor.url)
        used = 16 - 1  # the LR of the last step (global_step has already moved on)
        expected = 0.5 * float(schedule(Tensor(np.int32(used))).asnumpy())
        assert page.value("mindspore_train_learning_rate") == pytest.approx(expected, rel=1e-5)
        assert page.value("mindspore_train_lr_backoff_factor") == 0.5
    finally:
        monitor.close()


def test_nans_stop_the_run_with_a_snapshot_that_loads(tmp_path: Path) -> None:
    network, _, model = setup(0.01)
    monitor = TrainingMonitor(
        port=0,
        save_dir=str(tmp_path),
        warmup_steps=2,
        web={"cache_seconds": 0},
        grad_norm={"every_n_steps": 1},
        actions={"early_stop": {"enable": True, "max_nonfinite": 3}, "snapshot": {"enable": True, "max_snapshots": 2}},
    )
    moved = WeightSteps(network.body.head.weight)
    try:
        model.train(
            3,
            synthetic_dataset(size=20 * BATCH, batch=BATCH),
            dataset_sink_mode=False,
            callbacks=[Inject(network, {12: float("nan")}), monitor, moved],
        )
        assert moved.last_step == 14  # NaN at 12, 13, 14: stopped there, not after 60 steps
        page = scrape(monitor.url)
        assert page.value("mindspore_train_steps_total") == 14
        assert page.value("mindspore_train_actions_total", action="early_stop") == 1
        assert page.value("mindspore_train_actions_total", action="snapshot") == 1  # one episode, one snapshot
        assert page.value("mindspore_train_last_snapshot_step") == 12
        (checkpoint,) = (tmp_path / "snapshots").glob("*.ckpt")
        assert checkpoint.name == "snapshot-step000000012-nonfinite_loss-post-anomaly.ckpt"
        marker = json.loads(checkpoint.with_suffix(".json").read_text())
        assert marker["state"] == "post-anomaly" and marker["reason"] == "nonfinite_loss" and marker["step"] == 12
        loaded = ms.load_checkpoint(str(checkpoint))
        assert "body.head.weight" in loaded
        assert loaded["body.head.weight"].shape == network.body.head.weight.shape
    finally:
        monitor.close()


def test_patience_counts_epochs_across_epoch_boundaries(tmp_path: Path) -> None:
    network, _, model = setup(0.0)  # nothing learns: the smoothed loss cannot improve after the first epoch
    monitor = TrainingMonitor(
        port=0,
        save_dir=str(tmp_path),
        loss_window=4,
        actions={"early_stop": {"enable": True, "patience": 2, "unit": "epoch"}},
    )
    moved = WeightSteps(network.body.head.weight)
    try:
        model.train(
            10, synthetic_dataset(size=4 * BATCH, batch=BATCH), dataset_sink_mode=False, callbacks=[monitor, moved]
        )
        assert moved.last_step == 3 * 4  # epoch 1 sets the best; epochs 2 and 3 do not beat it: stop
        page = scrape(monitor.url)
        assert page.value("mindspore_train_actions_total", action="early_stop") == 1
        assert math.isfinite(page.value("mindspore_train_loss_smoothed"))
    finally:
        monitor.close()


def test_snapshots_keep_only_the_newest(tmp_path: Path) -> None:
    network, _, model = setup(0.01)
    monitor = TrainingMonitor(
        port=0,
        save_dir=str(tmp_path),
        warmup_steps=2,
        grad_norm={"every_n_steps": 1},
        actions={"snapshot": {"enable": True, "max_snapshots": 2, "quiet_steps": 2, "spike_factor": 3.0}},
    )
    try:
        spikes = {6: 50.0, 7: 1.0, 12: 50.0, 13: 1.0, 18: 50.0, 19: 1.0}
        model.train(
            1,
            synthetic_dataset(size=24 * BATCH, batch=BATCH),
            dataset_sink_mode=False,
            callbacks=[Inject(network, spikes), monitor],
        )
        names = sorted(p.name for p in (tmp_path / "snapshots").glob("*.ckpt"))
        assert names == [
            "snapshot-step000000012-loss_spike-post-anomaly.ckpt",
            "snapshot-step000000018-loss_spike-post-anomaly.ckpt",
        ]
        assert scrape(monitor.url).value("mindspore_train_actions_total", action="snapshot") == 3
    finally:
        monitor.close()


@pytest.mark.parametrize("form", ["fixed", "schedule", "list", "group-fixed", "group-schedule"])
def test_every_learning_rate_form_is_scaled_in_the_compiled_step(form: str) -> None:
    from ms_exporter.actions.lr_scale import LrScaler

    ms.set_context(mode=ms.GRAPH_MODE)
    ms.set_seed(0)
    net = nn.Dense(4, 1)
    group_lr: Any = nn.ExponentialDecayLR(0.1, 0.9, 1) if form == "group-schedule" else 0.1
    params: Any = (
        [{"params": [net.weight], "lr": group_lr}, {"params": [net.bias], "lr": 0.2}]
        if form.startswith("group")
        else net.trainable_params()
    )
    learning_rate: Any = {"schedule": nn.ExponentialDecayLR(0.1, 0.9, 1), "list": [0.1] * 10}.get(form, 0.1)
    optimizer = nn.SGD(params, learning_rate)
    step = nn.TrainOneStepCell(nn.WithLossCell(net, nn.MSELoss()), optimizer)
    scaler = LrScaler(optimizer)  # before the first step compiles, as at train begin
    rng = np.random.default_rng(0)
    x, y = Tensor(rng.random((8, 4), np.float32)), Tensor(rng.random((8, 1), np.float32))

    def moved() -> float:
        before = net.weight.asnumpy().copy()
        step(x, y)
        return float(np.abs(net.weight.asnumpy() - before).sum())

    assert moved() > 0
    scaler.apply(0.0)  # a scale of 0: if the compiled step uses it, the weights stop moving
    assert moved() == 0.0
    scaler.apply(1.0)
    assert moved() > 0
