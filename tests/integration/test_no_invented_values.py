"""A series exists only when its quantity was measured: nothing before training but who the rank is, and after
training no family that the run could not measure (gradient norms without a cell that reports them, a loss
scale without loss scaling), under every train cell and with the actions on or off."""

from __future__ import annotations

from typing import Any

import mindspore as ms
import pytest
from mindspore import nn
from mindspore.train import Callback, Model

from ms_exporter import TrainingMonitor
from ms_exporter.cells.train_cells import GradNormTrainOneStepCell, LossScaleTrainOneStepCell
from ms_exporter.core import catalogue
from ms_exporter.demo import build_network, synthetic_dataset
from tests.support.scrape import Scrape, scrape

pytestmark = pytest.mark.integration

STEPS = 24
ACTIONS = {
    "early_stop": {"enable": True, "unit": "step", "patience": 10_000},
    "lr_backoff": {"enable": True},
    "snapshot": {"enable": True},
}
# Gauges a rank knows before its first step: who it is, and what the actions have done so far (nothing: scale 1).
# Identity known at construction: the rank's, and the run it belongs to (docs/goodput.md).
KNOWN_AT_START = {catalogue.INFO, catalogue.WORLD_SIZE, catalogue.LR_BACKOFF_FACTOR, catalogue.RUN_INFO}
GRAD_NORM_FAMILIES = {
    catalogue.GRAD_NORM,
    catalogue.GRAD_NORM_DISTRIBUTION,
    catalogue.LAYER_GRAD_NORM,
    catalogue.LAYER_GRAD_ZERO,
    catalogue.GRAD_NORM_CLIPPED,
}
LOSS_SCALE_FAMILIES = {catalogue.LOSS_SCALE, catalogue.OVERFLOW_STEPS}


class _StopAt(Callback):
    def on_train_step_end(self, run_context: Any) -> None:
        if run_context.original_args().cur_step_num >= STEPS:
            run_context.request_stop()


def _model(cell: str) -> Model:
    network = build_network(layers=1, d_model=32)
    optimizer = nn.Adam(network.trainable_params(), learning_rate=1e-3)
    if cell == "grad_norm":
        return Model(GradNormTrainOneStepCell(network, optimizer))
    if cell == "loss_scale":
        return Model(LossScaleTrainOneStepCell(network, optimizer))
    return Model(nn.TrainOneStepCell(network, optimizer))


def _present(page: Scrape) -> set[catalogue.MetricFamily]:
    names = {sample.name for sample in page.samples}
    return {family for family in catalogue.FAMILIES if family.name in names or family.sum in names}


# The suite runs each cell once (plain without actions, the other two with them); `make test-long` runs all six.
IN_THE_SUITE = {("plain", False), ("grad_norm", True), ("loss_scale", True)}


@pytest.mark.parametrize(
    ("cell", "actions"),
    [
        pytest.param(
            cell,
            actions,
            id=f"{cell}-{'actions' if actions else 'no-actions'}",
            marks=() if (cell, actions) in IN_THE_SUITE else pytest.mark.long,
        )
        for cell in ("plain", "grad_norm", "loss_scale")
        for actions in (False, True)
    ],
)
def test_only_measured_quantities_are_exported(cell: str, actions: bool, tmp_path: Any) -> None:
    ms.set_context(mode=ms.GRAPH_MODE)
    monitor = TrainingMonitor(
        port=0, save_dir=str(tmp_path), web={"cache_seconds": 0}, actions=ACTIONS if actions else {}
    )
    try:
        before = scrape(monitor.url)
        gauges = {family for family in _present(before) if family.type == "gauge"}
        assert gauges <= KNOWN_AT_START, f"gauges before any step: {sorted(f.name for f in gauges - KNOWN_AT_START)}"
        _model(cell).train(
            1, synthetic_dataset(size=STEPS * 16), callbacks=[monitor, _StopAt()], dataset_sink_mode=False
        )
        monitor.publish()
        after = _present(scrape(monitor.url))
    finally:
        monitor.close()
    assert {
        catalogue.LOSS,
        catalogue.GLOBAL_STEP,
        catalogue.LAST_STEP_TIMESTAMP,
        catalogue.STEP_DURATION,
        catalogue.SAMPLES_PER_SECOND,
        catalogue.TOKENS_PER_SECOND,
        catalogue.LEARNING_RATE,
    } <= after
    measures_norms = cell == "grad_norm"
    assert (catalogue.GRAD_NORM in after) == measures_norms, "a gradient norm nobody measured"
    if not measures_norms:
        assert not after & GRAD_NORM_FAMILIES, sorted(f.name for f in after & GRAD_NORM_FAMILIES)
    assert (after & LOSS_SCALE_FAMILIES != set()) == (cell == "loss_scale"), "a loss scale nobody measured"
    # One rank has no replicas: no fingerprint (docs/divergence.md).
    assert catalogue.PARAM_FINGERPRINT not in after
