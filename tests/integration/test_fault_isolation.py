"""Failures injected into every probe and sink during real Model.train runs: training always finishes, the
failing part is counted, switched off after 3 failures in a row and logged once, and the rest keeps working."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import mindspore as ms
import pytest

from ms_exporter import TrainingMonitor
from ms_exporter.demo import build_model, synthetic_dataset
from ms_exporter.probes.memory import MemoryProbe
from ms_exporter.sinks.jsonl import JsonlWriter
from tests.support.scrape import scrape

pytestmark = pytest.mark.integration

STEPS = 12
EVERYTHING = {
    "grad_norm": {"every_n_steps": 1},
    "layernorm": {"every_n_steps": 1},
    "weight_norm": True,
    "web": {"cache_seconds": 0},
    "warmup_steps": 2,
}
PROBES = [
    "progress",
    "hang_deadline",
    "loss",
    "learning_rate",
    "step_time",
    "slowness",
    "throughput",
    "mfu",
    "loss_scale",
    "grad_norm",
    "weight_norm",
    "layernorm",
    "memory",
]


def injected(*args: Any, **kwargs: Any) -> None:
    raise RuntimeError("injected failure")


def train(monitor: TrainingMonitor, steps: int = STEPS) -> None:
    ms.set_context(mode=ms.GRAPH_MODE)
    ms.set_seed(0)
    model = build_model(layers=1, d_model=32)
    model.train(1, synthetic_dataset(size=steps * 8, batch=8), callbacks=[monitor], dataset_sink_mode=False)


def switched_off_logs(caplog: pytest.LogCaptureFixture, component: str) -> list[str]:
    return [
        r.getMessage()
        for r in caplog.records
        if r.getMessage().startswith(f"ms_exporter: {component} failed 3 times in a row")
    ]


def test_every_probe_is_listed() -> None:
    monitor = TrainingMonitor(port=0, **EVERYTHING)
    try:
        assert sorted(p.name for p in monitor.core.publisher.probes) == sorted(PROBES)
    finally:
        monitor.close()


# Every probe fails through the one guard of monitor/core.py (MonitorCore._guard): the suite fails four of them
# (progress and loss, which the alerts read most, the sampled gradient norm, the memory sampler's probe);
# `make test-long` fails each.
IN_THE_SUITE = {"progress", "loss", "grad_norm", "memory"}


@pytest.mark.parametrize(
    "probe_name", [name if name in IN_THE_SUITE else pytest.param(name, marks=pytest.mark.long) for name in PROBES]
)
def test_a_failing_probe_is_switched_off_and_the_rest_keep_working(
    probe_name: str, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="ms_exporter")
    monitor = TrainingMonitor(port=0, **EVERYTHING)
    try:
        probe = next(p for p in monitor.core.publisher.probes if p.name == probe_name)
        probe.on_step = injected  # type: ignore[method-assign]
        train(monitor)
        page = scrape(monitor.url)
        assert page.value("mindspore_train_steps_total") == STEPS or probe_name == "progress"
        assert page.value("mindspore_exporter_errors_total", component=probe_name) == 3
        assert page.value("mindspore_exporter_component_disabled", component=probe_name) == 1
        assert len(switched_off_logs(caplog, probe_name)) == 1
        assert probe not in monitor.core.publisher.probes
        # The others kept measuring to the end.
        assert page.value("mindspore_train_global_step") == STEPS or probe_name == "progress"
        for other in set(PROBES) - {probe_name}:
            assert page.value("mindspore_exporter_errors_total", component=other) == 0, other
    finally:
        monitor.close()


def test_failures_that_are_not_in_a_row_do_not_switch_off(caplog: pytest.LogCaptureFixture) -> None:
    monitor = TrainingMonitor(port=0, **EVERYTHING)
    try:
        probe = next(p for p in monitor.core.publisher.probes if p.name == "throughput")
        real = probe.on_step
        calls = {"n": 0}

        def every_other_step(sample: Any) -> None:
            calls["n"] += 1
            if calls["n"] % 2:
                raise RuntimeError("flaky")
            real(sample)

        probe.on_step = every_other_step  # type: ignore[method-assign]
        train(monitor)
        page = scrape(monitor.url)
        assert page.value("mindspore_exporter_errors_total", component="throughput") == STEPS // 2
        assert not page.has("mindspore_exporter_component_disabled", component="throughput")
        assert probe in monitor.core.publisher.probes
    finally:
        monitor.close()


def test_the_memory_sampler_is_switched_off_alone(caplog: pytest.LogCaptureFixture) -> None:
    monitor = TrainingMonitor(port=0, interval=0.05, **EVERYTHING)
    try:
        assert monitor.part_of(MemoryProbe) is not None
        monitor.part_of(MemoryProbe).sample_host = injected  # type: ignore[method-assign]
        train(monitor, steps=40)
        page = scrape(monitor.url)
        assert page.value("mindspore_exporter_errors_total", component="memory") == 3
        assert page.value("mindspore_exporter_component_disabled", component="memory") == 1
        assert page.value("mindspore_train_steps_total") == 40
    finally:
        monitor.close()


def test_a_jsonl_file_that_cannot_be_written_is_counted_and_retried_never_switched_off(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    monitor = TrainingMonitor(
        port=0, backend=["prometheus", "local"], save_dir=str(tmp_path), interval=0.05, **EVERYTHING
    )
    try:
        writer = monitor.part_of(JsonlWriter)
        assert writer is not None
        writer._write = injected  # type: ignore[method-assign]  # a full disk
        train(monitor, steps=40)  # train end tries once more, and fails: counted too
        page = scrape(monitor.url)
        assert page.value("mindspore_exporter_errors_total", component="local") >= 1
        assert not page.has("mindspore_exporter_component_disabled", component="local")  # a disk may get room again
        assert page.value("mindspore_exporter_dropped_samples_total", sink="local") >= 40  # every step, counted
        assert page.value("mindspore_train_steps_total") == 40
    finally:
        monitor.close()


def test_a_family_that_cannot_render_costs_its_series_not_the_scrape() -> None:
    monitor = TrainingMonitor(port=0, **EVERYTHING)
    try:
        family = monitor.store.get("mindspore_train_loss_smoothed")
        assert family is not None
        family.children = injected  # type: ignore[method-assign]
        train(monitor)
        page = scrape(monitor.url)
        assert not page.has("mindspore_train_loss_smoothed") and page.value("mindspore_train_steps_total") == STEPS
        assert page.value("mindspore_exporter_errors_total", component="prometheus") >= 1
    finally:
        monitor.close()
