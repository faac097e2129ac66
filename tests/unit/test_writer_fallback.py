"""A TensorBoard or W&B writer that fails until it is switched off, or cannot start at all, hands the run to JSON
Lines (the strategy-container article's rule), once, and says so; where JSON Lines runs already, it only says so."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest

from ms_exporter import TrainingMonitor
from ms_exporter.core import catalogue
from ms_exporter.sinks.tensorboard import TensorBoardWriter
from tests.support.cb_params import context
from tests.support.pythons import WANDB, needs
from tests.support.waiting import wait_until


def _broken_tensorboard(monitor: TrainingMonitor) -> TensorBoardWriter:
    writer = monitor.part_of(TensorBoardWriter)
    assert writer is not None

    def full_disk(*args: object) -> None:
        raise OSError(28, "No space left on device")

    writer._write_step = full_disk  # type: ignore[method-assign]
    return writer


def _steps(monitor: TrainingMonitor, first: int, last: int) -> None:
    for step in range(first, last + 1):
        monitor.on_train_step_end(context(step, 1.0))
        monitor.publish()
        writer = monitor.part_of(TensorBoardWriter)
        assert writer is not None
        writer.flush()  # each write fails: three in a row switch it off


def test_a_failing_tensorboard_writer_falls_back_to_json_lines(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="ms_exporter")
    monitor = TrainingMonitor(port=0, backend=["prometheus", "tensorboard"], save_dir=str(tmp_path), interval=3600)
    try:
        _broken_tensorboard(monitor)
        monitor.on_train_begin(context(0, 0.0))
        _steps(monitor, 1, 3)
        # The writer's thread asks for the fallback as it switches itself off, after the failed pass is done.
        wait_until(lambda: monitor.jsonl_path == str(tmp_path / "metrics-rank0.jsonl"), 30, "the fallback joined")
        for step in range(4, 7):
            monitor.on_train_step_end(context(step, 1.0))
        monitor.publish()
    finally:
        monitor.close()
    records = [json.loads(line) for line in (tmp_path / "metrics-rank0.jsonl").read_text().splitlines()]
    assert records[0] == {**records[0], "type": "event", "event": "fallback", "sink": "tensorboard"}
    assert [record["step"] for record in records if record["type"] == "step"] == [4, 5, 6]
    told = [
        record.getMessage()
        for record in caplog.records
        if "falls back" in record.getMessage() or "switched off;" in record.getMessage()
    ]
    assert len(told) == 1 and "from now on the step records in JSON Lines" in told[0]


def test_where_json_lines_runs_already_the_fallback_only_says_so(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="ms_exporter")
    monitor = TrainingMonitor(port=0, backend=["local", "tensorboard"], save_dir=str(tmp_path), interval=3600)
    try:
        _broken_tensorboard(monitor)
        monitor.on_train_begin(context(0, 0.0))
        _steps(monitor, 1, 3)
        wait_until(lambda: any("already keeps" in r.getMessage() for r in caplog.records), 30, "the fallback said so")
        writers = [part for part in monitor.parts if part.name == "local"]
    finally:
        monitor.close()
    assert len(writers) == 1  # no second JSON Lines writer
    assert any("the monitor already keeps the step records" in record.getMessage() for record in caplog.records)


def _records(path: Path) -> list[dict[str, object]]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_a_tensorboard_writer_that_cannot_start_falls_back_to_json_lines_from_the_first_step(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="ms_exporter")
    (tmp_path / "tensorboard").write_text("a file where the event files' directory goes")
    monitor = TrainingMonitor(port=0, backend=["prometheus", "tensorboard"], save_dir=str(tmp_path), interval=3600)
    try:
        assert monitor.part_of(TensorBoardWriter) is None
        monitor.on_train_begin(context(0, 0.0))
        for step in (1, 2, 3):
            monitor.on_train_step_end(context(step, 1.0))
        monitor.on_train_end(context(3, 1.0))
    finally:
        monitor.close()
    records = _records(tmp_path / "metrics-rank0.jsonl")
    assert [r["event"] for r in records if r["type"] == "event"] == ["fallback", "train_begin", "train_end"]
    assert [r["step"] for r in records if r["type"] == "step"] == [1, 2, 3]
    told = [r.getMessage() for r in caplog.records if "could not start;" in r.getMessage()]
    assert len(told) == 1 and "tensorboard writer could not start; from now on" in told[0]


def test_a_tracker_library_that_breaks_on_import_costs_the_backend_not_the_construction(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from ms_exporter.sinks import wandb

    def broken(*args: object, **kwargs: object) -> None:
        raise TypeError("Descriptors cannot be created directly (a protobuf that does not match)")

    monkeypatch.setattr(TensorBoardWriter, "__init__", broken)
    monkeypatch.setattr(wandb.WandbWriter, "__init__", broken)
    monitor = TrainingMonitor(port=0, backend=["tensorboard", "wandb"], save_dir=str(tmp_path), interval=3600)
    try:
        monitor.on_train_begin(context(0, 0.0))
        monitor.on_train_step_end(context(1, 1.0))
        monitor.on_train_end(context(1, 1.0))
        errors = {dict(s.labels)["component"]: s.value for s in monitor.store.series_of(catalogue.ERRORS)}
    finally:
        monitor.close()
    assert errors["tensorboard"] == 1 and errors["wandb"] == 1
    records = _records(tmp_path / "metrics-rank0.jsonl")
    assert [r.get("sink") for r in records if r.get("event") == "fallback"] == ["tensorboard"]
    assert [r["step"] for r in records if r["type"] == "step"] == [1]


@needs(WANDB)
def test_a_wandb_run_that_cannot_start_falls_back_to_json_lines(tmp_path: Path) -> None:
    (tmp_path / "wandb").write_text("a file where wandb's directory goes")
    monitor = TrainingMonitor(port=0, backend=["prometheus", "wandb"], save_dir=str(tmp_path), interval=3600)
    try:
        monitor.on_train_begin(context(0, 0.0))  # the run starts here, and cannot
        for step in (1, 2):
            monitor.on_train_step_end(context(step, 1.0))
        monitor.on_train_end(context(2, 1.0))
    finally:
        monitor.close()
    records = _records(tmp_path / "metrics-rank0.jsonl")
    assert [r.get("sink") for r in records if r.get("event") == "fallback"] == ["wandb"]
    assert "train_begin" in [r.get("event") for r in records]  # it joined within the train begin it failed in
    assert [r["step"] for r in records if r["type"] == "step"] == [1, 2]
