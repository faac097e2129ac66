"""The paths docs/development.md ("Where a change goes") sends a newcomer down, each exercised end to end:
a new sink gets every lifecycle hook in order (and its failures are its own), a new metric family registered
from the catalogue reaches /metrics with its declared help and type."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import pytest

from ms_exporter import TrainingMonitor
from ms_exporter.core.catalogue import MetricFamily
from ms_exporter.core.probe import Probe
from ms_exporter.core.sample import StepSample
from ms_exporter.core.sink import Sink
from ms_exporter.monitor import callback as callback_module
from tests.support.cb_params import context
from tests.support.scrape import scrape


class RecordingSink(Sink):
    name = "recording"
    needs_signals = True

    def __init__(self, fail_on_step: bool = False) -> None:
        self.calls: list[tuple[Any, ...]] = []
        self._fail_on_step = fail_on_step

    def start(self, step: int) -> None:
        self.calls.append(("start", step))

    def on_step(self, sample: StepSample) -> None:
        self.calls.append(("on_step", sample.step, sample.loss))
        if self._fail_on_step:
            raise OSError("disk full")

    def on_eval(self, step: int, metrics: Mapping[str, Any]) -> None:
        self.calls.append(("on_eval", step, dict(metrics)))

    def run_ended(self, step: int) -> None:
        self.calls.append(("run_ended", step))

    def interrupted(self, signal_name: str, step: int) -> None:
        self.calls.append(("interrupted", signal_name, step))

    def close(self) -> None:
        self.calls.append(("close",))


def _monitor_with(monkeypatch: pytest.MonkeyPatch, *extra: Sink) -> TrainingMonitor:
    real = callback_module.build_sinks
    monkeypatch.setattr(callback_module, "build_sinks", lambda *args: [*real(*args), *extra])
    return TrainingMonitor(port=0, web={"cache_seconds": 0})


def test_a_new_sink_gets_every_hook_in_order(monkeypatch: pytest.MonkeyPatch) -> None:
    sink = RecordingSink()
    monitor = _monitor_with(monkeypatch, sink)
    try:
        monitor.on_train_begin(context(0, 0.0))
        for step in (1, 2, 3):
            monitor.on_train_step_begin(context(step, 0.0))
            monitor.on_train_step_end(context(step, float(step)))
        eval_context = context(3, 0.0)
        eval_context.original_args().eval_results = {"accuracy": 0.5}
        monitor.on_eval_end(eval_context)
        monitor._on_signal("SIGTERM", False)
        monitor.on_train_end(context(3, 0.0))
    finally:
        monitor.close()
    assert sink.calls == [
        ("start", 0),
        ("on_step", 1, 1.0),
        ("on_step", 2, 2.0),
        ("on_step", 3, 3.0),
        ("on_eval", 3, {"accuracy": 0.5}),
        ("interrupted", "SIGTERM", 3),
        ("run_ended", 3),
        ("close",),
    ]


def test_a_failing_sink_costs_only_itself(monkeypatch: pytest.MonkeyPatch) -> None:
    failing, healthy = RecordingSink(fail_on_step=True), RecordingSink()
    failing.name = "failing"
    monitor = _monitor_with(monkeypatch, failing, healthy)
    try:
        monitor.on_train_begin(context(0, 0.0))
        for step in (1, 2):
            monitor.on_train_step_end(context(step, 1.0))
        monitor.publish()
        page = scrape(monitor.url)
    finally:
        monitor.close()
    assert [call[0] for call in healthy.calls].count("on_step") == 2
    assert page.value("mindspore_exporter_errors_total", component="failing") == 2
    assert page.value("mindspore_exporter_errors_total", component="recording") == 0
    assert page.value("mindspore_train_global_step") == 2


NEW_FAMILY = MetricFamily(
    "mindspore_train_example_ratio", "gauge", "An example family for this test.", "ratio", ("part",)
)


class ExampleProbe(Probe):
    name = "example"

    def __init__(self, monitor: TrainingMonitor) -> None:
        self._series = monitor.store.register(NEW_FAMILY).series(part="a")

    def on_step(self, sample: StepSample) -> None:
        self._series.value = sample.step / 10


def test_a_new_family_from_the_catalogue_reaches_metrics_with_its_help_and_type() -> None:
    monitor = TrainingMonitor(port=0, web={"cache_seconds": 0})
    try:
        monitor._publisher.probes.append(ExampleProbe(monitor))
        monitor.on_train_begin(context(0, 0.0))
        monitor.on_train_step_end(context(4, 1.0))
        monitor.publish()
        page = scrape(monitor.url)
    finally:
        monitor.close()
    assert page.value(NEW_FAMILY.name, part="a") == pytest.approx(0.4)
    assert f"# HELP {NEW_FAMILY.name} {NEW_FAMILY.help}\n# TYPE {NEW_FAMILY.name} gauge\n" in page.text
