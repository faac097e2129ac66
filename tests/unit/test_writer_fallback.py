"""A TensorBoard writer that fails until it is switched off hands the run to JSON Lines (the first source article's
rule), once, and says so; where JSON Lines runs already, it only says so."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest

from ms_exporter import TrainingMonitor
from ms_exporter.sinks.tensorboard import TensorBoardWriter
from tests.support.cb_params import context
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
