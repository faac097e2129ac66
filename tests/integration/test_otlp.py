"""The otlp backend: real Model.train runs exporting to real OTLP receivers (gRPC and HTTP) that decode the wire."""

from __future__ import annotations

import logging
import math
import time
from typing import Any

import mindspore as ms
import pytest
from mindspore import nn
from mindspore.train import Model
from prometheus_client.parser import text_string_to_metric_families

from ms_exporter import TrainingMonitor
from ms_exporter.demo import build_network, synthetic_dataset
from ms_exporter.sinks.otlp import otlp_name
from ms_exporter.sinks.shared.otel_sdk import EXPORT_LOGGERS
from tests.support.otlp_receiver import GrpcReceiver, HttpReceiver, Point, free_port
from tests.support.scrape import Scrape, scrape

pytestmark = pytest.mark.integration

BATCH = 8
STEPS = 24


def train(steps: int = STEPS, **monitor_options: Any) -> TrainingMonitor:
    ms.set_context(mode=ms.GRAPH_MODE)
    ms.set_seed(0)
    network = build_network(layers=1, d_model=32, heads=2)
    model = Model(network, optimizer=nn.Momentum(network.trainable_params(), 0.01, 0.9))
    monitor = TrainingMonitor(port=0, project="otlp-test", warmup_steps=2, **monitor_options)
    model.train(1, synthetic_dataset(size=steps * BATCH, batch=BATCH), callbacks=[monitor], dataset_sink_mode=False)
    return monitor


def by_name(points: list[Point]) -> dict[str, list[Point]]:
    out: dict[str, list[Point]] = {}
    for point in points:
        out.setdefault(point.name, []).append(point)
    return out


def assert_same_numbers_as_the_scrape(points: list[Point], page: Scrape) -> None:
    """What arrived over OTLP equals /metrics for the series that no longer move after training."""
    named = by_name(points)
    (loss,) = named["mindspore_train_loss"]
    assert loss.kind == "gauge" and loss.attributes == {"rank": "0", "project": "otlp-test"}
    assert loss.value == pytest.approx(page.value("mindspore_train_loss"))
    (steps,) = named[otlp_name("mindspore_train_steps_total", "counter")]
    assert steps.kind == "sum" and steps.monotonic and steps.temporality == 2  # cumulative
    assert steps.value == page.value("mindspore_train_steps_total") == STEPS
    (duration,) = named["mindspore_train_step_duration_seconds"]
    assert duration.kind == "histogram" and duration.unit == "s" and duration.temporality == 2
    assert duration.count == page.value("mindspore_train_step_duration_seconds_count") == STEPS
    assert duration.total == pytest.approx(page.value("mindspore_train_step_duration_seconds_sum"))
    assert len(duration.bucket_counts) == len(duration.bounds) + 1
    cumulative = 0
    for bound, count in zip(duration.bounds, duration.bucket_counts, strict=False):
        cumulative += count
        assert cumulative == page.value("mindspore_train_step_duration_seconds_bucket", le=repr(float(bound)))
    # Every family of the scrape arrived, under its OTLP name (counters without _total), with as many series.
    # Non-finite values (the hang deadline of a rank that ended is NaN) do not travel over OTLP.
    scraped = {
        family.name: len(
            [
                s
                for s in family.samples
                if not s.name.endswith(("_bucket", "_sum", "_created")) and math.isfinite(s.value)
            ]
        )
        for family in text_string_to_metric_families(page.text)
    }
    assert {name: len(points) for name, points in named.items()} == {k: n for k, n in scraped.items() if n}


def test_grpc_export_carries_resource_labels_and_the_same_numbers() -> None:
    receiver = GrpcReceiver()
    try:
        monitor = train(
            backend=["prometheus", "otlp"],
            otlp={"endpoint": receiver.endpoint, "interval": 0.5, "timeout": 5, "headers": {"x-tenant": "ml-team"}},
        )
        receiver.wait_for(1, 20)  # periodic exports while it trained
        page = scrape(monitor.url)
        monitor.close()  # the last export happens on close
        last = receiver.last()
        resource = last.resource()
        assert resource["service.name"] == "otlp-test"
        assert resource["service.instance.id"].endswith("/rank-0")
        assert (resource["mindspore.rank"], resource["mindspore.world_size"]) == (0, 1)
        assert last.headers.get("x-tenant") == "ml-team"
        assert_same_numbers_as_the_scrape(last.points(), page)
        errors = {p.attributes["component"]: p.value for p in by_name(last.points())["mindspore_exporter_errors"]}
        assert errors["otlp"] == 0
    finally:
        receiver.stop()


def test_http_protobuf_export_and_otel_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    receiver = HttpReceiver()
    # Only the standard variables say where and how: monitor_config leaves endpoint and protocol unset.
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", receiver.endpoint)
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_PROTOCOL", "http/protobuf")
    monkeypatch.setenv("OTEL_METRIC_EXPORT_INTERVAL", "500")
    monkeypatch.setenv("OTEL_RESOURCE_ATTRIBUTES", "deployment.environment=ci")
    try:
        monitor = train(backend=["otlp"])
        assert monitor.url is None
        monitor.close()
        receiver.wait_for(1, 5)
        assert set(receiver.paths) == {"/v1/metrics"}
        last = receiver.last()
        assert last.headers["content-type"] == "application/x-protobuf"
        resource = last.resource()
        assert resource["service.name"] == "otlp-test" and resource["deployment.environment"] == "ci"
        named = by_name(last.points())
        assert named[otlp_name("mindspore_train_steps_total", "counter")][0].value == STEPS
    finally:
        receiver.stop()


@pytest.mark.parametrize("collector", ["dead", "slow"])
def test_a_dead_or_slow_collector_costs_counted_errors_not_the_run(
    collector: str, caplog: pytest.LogCaptureFixture
) -> None:
    receiver = GrpcReceiver(delay=3.0) if collector == "slow" else None
    endpoint = receiver.endpoint if receiver else f"http://127.0.0.1:{free_port()}"
    timeout = 1.0
    caplog.set_level(logging.WARNING)
    try:
        monitor = train(
            steps=40, backend=["prometheus", "otlp"], otlp={"endpoint": endpoint, "interval": 0.3, "timeout": timeout}
        )
        page = scrape(monitor.url)
        assert page.value("mindspore_train_steps_total") == 40  # training finished
        errors = monitor.store.get("mindspore_exporter_errors_total")
        assert errors is not None
        deadline = time.monotonic() + 15
        while errors.series(component="otlp").value == 0 and time.monotonic() < deadline:
            time.sleep(0.1)
        started = time.monotonic()
        monitor.close()
        # A hang check, not a speed target: close() is bounded by the export timeout, not by the collector.
        assert time.monotonic() - started < 3 * timeout + 5
        assert errors.series(component="otlp").value >= 1
        # Counted and logged once by the monitor; the SDK's own message for every failed export is dropped.
        assert [r.getMessage() for r in caplog.records if r.name in EXPORT_LOGGERS] == []
    finally:
        if receiver:
            receiver.stop()
