"""Activation statistics (probes/activations.py, cells/activation_stats.py) on tiny real networks on the CPU, in
both modes: the values are numpy's statistics of the layer's output at the measured step, non-finite values are
counted apart, the series are bounded, and a pattern that matches no cell is named."""

from __future__ import annotations

import logging
import math
from collections.abc import Iterator
from typing import Any

import mindspore as ms
import numpy as np
import pytest
from mindspore import Tensor, nn

from ms_exporter import GradNormTrainOneStepCell, TrainingMonitor
from ms_exporter.cells.activation_stats import MEASURED_PHASE, ActivationStatsCell, backbone_of
from ms_exporter.config.sections import ActivationsConfig
from ms_exporter.core import catalogue
from ms_exporter.core.store import MetricStore
from ms_exporter.probes import activations as activations_module
from ms_exporter.probes.activations import ActivationsProbe
from tests.support.transfers import count_transfers

STATISTICS = (
    catalogue.LAYER_ACTIVATION_MEAN,
    catalogue.LAYER_ACTIVATION_STD,
    catalogue.LAYER_ACTIVATION_ABS_MAX,
    catalogue.LAYER_ACTIVATION_ZERO_RATIO,
    catalogue.LAYER_ACTIVATION_NONFINITE_RATIO,
)
MODES = pytest.mark.parametrize("mode", [ms.GRAPH_MODE, ms.PYNATIVE_MODE], ids=["graph", "pynative"])


@pytest.fixture(autouse=True)
def _restore_mode() -> Iterator[None]:
    mode = ms.get_context("mode")
    yield
    ms.set_context(mode=mode)


class Mlp(nn.Cell):
    def __init__(self) -> None:
        super().__init__()
        self.fc1 = nn.Dense(8, 16)
        self.act = nn.ReLU()
        self.fc2 = nn.Dense(16, 2)

    def construct(self, x: Any) -> Any:
        return self.fc2(self.act(self.fc1(x)))


class Deep(nn.Cell):
    """Ten blocks in a SequentialCell (which calls a list it keeps beside its cells) and a loss of its own."""

    def __init__(self) -> None:
        super().__init__()
        self.blocks = nn.SequentialCell([nn.Dense(4, 4) for _ in range(10)])
        self.head = nn.Dense(4, 2)
        self.loss = nn.SoftmaxCrossEntropyWithLogits(sparse=True, reduction="mean")

    def construct(self, x: Any, y: Any) -> Any:
        return self.loss(self.head(self.blocks(x)), y)


class Run:
    """A train cell stepped by hand, with the probe's hooks called as TrainingMonitor calls them."""

    def __init__(
        self, network: nn.Cell, with_loss: bool = True, train_cell: Any = nn.TrainOneStepCell, **settings: Any
    ) -> None:
        self.network = network
        loss = nn.WithLossCell(network, nn.SoftmaxCrossEntropyWithLogits(sparse=True, reduction="mean"))
        self.cell = train_cell(loss if with_loss else network, nn.SGD(network.trainable_params(), 0.1))
        self.cell.set_train()
        self.cell.phase = "train"  # as Model sets it
        self.store = MetricStore()
        self.probe = ActivationsProbe(self.store, ActivationsConfig(**{"enable": True, **settings}))
        self.step = 0
        self.batch: list[Tensor] = []
        self.cb_params: dict[str, Any] = {"train_network": self.cell, "network": network, "cur_step_num": 0}

    def begin(self, *batch: np.ndarray) -> None:
        self.batch = [Tensor(b) for b in batch]
        self.cb_params["train_dataset_element"] = self.batch
        self.cb_params["cur_step_num"] = self.step
        self.probe.on_train_begin(self.cb_params)

    def one(self) -> None:
        self.step += 1
        outputs = self.cell(*self.batch)
        (outputs[0] if isinstance(outputs, tuple) else outputs).asnumpy()  # the loss read ends the step
        self.probe.on_step_end(self.step, None)

    def measured_layers(self, *batch: np.ndarray) -> set[str]:
        """The layers one measured step after train begin exports, the probe closed after."""
        self.begin(*batch)
        try:
            self.one()
            return {dict(c.labels)["layer"] for c in self.store.get(catalogue.LAYER_ACTIVATION_MEAN.name).children()}
        finally:
            self.probe.close()

    def values(self, layer: str) -> list[float] | None:
        found = []
        for family in STATISTICS:
            registered = self.store.get(family.name)
            series = [c for c in registered.children() if dict(c.labels) == {"layer": layer}] if registered else []
            if not series:
                return None
            found.append(series[0].value)
        return found


def numpy_statistics(values: np.ndarray) -> list[float]:
    """What the gauges must say: mean, std and max |x| of the finite values, then the two shares of all values."""
    values = values.astype(np.float64).ravel()
    finite = values[np.isfinite(values)]
    zero = float(np.count_nonzero(values == 0)) / values.size
    nonfinite = 1.0 - finite.size / values.size
    if finite.size == 0:
        return [math.nan, math.nan, math.nan, zero, nonfinite]
    return [float(finite.mean()), float(finite.std()), float(np.abs(finite).max()), zero, nonfinite]


def batch(seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    return rng.normal(size=(4, 8)).astype(np.float32), np.array([0, 1, 0, 1], np.int32)


@MODES
def test_the_statistics_are_numpys_of_the_layer_output_at_each_measured_step(mode: int) -> None:
    ms.set_context(mode=mode)
    network = Mlp()
    run = Run(network, layers=["fc1$", "act"], every_n_steps=3)
    x, y = batch()
    run.begin(x, y)
    try:
        seen: dict[int, list[float] | None] = {}
        for _ in range(7):
            # asnumpy() shares the parameter's memory on a CPU: copy before the step updates it in place.
            weight, bias = network.fc1.weight.asnumpy().copy(), network.fc1.bias.asnumpy().copy()
            run.one()
            seen[run.step] = run.values("fc1")
            if run.step % 3 == 0:
                hidden = x @ weight.T + bias
                assert run.values("fc1") == pytest.approx(numpy_statistics(hidden), rel=1e-5, abs=1e-6)
                assert run.values("act") == pytest.approx(numpy_statistics(np.maximum(hidden, 0)), rel=1e-5, abs=1e-6)
                assert 0 < run.values("act")[3] < 1  # the ReLU's zeros are counted
        # Nothing before the first measured step, and the values of a measured step hold until the next one.
        assert seen[1] is None and seen[2] is None
        assert seen[3] == seen[4] == seen[5] != seen[6] == seen[7]
        # The names are the parameters' (fc1.weight): the network's, not the train cell's path to it.
        layers = {dict(c.labels)["layer"] for c in run.store.get(catalogue.LAYER_ACTIVATION_MEAN.name).children()}
        assert layers == {"fc1", "act"}
    finally:
        run.probe.close()


@MODES
def test_the_nonfinite_share_counts_an_injected_inf_and_the_rest_stays_measured(mode: int) -> None:
    ms.set_context(mode=mode)
    network = Mlp()
    run = Run(network, layers=["fc1$"], every_n_steps=1)
    x, y = batch()
    x[1, 3] = np.inf  # row 1 of fc1's output becomes +-inf or NaN; the other three rows stay finite
    weight, bias = network.fc1.weight.asnumpy().copy(), network.fc1.bias.asnumpy().copy()
    run.begin(x, y)
    try:
        run.one()
        with np.errstate(invalid="ignore"):
            hidden = x @ weight.T + bias
        expected = numpy_statistics(hidden)
        assert expected[4] == 16 / 64
        assert run.values("fc1") == pytest.approx(expected, rel=1e-5, abs=1e-6)
    finally:
        run.probe.close()


@MODES
def test_an_output_without_a_finite_value_has_no_mean_std_or_max(mode: int) -> None:
    ms.set_context(mode=mode)
    run = Run(Mlp(), layers=["fc1$"], every_n_steps=1)
    x, y = batch()
    run.begin(np.full_like(x, np.nan), y)
    try:
        run.one()
        mean, std, abs_max, zero, nonfinite = run.values("fc1") or []
        assert math.isnan(mean) and math.isnan(std) and math.isnan(abs_max)  # not the 0 the reduction leaves
        assert (zero, nonfinite) == (0.0, 1.0)
    finally:
        run.probe.close()


@MODES
def test_layers_are_bounded_and_spread_over_the_depth(mode: int, caplog: pytest.LogCaptureFixture) -> None:
    ms.set_context(mode=mode)
    caplog.set_level(logging.INFO, logger="ms_exporter")
    network = Deep()
    run = Run(network, with_loss=False, layers=[r"blocks\.\d+$"], max_layers=4, every_n_steps=2)
    rng = np.random.default_rng(1)
    run.begin(rng.normal(size=(3, 4)).astype(np.float32), np.array([0, 1, 1], np.int32))
    try:
        run.one()
        run.one()
        layers = [dict(c.labels)["layer"] for c in run.store.get(catalogue.LAYER_ACTIVATION_STD.name).children()]
        assert sorted(layers) == ["blocks.0", "blocks.3", "blocks.6", "blocks.9"]  # the first, the last, between
        for family in STATISTICS:
            assert len(run.store.get(family.name).children()) == 4
        assert any("matches 10 cells; watching 4" in record.getMessage() for record in caplog.records)
    finally:
        run.probe.close()


@MODES
def test_a_sample_of_several_layers_is_one_read_from_the_device(mode: int, monkeypatch: pytest.MonkeyPatch) -> None:
    ms.set_context(mode=mode)
    run = Run(Deep(), with_loss=False, layers=[r"blocks\.\d+$"], max_layers=4, every_n_steps=2)
    rng = np.random.default_rng(1)
    run.begin(rng.normal(size=(3, 4)).astype(np.float32), np.array([0, 1, 1], np.int32))
    try:
        for _ in range(3):  # the first measured step (2) compiles what a sample runs
            run.one()
        transfers = count_transfers(monkeypatch)
        run.step += 1  # step 4, measured, by hand: only the probe's reads are counted
        run.cell(*run.batch).asnumpy()
        transfers.clear()
        run.probe.on_step_end(run.step, None)
        # Four layers' six float32 in one read (MindSpore 2.7 in PYNATIVE also reads a few scalars of its own).
        assert max(transfers.sizes) == 4 * 6 * 4 and sum(transfers.sizes) < 2 * 4 * 6 * 4
        assert all(run.values(f"blocks.{i}") is not None for i in (0, 3, 6, 9))
    finally:
        run.probe.close()


def test_without_layers_the_top_level_cells_but_the_loss_are_measured() -> None:
    ms.set_context(mode=ms.PYNATIVE_MODE)
    run = Run(Deep(), with_loss=False, every_n_steps=1)
    assert run.measured_layers(np.ones((3, 4), np.float32), np.array([0, 1, 1], np.int32)) == {"blocks", "head"}


@pytest.mark.parametrize("optimizer", [nn.SGD, nn.Momentum, nn.Adam])
def test_layer_names_are_paths_in_the_users_network_whatever_model_was_given(optimizer: Any) -> None:
    """Model(network, loss_fn, opt) hands the callback the network; Model(train_cell) the train cell, whose
    `weights` and optimizer carry parameter names of their own: the cells are named from the user's network."""
    network = Mlp()
    settings = {"momentum": 0.9} if optimizer is nn.Momentum else {}
    loss = nn.WithLossCell(network, nn.SoftmaxCrossEntropyWithLogits(sparse=True, reduction="mean"))
    cell = GradNormTrainOneStepCell(loss, optimizer(network.trainable_params(), 0.1, **settings))
    assert backbone_of(network, cell) is network
    assert backbone_of(cell, cell) is network
    assert backbone_of(None, cell) is network
    aliased = Aliased()  # MindSpore renamed fc1's parameters alias.weight: no cell qualifies, the network given does
    renamed = nn.TrainOneStepCell(aliased, optimizer(aliased.trainable_params(), 0.1, **settings))
    assert backbone_of(aliased, renamed) is aliased


def test_a_pattern_that_matches_no_cell_is_named_with_the_nearest_cells(caplog: pytest.LogCaptureFixture) -> None:
    ms.set_context(mode=ms.PYNATIVE_MODE)
    caplog.set_level(logging.WARNING, logger="ms_exporter")
    run = Run(Mlp(), layers=["fc_1", "act"])
    run.begin(*batch())
    try:
        warned = [record.getMessage() for record in caplog.records]
        assert len(warned) == 1, warned  # `act` matches
        assert "activations.layers pattern 'fc_1' matches no layer" in warned[0]
        assert "fc1" in warned[0].split("nearest")[1]
    finally:
        run.probe.close()


class Aliased(Mlp):
    """Calls fc1 through a second name: a wrapper put under the first is never called (GRAPH mode)."""

    def __init__(self) -> None:
        super().__init__()
        self.alias = self.fc1

    def construct(self, x: Any) -> Any:
        return self.fc2(self.act(self.alias(x)))


class Jitted(Mlp):
    """A network compiled with ms.jit: PYNATIVE mode runs no hook inside it."""

    @ms.jit
    def construct(self, x: Any) -> Any:
        return self.fc2(self.act(self.fc1(x)))


@pytest.mark.parametrize(
    ("mode", "network", "why"),
    [(ms.GRAPH_MODE, Aliased, "some other way than through the attribute"), (ms.PYNATIVE_MODE, Jitted, "ms.jit")],
    ids=["graph_alias", "pynative_jit"],
)
def test_a_layer_whose_statistics_do_not_arrive_has_no_series_and_is_named_once(
    mode: int, network: type[Mlp], why: str, caplog: pytest.LogCaptureFixture
) -> None:
    ms.set_context(mode=mode)
    caplog.set_level(logging.WARNING, logger="ms_exporter")
    run = Run(network(), layers=["fc1$", "act"], every_n_steps=2)
    run.begin(*batch())
    try:
        for _ in range(4):
            run.one()
        assert run.values("fc1") is None
        warned = [record.getMessage() for record in caplog.records if "no statistics" in record.getMessage()]
        assert len(warned) == 1 and "fc1" in warned[0] and why in warned[0], warned  # once, at steps 2 and 4
        if mode == ms.GRAPH_MODE:
            assert run.values("act") is not None  # the others are measured all the same
    finally:
        run.probe.close()


def _grad_norm_cell(network: nn.Cell, optimizer: nn.Optimizer) -> GradNormTrainOneStepCell:
    # Its norm graph runs at steps 3, 6, 9 and 12, its plain graph at the others.
    return GradNormTrainOneStepCell(network, optimizer, every_n_steps=3)


@pytest.mark.parametrize("train_cell", [nn.TrainOneStepCell, _grad_norm_cell], ids=["plain", "grad_norm_cell"])
def test_graph_mode_runs_the_ordinary_graph_between_measured_steps(train_cell: Any) -> None:
    """The steps in between pay nothing: they run the graph without the statistics (the measured graph alone
    assigns them), and the train cell is back on its own phase. With both graphs of GradNormTrainOneStepCell."""
    ms.set_context(mode=ms.GRAPH_MODE)
    network = Mlp()
    run = Run(network, train_cell=train_cell, layers=["fc1$"], every_n_steps=4)
    names_before = [p.name for p in network.get_parameters()]
    run.begin(*batch())
    try:
        wrapper = network.name_cells()["fc1"]
        assert isinstance(wrapper, ActivationStatsCell)
        run.one()
        # The first step's end compiled the measured graph already: the step that first runs it does not compile.
        assert any(phase.startswith(MEASURED_PHASE) for phase in run.cell.compile_cache)
        before = wrapper.ms_exporter_statistics.asnumpy().copy()  # a CPU Parameter's asnumpy shares its memory
        for step in range(2, 14):
            run.one()
            # The weights move every step (SGD at 0.1): statistics computed in a step would differ from the last.
            now = wrapper.ms_exporter_statistics.asnumpy().copy()
            assert (not np.array_equal(now, before)) == (step % 4 == 0), step
            before = now
            armed = step % 4 == 3  # armed after the step before a measured one
            assert run.cell.phase == (MEASURED_PHASE if armed else "train")
        # The statistics are no parameter of the network (not trained, not in checkpoints); names unchanged.
        assert [p.name for p in network.get_parameters()] == names_before
        assert network.fc1.weight.shape == (16, 8)  # the wrapped cell's attributes are still reachable
    finally:
        run.probe.close()
    assert type(network.name_cells()["fc1"]) is nn.Dense  # close put the cell back


@MODES
def test_between_training_calls_the_network_is_as_given_and_the_next_call_measures_again(mode: int) -> None:
    ms.set_context(mode=mode)
    network = Mlp()
    run = Run(network, layers=["fc1$"], every_n_steps=2)
    x, y = batch()
    run.begin(x, y)
    try:
        run.one()
        run.one()
        first = run.values("fc1")
        run.probe.on_train_end(run.step, True)
        assert type(network.name_cells()["fc1"]) is nn.Dense
        run.begin(x, y)  # Model.train again: in GRAPH mode its graphs are the ones compiled in the first call
        run.one()
        weight, bias = network.fc1.weight.asnumpy().copy(), network.fc1.bias.asnumpy().copy()
        run.one()
        second = run.values("fc1")
        assert second != first
        assert second == pytest.approx(numpy_statistics(x @ weight.T + bias), rel=1e-5, abs=1e-6)
        run.probe.on_train_end(run.step, True)
    finally:
        run.probe.close()
    assert type(network.name_cells()["fc1"]) is nn.Dense


def test_pynative_mode_hooks_only_the_measured_steps() -> None:
    ms.set_context(mode=ms.PYNATIVE_MODE)
    network = Mlp()
    calls: list[int] = []
    run = Run(network, layers=["fc1$"], every_n_steps=3)
    run.begin(*batch())
    original = run.probe._collector._keeper  # type: ignore[union-attr]

    def counting(layer: str) -> Any:
        keep = original(layer)

        def hook(cell: Any, args: Any, output: Any) -> None:
            calls.append(run.step)  # the step running now
            keep(cell, args, output)

        return hook

    run.probe._collector._keeper = counting  # type: ignore[union-attr]
    try:
        for _ in range(7):
            run.one()
        assert calls == [3, 6]  # registered at the end of the step before each measured one, removed after it
    finally:
        run.probe.close()
    assert type(network.name_cells()["fc1"]) is nn.Dense  # PYNATIVE wraps nothing


def test_in_sink_mode_on_a_device_every_step_is_measured(monkeypatch: pytest.MonkeyPatch) -> None:
    """Where the whole loop is one graph compiled once, there is no second graph to switch to: the wrappers are
    active from the start and the statistics are read at each step end that reaches a measured step."""
    ms.set_context(mode=ms.GRAPH_MODE)
    monkeypatch.setattr(activations_module, "_whole_loop_graph", lambda cb_params: True)
    network = Mlp()
    run = Run(network, layers=["fc1$"], every_n_steps=2)
    run.begin(*batch())
    try:
        wrapper = network.name_cells()["fc1"]
        run.one()
        assert wrapper.ms_exporter_statistics.asnumpy()[0] == 64  # computed in an unmeasured step too
        assert run.values("fc1") is None  # but read only at the measured steps
        run.one()
        assert run.values("fc1") is not None
        assert run.cell.phase == "train"  # no switching
    finally:
        run.probe.close()


@pytest.mark.parametrize("enable", [False, True])
def test_the_monitor_builds_the_probe_only_when_switched_on(enable: bool) -> None:
    monitor = TrainingMonitor(port=0, activations={"enable": enable, "layers": ["encoder.*"], "every_n_steps": 50})
    try:
        assert sum(isinstance(part, ActivationsProbe) for part in monitor.parts) == int(enable)
        assert monitor.config.activations.every_n_steps == 50
    finally:
        monitor.close()


class Looped(nn.Cell):
    """Blocks in a CellList the network loops over: the list is never called, its cells are."""

    def __init__(self) -> None:
        super().__init__()
        self.blocks = nn.CellList([nn.Dense(8, 8) for _ in range(2)])
        self.head = nn.Dense(8, 2)

    def construct(self, x: Any) -> Any:
        for block in self.blocks:
            x = block(x)
        return self.head(x)


@MODES
def test_a_pattern_that_matches_a_cell_list_measures_its_cells_and_leaves_the_list_alone(mode: int) -> None:
    ms.set_context(mode=mode)
    run = Run(Looped(), every_n_steps=1, layers=("blocks",))
    assert run.measured_layers(*batch()) == {"blocks.0", "blocks.1"}
