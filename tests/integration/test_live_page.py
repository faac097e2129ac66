"""The live page on a rank's endpoint, rendered by real headless Chromium from a real training run."""

from __future__ import annotations

import json
import re
import urllib.request
from collections.abc import Iterator
from typing import Any

import mindspore as ms
import numpy as np
import pytest
from mindspore import Tensor, nn
from mindspore.train import Callback, Model

from ms_exporter import GradNormTrainOneStepCell, TrainingMonitor
from ms_exporter.core import catalogue as c
from ms_exporter.demo import build_network, synthetic_dataset
from tests.support.browser import dom, screenshot

pytestmark = pytest.mark.integration

STEPS = 40
NAN_STEP = 25
CHARTS = ("loss", "learning_rate", "throughput", "step_time", "data_wait", "grad_norm", "memory", "device_utilization")


class ReportNaN(Callback):
    """Placed before the monitor: the loss it reads at one step is NaN (training itself stays healthy)."""

    def on_train_step_end(self, run_context: Any) -> None:
        cb_params = run_context.original_args()
        if cb_params.cur_step_num == NAN_STEP:
            outputs = cb_params.net_outputs
            nan = Tensor(np.float32("nan"))
            cb_params.net_outputs = (nan, *outputs[1:]) if isinstance(outputs, tuple) else nan


def fetch(url: str) -> Any:
    with urllib.request.urlopen(url, timeout=10) as response:
        return json.loads(response.read())


@pytest.fixture(scope="module")
def trained() -> Iterator[TrainingMonitor]:
    """A real run with a non-finite loss at one step and a loss bound that the healthy steps breach."""
    ms.set_context(mode=ms.GRAPH_MODE)
    ms.set_seed(0)
    network = build_network(layers=1, d_model=32, heads=2)
    model = Model(GradNormTrainOneStepCell(network, nn.Momentum(network.trainable_params(), 0.01, 0.9)))
    monitor = TrainingMonitor(
        port=0,
        project="live-page",
        warmup_steps=2,
        warn_warmup_steps=2,
        grad_norm={"every_n_steps": 1},
        warn_on_value={"loss": 0.5},
    )
    model.train(
        1, synthetic_dataset(size=STEPS * 8, batch=8), dataset_sink_mode=False, callbacks=[ReportNaN(), monitor]
    )
    yield monitor
    monitor.close()


def test_series_api_returns_the_run_with_non_finite_steps_and_bounds(trained: TrainingMonitor) -> None:
    base = trained.url.removesuffix("metrics")
    payload = fetch(base + "api/series?since=-1")
    columns = payload["columns"]
    assert columns[:4] == ["step", "time", "loss", "step_time"] and "grad_norm" in columns
    steps = [row[0] for row in payload["rows"]]
    assert steps == list(range(1, STEPS + 1)) and payload["last_step"] == STEPS
    assert payload["nonfinite_loss_steps"] == [NAN_STEP]
    assert payload["rows"][NAN_STEP - 1][2] is None  # NaN travels as null
    smoothed = columns.index("loss_smoothed")
    assert payload["rows"][NAN_STEP - 1][smoothed] is None  # no smoothed loss for a NaN step: a gap
    assert payload["rows"][NAN_STEP][smoothed] is not None
    assert payload["breach_events"] and {metric for _, metric in payload["breach_events"]} == {"loss"}
    wait = columns.index("data_wait")
    assert payload["rows"][0][wait] is None and all(row[wait] >= 0 for row in payload["rows"][1:])
    assert payload["bounds"]["loss"] == {"max": 0.5}
    # A CPU rank's hardware columns are its host's; no DeviceHot line over a host CPU.
    assert payload["devices"]["device_utilization_ratio"] == "host"
    assert "device_temperature_celsius" not in payload["bounds"]
    utilization = columns.index("device_utilization_ratio")
    assert all(0 <= row[utilization] <= 1 for row in payload["rows"][3:])
    assert payload["labels"] == {"rank": "0", "project": "live-page"}
    newer = fetch(base + f"api/series?since={STEPS - 5}")
    assert [row[0] for row in newer["rows"]] == list(range(STEPS - 4, STEPS + 1))


def test_the_page_draws_every_chart_with_the_runs_points(trained: TrainingMonitor) -> None:
    page = dom(trained.url.removesuffix("metrics"))
    assert 'data-last-step="40"' in page
    canvases = {}
    for tag in re.findall(r"<canvas [^>]*>", page):
        attributes = dict(re.findall(r'([a-z-]+)="([^"]*)"', tag))
        if attributes["id"].startswith("c-") and "$" not in attributes["id"]:
            canvases[attributes["id"][2:]] = attributes
    points = {chart: a["data-points"] for chart, a in canvases.items()}
    markers = {chart: a.get("data-markers", "0") for chart, a in canvases.items()}
    # The hardware charts are shown once the rank has the reading: the host's CPUs here (its temperature only
    # where the kernel has a sensor, tests/unit/test_live_devices.py for accelerators).
    hidden = set(re.findall(r'<section[^>]* hidden="">\s*<h2>[^<]*<span class="[^"]*" id="v-([a-z_]+)"', page))
    temperature = trained.store.series_of(c.DEVICE_TEMPERATURE)
    assert hidden == (set() if temperature else {"device_temperature"}), hidden
    assert set(points) == {*CHARTS, "device_temperature"}, points
    assert int(points["device_utilization"]) >= STEPS - 3
    assert "host" in page
    assert int(points["loss"]) >= 2 * (STEPS - 1) - 2  # loss and smoothed loss, the NaN step left out
    for chart in CHARTS[1:]:
        assert int(points[chart]) >= STEPS - 3, (chart, points)  # data wait: none before the first step
    # The non-finite step and the breaches of the loss bound are marked on the loss chart, and only there.
    assert int(markers["loss"]) >= 2
    assert all(markers[chart] == "0" for chart in CHARTS if chart != "loss"), markers
    # The compile step is clipped, not drawn as the top of an axis that flattens every other step.
    assert int(canvases["step_time"]["data-clipped"]) >= 1
    assert "<script src=" not in page and "https://" not in page  # self-contained: nothing from elsewhere


@pytest.mark.parametrize(
    ("name", "width", "height"), [("live-page-phone.png", 390, 1600), ("live-page-desktop.png", 1280, 800)]
)
def test_screenshots(trained: TrainingMonitor, name: str, width: int, height: int) -> None:
    path = screenshot(trained.url.removesuffix("metrics"), name, width, height)
    assert path.stat().st_size > 10_000  # a page with charts, not a blank one


def test_the_page_needs_the_same_credentials_as_metrics() -> None:
    import hashlib

    monitor = TrainingMonitor(port=0, web={"basic_auth_users": {"u": "sha256:" + hashlib.sha256(b"p").hexdigest()}})
    try:
        base = monitor.url.removesuffix("metrics")
        for path in ("", "api/series?since=-1"):
            with pytest.raises(urllib.error.HTTPError) as refused:
                urllib.request.urlopen(base + path, timeout=10)
            assert refused.value.code == 401
    finally:
        monitor.close()
