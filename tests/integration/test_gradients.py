"""Gradient norms, loss scaling and LayerNorm health from real training steps, checked against references."""

from __future__ import annotations

import logging
import math
from typing import Any

import mindspore as ms
import numpy as np
import pytest
from mindspore import Tensor, nn, ops
from mindspore.train import Callback, Model
from mindspore.train.loss_scale_manager import FixedLossScaleManager

from ms_exporter import GradNormTrainOneStepCell, LossScaleTrainOneStepCell, TrainingMonitor
from ms_exporter.demo import build_network, synthetic_dataset
from tests.integration.boosted import Boosted
from tests.support.scrape import Scrape, scrape

pytestmark = pytest.mark.integration
# No render cache: these tests scrape right after a step and compare with that step.
FRESH = {"cache_seconds": 0}

MODES = pytest.mark.parametrize("mode", [ms.GRAPH_MODE, ms.PYNATIVE_MODE], ids=["graph", "pynative"])
BATCH = 8


def small_network() -> nn.Cell:
    return build_network(layers=1, d_model=32, heads=2)


def dataset(batches: int) -> Any:
    return synthetic_dataset(size=batches * BATCH, batch=BATCH)


class RecordSteps(Callback):
    """Keeps each step's weights (copied before the step), batch and scrape, for a reference computed later."""

    def __init__(self, monitor: TrainingMonitor, network: nn.Cell) -> None:
        super().__init__()
        self.monitor = monitor
        self.network = network
        self.rows: list[tuple[list[np.ndarray], list[np.ndarray], Scrape]] = []

    def on_train_step_begin(self, run_context: Any) -> None:
        self.before = [p.asnumpy().copy() for p in self.network.trainable_params()]

    def on_train_step_end(self, run_context: Any) -> None:
        batch = [t.asnumpy().copy() for t in run_context.original_args().train_dataset_element]
        self.monitor.publish()  # the monitor publishes every second on its own; this test reads every step
        self.rows.append((self.before, batch, scrape(self.monitor.url)))


def reference_norms(weights: list[np.ndarray], batch: list[np.ndarray]) -> tuple[float, float]:
    """Global and `head` gradient norms from `mindspore.value_and_grad` on a fresh copy of the network, in
    PYNATIVE mode (a compiled graph keeps the parameter values it was first run with, whatever set_data says)."""
    ms.set_context(mode=ms.PYNATIVE_MODE)
    reference = small_network()
    for parameter, values in zip(reference.trainable_params(), weights, strict=True):
        parameter.set_data(Tensor(values))
    _, grads = ms.value_and_grad(reference, None, reference.trainable_params())(*(Tensor(b) for b in batch))
    names = [p.name for p in reference.trainable_params()]
    squares = {n: float(np.square(g.asnumpy().astype(np.float64)).sum()) for n, g in zip(names, grads, strict=True)}
    return math.sqrt(sum(squares.values())), math.sqrt(squares["head.weight"] + squares["head.bias"])


@MODES
def test_global_and_layer_norms_match_an_independent_reference(mode: int) -> None:
    ms.set_context(mode=mode)
    network = small_network()
    optimizer = nn.Momentum(network.trainable_params(), 0.01, 0.9)
    # A clip far below the real norm: clipping changes what is applied, not the norm reported (pre-clip).
    model = Model(GradNormTrainOneStepCell(network, optimizer, clip_norm=0.01))
    monitor = TrainingMonitor(
        port=0,
        web=FRESH,
        grad_norm={"every_n_steps": 1, "layers": ["head"], "top_k": 2, "threshold": 1e-3},
        warn_warmup_steps=0,  # four steps: watched from the first
    )
    recorder = RecordSteps(monitor, network)
    try:
        model.train(1, dataset(4), callbacks=[monitor, recorder], dataset_sink_mode=False)
        assert len(recorder.rows) == 4
        for weights, batch, metrics in recorder.rows:
            expected, head = reference_norms(weights, batch)
            assert metrics.value("mindspore_train_grad_norm") == pytest.approx(expected, rel=1e-4)
            assert metrics.value("mindspore_train_layer_grad_norm", layer="head") == pytest.approx(head, rel=1e-4)
            assert len(metrics.find("mindspore_train_layer_grad_norm")) == 3  # watched head + top 2
        final = recorder.rows[-1][2]
        assert final.value("mindspore_train_grad_norm_distribution_count") == 4
        assert final.value("mindspore_train_grad_norm_clipped_total") == 4
        assert final.value("mindspore_train_layer_grad_zero_total", layer="head") == 0
        # Every norm is above the 1e-3 threshold: one long episode, counted once.
        assert final.value("mindspore_train_threshold_breaches_total", metric="grad_norm") == 1
    finally:
        monitor.close()


class PhaseSpy(nn.Cell):
    """In PYNATIVE mode a Cell's construct runs as Python: it notes the monitor's phase while the step runs."""

    def __init__(self, network: nn.Cell) -> None:
        super().__init__()
        self.network = network
        self.monitor: TrainingMonitor | None = None
        self.seen: list[str | None] = []

    def construct(self, *inputs: Any) -> Any:
        assert self.monitor is not None
        self.seen.append(self.monitor.phases.phase)
        return self.network(*inputs)


def test_the_step_that_first_runs_the_norm_graph_is_counted_as_compilation() -> None:
    """The norm graph compiles inside step `every_n_steps`: a large model's compile there is not a hang."""
    ms.set_context(mode=ms.PYNATIVE_MODE)
    spy = PhaseSpy(small_network())
    cell = GradNormTrainOneStepCell(spy, nn.SGD(spy.trainable_params(), 0.01))
    monitor = TrainingMonitor(port=0, grad_norm={"every_n_steps": 3})
    spy.monitor = monitor
    try:
        Model(cell).train(1, dataset(7), callbacks=[monitor], dataset_sink_mode=False)
        assert spy.seen == ["compile", "step", "compile", "step", "step", "step", "step"]
        assert not cell.compiles_next()
    finally:
        monitor.close()


class MaskedHead(nn.Cell):
    """The demo network plus a `dead` layer whose output is multiplied by zero: its gradient is exactly 0."""

    def __init__(self) -> None:
        super().__init__()
        self.body = small_network()
        self.dead = nn.Dense(32, 1)

    def construct(self, input_ids: Any, attention_mask: Any, label: Any) -> Any:
        loss = self.body(input_ids, attention_mask, label)
        features = ops.ones((input_ids.shape[0], 32), ms.float32)
        return loss + (self.dead(features) * 0.0).sum()


def test_a_masked_layer_counts_zero_gradient_steps() -> None:
    ms.set_context(mode=ms.GRAPH_MODE)
    network = MaskedHead()
    model = Model(GradNormTrainOneStepCell(network, nn.Momentum(network.trainable_params(), 0.01, 0.9)))
    monitor = TrainingMonitor(
        port=0, web=FRESH, grad_norm={"every_n_steps": 2, "layers": ["dead", "body.head"], "top_k": 1}
    )
    try:
        model.train(1, dataset(6), callbacks=[monitor], dataset_sink_mode=False)
        final = scrape(monitor.url)
        assert final.value("mindspore_train_layer_grad_zero_total", layer="dead") == 3  # steps 2, 4, 6
        assert final.value("mindspore_train_layer_grad_norm", layer="dead") == 0.0
        assert final.value("mindspore_train_layer_grad_zero_total", layer="body.head") == 0
        assert final.value("mindspore_train_layer_grad_norm", layer="body.head") > 0
    finally:
        monitor.close()


class InjectAndRecord(Callback):
    def __init__(self, network: Boosted, overflow_steps: set[int]) -> None:
        super().__init__()
        self.network = network
        self.overflow_steps = overflow_steps
        self.reported: list[tuple[int, bool, float]] = []
        self.unchanged: list[bool] = []

    def on_train_step_begin(self, run_context: Any) -> None:
        step = run_context.original_args().cur_step_num  # already the number of the step about to run
        self.network.boost.set_data(Tensor(1e36 if step in self.overflow_steps else 1.0, ms.float32))
        self.before = self.network.body.head.weight.asnumpy().copy()

    def on_train_step_end(self, run_context: Any) -> None:
        cb_params = run_context.original_args()
        _, overflow, scale = cb_params.net_outputs
        self.reported.append((cb_params.cur_step_num, bool(overflow.asnumpy()), float(scale.asnumpy())))
        self.unchanged.append(bool(np.array_equal(self.before, self.network.body.head.weight.asnumpy())))


@MODES
def test_overflow_and_loss_scale_follow_the_cell(mode: int) -> None:
    ms.set_context(mode=mode)
    network = Boosted(small_network())  # the boost is set huge for chosen steps: the scaled gradients overflow
    cell = LossScaleTrainOneStepCell(
        network, nn.Momentum(network.trainable_params(), 0.01, 0.9), init_scale=2.0**16, scale_window=3
    )
    recorder = InjectAndRecord(network, overflow_steps={2, 3})
    monitor = TrainingMonitor(port=0, web=FRESH, grad_norm={"every_n_steps": 1})
    try:
        Model(cell).train(1, dataset(8), callbacks=[monitor, recorder], dataset_sink_mode=False)
        final = scrape(monitor.url)
        overflows = [step for step, overflow, _ in recorder.reported if overflow]
        assert overflows == [2, 3]  # the cell really detected the injected overflow
        assert recorder.unchanged == [step in (2, 3) for step in range(1, 9)]  # and skipped exactly those updates
        scales = [scale for _, _, scale in recorder.reported]
        assert scales[:4] == [2.0**16, 2.0**16, 2.0**15, 2.0**14]  # halved after each overflow
        assert scales[-1] == 2.0**15  # grew back after 3 clean steps
        assert final.value("mindspore_train_overflow_steps_total") == 2
        assert final.value("mindspore_train_loss_scale") == scales[-1]
    finally:
        monitor.close()


def test_fixed_loss_scale_manager_scale_is_exported() -> None:
    ms.set_context(mode=ms.GRAPH_MODE)
    features = np.random.default_rng(0).random((32, 4)).astype(np.float32)
    labels = (features.sum(1) > 2).astype(np.int32)
    import mindspore.dataset as ds

    data = ds.NumpySlicesDataset({"x": features, "y": labels}, shuffle=False).batch(8)
    network = nn.Dense(4, 2)
    model = Model(
        network,
        nn.SoftmaxCrossEntropyWithLogits(sparse=True, reduction="mean"),
        nn.Momentum(network.trainable_params(), 0.01, 0.9, loss_scale=128.0),
        loss_scale_manager=FixedLossScaleManager(128.0, drop_overflow_update=False),
    )
    monitor = TrainingMonitor(port=0, web=FRESH)
    try:
        model.train(1, data, callbacks=[monitor], dataset_sink_mode=False)
        final = scrape(monitor.url)
        assert final.value("mindspore_train_loss_scale") == 128.0
        assert final.find("mindspore_train_overflow_steps_total") == []  # no overflow flag in a scalar output
    finally:
        monitor.close()


class MindFormersLike(nn.Cell):
    """Returns MindSpore Transformers' shapes: (loss, overflow, scaling_sens, lr, global_norm[, local_norms, sizes])."""

    def __init__(self, inner: GradNormTrainOneStepCell, seven: bool) -> None:
        super().__init__(auto_prefix=False)
        self.inner = inner
        self.weights = inner.weights
        self.seven = seven

    def construct(self, *inputs: Any) -> Any:
        loss, global_norm, local_norms = self.inner(*inputs)
        overflow = ops.zeros((), ms.bool_)
        scale = ops.ones((), ms.float32) * 1024.0
        lr = ops.ones((), ms.float32) * 0.01
        if self.seven:
            return loss, overflow, scale, lr, global_norm, local_norms, ops.ones_like(local_norms)
        return loss, overflow, scale, lr, global_norm


class RecordNorm(Callback):
    def __init__(self) -> None:
        super().__init__()
        self.norms: list[float] = []

    def on_train_step_end(self, run_context: Any) -> None:
        self.norms.append(float(run_context.original_args().net_outputs[4].asnumpy()))


@pytest.mark.parametrize("seven", [False, True], ids=["5-tuple", "7-tuple"])
def test_mindspore_transformers_output_shapes(seven: bool) -> None:
    ms.set_context(mode=ms.GRAPH_MODE)
    network = small_network()
    inner = GradNormTrainOneStepCell(network, nn.Momentum(network.trainable_params(), 0.01, 0.9))
    recorder = RecordNorm()
    monitor = TrainingMonitor(port=0, web=FRESH, grad_norm={"every_n_steps": 1, "layers": ["head"]})
    try:
        Model(MindFormersLike(inner, seven)).train(
            1, dataset(3), callbacks=[monitor, recorder], dataset_sink_mode=False
        )
        final = scrape(monitor.url)
        assert final.value("mindspore_train_grad_norm") == pytest.approx(recorder.norms[-1], rel=1e-6)
        assert final.value("mindspore_train_loss_scale") == 1024.0
        assert final.value("mindspore_train_overflow_steps_total") == 0
        assert final.has("mindspore_train_layer_grad_norm", layer="head") == seven  # local norms name layers
    finally:
        monitor.close()


def test_return_grad_outputs_give_the_norm_on_the_host() -> None:
    ms.set_context(mode=ms.PYNATIVE_MODE)
    network = small_network()
    cell = nn.TrainOneStepCell(network, nn.Momentum(network.trainable_params(), 0.01, 0.9), return_grad=True)
    expected: list[float] = []

    class FromDict(Callback):
        def on_train_step_end(self, run_context: Any) -> None:
            _, grads = run_context.original_args().net_outputs
            expected.append(
                math.sqrt(sum(float(np.square(g.asnumpy().astype(np.float64)).sum()) for g in grads.values()))
            )

    monitor = TrainingMonitor(port=0, web=FRESH, grad_norm={"every_n_steps": 2})
    try:
        Model(cell).train(1, dataset(2), callbacks=[monitor, FromDict()], dataset_sink_mode=False)
        assert scrape(monitor.url).value("mindspore_train_grad_norm") == pytest.approx(expected[1], rel=1e-6)
    finally:
        monitor.close()


class Perturb(Callback):
    """Doubles one LayerNorm gamma at the end of step 3, and records every gamma's mean before that."""

    def __init__(self, network: nn.Cell, monitor: TrainingMonitor) -> None:
        super().__init__()
        self.network = network
        self.monitor = monitor
        self.checked = False

    def on_train_step_end(self, run_context: Any) -> None:
        if run_context.original_args().cur_step_num != 3:
            return
        self.monitor.publish()
        metrics = scrape(self.monitor.url)
        for parameter in self.network.trainable_params():
            if parameter.name.endswith(".gamma"):
                layer = parameter.name.rsplit(".", 1)[0]
                values = parameter.asnumpy().astype(np.float64)
                assert metrics.value("mindspore_train_layernorm_scale_mean", layer=layer) == pytest.approx(
                    values.mean(), rel=1e-9
                )
                # Reduced on the device in float32 (two passes around the first value): a part in a million.
                assert metrics.value("mindspore_train_layernorm_scale_std", layer=layer) == pytest.approx(
                    values.std(), rel=1e-6
                )
                self.checked = True
        gamma = self.network.encoder.layers[0].norm1.gamma
        gamma.set_data(Tensor(gamma.asnumpy() * 2.0))


def test_layernorm_statistics_and_drift() -> None:
    # PYNATIVE: there set_data on a parameter reaches the training step too (a compiled graph keeps its own copy).
    ms.set_context(mode=ms.PYNATIVE_MODE)
    network = small_network()
    model = Model(network, optimizer=nn.Momentum(network.trainable_params(), 0.001, 0.9))
    monitor = TrainingMonitor(
        port=0, web=FRESH, layernorm={"every_n_steps": 1, "window": 4, "drift_threshold": 0.3}, warn_warmup_steps=0
    )
    perturb = Perturb(network, monitor)
    try:
        model.train(1, dataset(6), callbacks=[monitor, perturb], dataset_sink_mode=False)
        assert perturb.checked
        final = scrape(monitor.url)
        drift = {
            labels["layer"]: value
            for labels, value in zip(
                final.labels_of("mindspore_train_layernorm_scale_drift_ratio"),
                final.find("mindspore_train_layernorm_scale_drift_ratio"),
                strict=True,
            )
        }
        assert set(drift) == {"encoder.layers.0.norm1", "encoder.layers.0.norm2"}
        assert drift["encoder.layers.0.norm1"] == pytest.approx(1.0, abs=0.05)  # doubled within the window
        assert abs(drift["encoder.layers.0.norm2"]) < 0.05
        assert final.value("mindspore_train_threshold_breaches_total", metric="layernorm_scale_drift_ratio") == 1
    finally:
        monitor.close()


@pytest.mark.parametrize("wrapped", [False, True], ids=["model-with-optimizer", "grad-norm-cell"])
def test_weight_norm_of_watched_layers(wrapped: bool, caplog: pytest.LogCaptureFixture) -> None:
    ms.set_context(mode=ms.GRAPH_MODE)
    network = small_network()
    optimizer = nn.Momentum(network.trainable_params(), 0.01, 0.9)
    # Model(cell) leaves cb_params.optimizer empty: the probe must find the weights through the cell.
    model = Model(GradNormTrainOneStepCell(network, optimizer)) if wrapped else Model(network, optimizer=optimizer)
    monitor = TrainingMonitor(port=0, web=FRESH, weight_norm=True, grad_norm={"every_n_steps": 2, "layers": ["head"]})
    try:
        caplog.set_level(logging.INFO, logger="ms_exporter")
        model.train(1, dataset(6), callbacks=[monitor], dataset_sink_mode=False)
        # With the cell, the steps between measured ones must not be mistaken for "no gradient norm".
        assert ("reports no gradient norm" in caplog.text) == (not wrapped)
        expected = math.sqrt(
            float(
                np.square(network.head.weight.asnumpy().astype(np.float64)).sum()
                + np.square(network.head.bias.asnumpy().astype(np.float64)).sum()
            )
        )
        assert scrape(monitor.url).value("mindspore_train_weight_norm", layer="head") == pytest.approx(expected)
    finally:
        monitor.close()
