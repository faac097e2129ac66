"""Activation statistics from real training (Model.train), switched on from YAML alone and scraped from /metrics:
at each measured step equal to the statistics of an independent reference of the layer's output, held between
measured steps, in both modes; and the training itself unchanged."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import mindspore as ms
import numpy as np
import pytest
from mindspore import Tensor, nn
from mindspore.train import Callback, Model

from ms_exporter import TrainingMonitor
from ms_exporter.demo import build_network, synthetic_dataset
from tests.support.scrape import Scrape, scrape

pytestmark = pytest.mark.integration
MODES = pytest.mark.parametrize("mode", [ms.GRAPH_MODE, ms.PYNATIVE_MODE], ids=["graph", "pynative"])
BATCH = 8
STATISTICS = ("mean", "std", "abs_max", "zero_ratio", "nonfinite_ratio")

YAML = """\
monitor_config:
  port: 0
  web: {cache_seconds: 0}
  activations:
    enable: true
    layers: ["embed$", "head$"]
    every_n_steps: 3
"""


def small_network() -> nn.Cell:
    return build_network(layers=1, d_model=32, heads=2)


class RecordSteps(Callback):
    """Each step's weights (copied before it), batch and scrape, for the reference computed afterwards."""

    def __init__(self, monitor: TrainingMonitor, network: nn.Cell) -> None:
        super().__init__()
        self.monitor = monitor
        self.network = network
        self.rows: list[tuple[int, dict[str, np.ndarray], list[np.ndarray], Scrape]] = []

    def on_train_step_begin(self, run_context: Any) -> None:
        self.before = {p.name: p.asnumpy().copy() for p in self.network.trainable_params()}

    def on_train_step_end(self, run_context: Any) -> None:
        cb_params = run_context.original_args()
        batch = [t.asnumpy().copy() for t in cb_params.train_dataset_element]
        self.monitor.publish()
        self.rows.append((cb_params.cur_step_num, self.before, batch, scrape(self.monitor.url)))


def reference_outputs(weights: dict[str, np.ndarray], batch: list[np.ndarray]) -> dict[str, np.ndarray]:
    """The embedding's output by indexing its table in numpy; the head's (the logits) from a fresh copy of the
    network in PYNATIVE mode with the step's weights, through its own `logits` (no hook, no wrapper)."""
    input_ids, attention_mask, _ = batch
    mode = ms.get_context("mode")
    ms.set_context(mode=ms.PYNATIVE_MODE)
    try:
        reference = small_network()
        for parameter in reference.trainable_params():
            parameter.set_data(Tensor(weights[parameter.name]))
        logits = reference.logits(Tensor(input_ids), Tensor(attention_mask)).asnumpy()
    finally:
        ms.set_context(mode=mode)
    return {"embed": weights["embed.embedding_table"][input_ids], "head": logits}


def expected(values: np.ndarray) -> list[float]:
    values = values.astype(np.float64).ravel()
    return [
        float(values.mean()),
        float(values.std()),
        float(np.abs(values).max()),
        float(np.count_nonzero(values == 0)) / values.size,
        0.0,
    ]


def scraped(metrics: Scrape, layer: str) -> list[float] | None:
    found = [metrics.find(f"mindspore_train_layer_activation_{name}", layer=layer) for name in STATISTICS]
    return None if not any(found) else [values[0] for values in found]


@MODES
def test_statistics_from_yaml_match_a_reference_at_measured_steps_and_hold_between(mode: int, tmp_path: Path) -> None:
    ms.set_context(mode=mode)
    config = tmp_path / "monitor.yaml"
    config.write_text(YAML)
    network = small_network()
    model = Model(network, optimizer=nn.Momentum(network.trainable_params(), 0.05, 0.9))
    monitor = TrainingMonitor(str(config))
    recorder = RecordSteps(monitor, network)
    try:
        # Model.train's default dataset_sink_mode=True: on a CPU MindSpore runs a step at a time all the same.
        model.train(1, synthetic_dataset(size=7 * BATCH, batch=BATCH), callbacks=[monitor, recorder])
        assert [row[0] for row in recorder.rows] == list(range(1, 8))
        last: dict[str, list[float] | None] = {"embed": None, "head": None}
        for step, weights, batch, metrics in recorder.rows:
            if step % 3 == 0:
                outputs = reference_outputs(weights, batch)
                for layer in ("embed", "head"):
                    got = scraped(metrics, layer)
                    assert got == pytest.approx(expected(outputs[layer]), rel=1e-4, abs=1e-6), (step, layer)
                    last[layer] = got
            else:
                for layer in ("embed", "head"):  # none before step 3; then the last measured step's, unchanged
                    assert scraped(metrics, layer) == last[layer], (step, layer)
        assert scraped(recorder.rows[2][3], "head") != scraped(recorder.rows[5][3], "head")  # the weights moved
        final = recorder.rows[-1][3]
        assert {labels["layer"] for labels in final.labels_of("mindspore_train_layer_activation_std")} == {
            "embed",
            "head",
        }
        assert final.find("mindspore_exporter_errors_total", component="activations") in ([], [0.0])
    finally:
        monitor.close()
    assert type(network.name_cells()["head"]) is nn.Dense  # the network is as it was given


class Losses(Callback):
    def __init__(self) -> None:
        super().__init__()
        self.values: list[float] = []

    def on_train_step_end(self, run_context: Any) -> None:
        self.values.append(float(run_context.original_args().net_outputs.asnumpy()))


def _train(network: nn.Cell, weights: dict[str, np.ndarray], monitor: TrainingMonitor | None) -> list[float]:
    for parameter in network.trainable_params():
        parameter.set_data(Tensor(weights[parameter.name]))
    losses = Losses()
    callbacks: list[Any] = [losses] if monitor is None else [monitor, losses]
    model = Model(network, optimizer=nn.Momentum(network.trainable_params(), 0.05, 0.9))
    model.train(1, synthetic_dataset(size=6 * BATCH, batch=BATCH), callbacks=callbacks, dataset_sink_mode=False)
    return losses.values


def test_graph_mode_training_is_unchanged_by_the_wrappers_and_the_measured_graph() -> None:
    """Every other step runs the measured graph: the losses are those of the same training without the monitor."""
    ms.set_context(mode=ms.GRAPH_MODE)
    weights = {p.name: p.asnumpy().copy() for p in small_network().trainable_params()}
    plain = _train(small_network(), weights, None)
    monitor = TrainingMonitor(
        port=0, activations={"enable": True, "layers": [r"encoder\.layers\.0$"], "every_n_steps": 2}
    )
    try:
        measured = _train(small_network(), weights, monitor)
        metrics = scrape(monitor.url)
    finally:
        monitor.close()
    assert len(plain) == len(measured) == 6 and all(math.isfinite(loss) for loss in plain)
    np.testing.assert_allclose(measured, plain, rtol=1e-6)
    assert metrics.value("mindspore_train_layer_activation_std", layer="encoder.layers.0") > 0
