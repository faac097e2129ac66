"""A full disk under save_dir, for good or for a while, on a real tmpfs: close() never raises into the training
script, the JSON Lines file holds whole lines only, and what could not be written is counted."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from ms_exporter import TrainingMonitor
from ms_exporter.sinks.jsonl import JsonlWriter
from ms_exporter.tools.report import load_run, summary
from tests.support.cb_params import context
from tests.support.disks import fill, small_disk
from tests.support.jsonl import records, steps_of

pytestmark = pytest.mark.integration
DROPPED = 'mindspore_exporter_dropped_samples_total{sink="local"}'


def flush(monitor: TrainingMonitor) -> None:
    """What the writer thread does every `interval` seconds, now."""
    monitor.publish()
    writer = monitor.part_of(JsonlWriter)
    assert writer is not None
    writer.flush()


def test_close_on_a_full_disk_does_not_raise_into_the_training_script(tmp_path: Path) -> None:
    with small_disk(tmp_path / "disk") as disk:
        monitor = TrainingMonitor(port=0, backend="local", save_dir=str(disk), interval=3600)
        monitor.on_train_begin(context(0, 0.0))
        fill(disk, leave=0)
        for step in range(1, 201):
            monitor.on_train_step_begin(context(step, 1.0))
            monitor.on_train_step_end(context(step, 1.0))
        flush(monitor)  # fails: counted, not raised
        writer = monitor.part_of(JsonlWriter)
        assert writer is not None
        writer.close()  # the sink's own close, with the batch it could not write: returns
        monitor.on_train_end(context(200, 1.0))
        monitor.close()  # the disk is still full: this returns
        monitor.close()
        if monitor.jsonl_path and Path(monitor.jsonl_path).exists():
            records(Path(monitor.jsonl_path))  # whole lines only


def test_a_transient_full_disk_loses_whole_records_and_counts_them(tmp_path: Path) -> None:
    with small_disk(tmp_path / "disk") as disk:
        monitor = TrainingMonitor(port=0, backend="local", save_dir=str(disk), interval=3600)
        try:
            monitor.on_train_begin(context(0, 0.0))
            for step in range(1, 11):  # written
                monitor.on_train_step_begin(context(step, 1.0))
                monitor.on_train_step_end(context(step, 1.0))
            flush(monitor)
            path = Path(str(monitor.jsonl_path))
            # Room for about half a batch: the first write of the next batch succeeds in part.
            filler = fill(disk, leave=2048)
            for step in range(11, 61):  # lost to the full disk
                monitor.on_train_step_begin(context(step, 1.0))
                monitor.on_train_step_end(context(step, 1.0))
            flush(monitor)
            records(path)  # no torn line left behind
            filler.unlink()  # space again
            for step in range(61, 71):  # written
                monitor.on_train_step_begin(context(step, 1.0))
                monitor.on_train_step_end(context(step, 1.0))
            monitor.on_train_end(context(70, 1.0))
        finally:
            monitor.close()
        written = steps_of(path)
        assert written == [*range(1, 11), *range(61, 71)]
        snapshot = [r for r in records(path) if r["type"] == "snapshot"][-1]["metrics"]
        assert snapshot[DROPPED] == 50  # the 50 lost step records, counted
        facts = summary(load_run([path]))
        assert facts["records"] == 20 and facts["dropped_records"] == 50
        report = subprocess.run(
            [sys.executable, "-m", "ms_exporter", "report", str(path), "-o", str(tmp_path / "report.html")],
            capture_output=True,
            text=True,
            check=False,
        )
        assert report.returncode == 0, report.stderr
        assert "50 records lost (not written" in report.stdout


# The TensorBoard backend on a disk that fills mid-run. Run in a child process: with
# tensorboardX's own writer thread (dead on ENOSPC, its queue full) train end and SIGTERM waited for ever there.
_TENSORBOARD_CHILD = r"""
import json, os, signal, sys, time
from pathlib import Path
from ms_exporter import TrainingMonitor
from ms_exporter.core import catalogue as c
from tests.support.cb_params import context
from tests.support.disks import fill

disk = Path(sys.argv[1])
caught = []
signal.signal(signal.SIGTERM, lambda signum, frame: caught.append(signum))  # the script's own: it carries on
monitor = TrainingMonitor(port=0, backend="tensorboard", save_dir=str(disk), interval=3600)
monitor.on_train_begin(context(0, 0.0))
fill(disk, leave=0)
for step in range(1, 201):
    monitor.on_train_step_begin(context(step, 1.0))
    monitor.on_train_step_end(context(step, 1.0))
took = {}
began = time.monotonic()
os.kill(os.getpid(), signal.SIGTERM)
while not caught:
    time.sleep(0.01)
took["sigterm"] = time.monotonic() - began
began = time.monotonic()
monitor.on_train_end(context(200, 1.0))
took["train_end"] = time.monotonic() - began
began = time.monotonic()
monitor.close()
took["close"] = time.monotonic() - began
def by(family, label):
    return {dict(s.labels)[label]: s.value for s in monitor.store.series_of(family)}
print("RESULT " + json.dumps({"took": took, "dropped": by(c.DROPPED_RECORDS, "sink"),
                              "errors": by(c.ERRORS, "component")}))
"""


def test_tensorboard_on_a_disk_that_fills_returns_at_train_end_and_sigterm(tmp_path: Path) -> None:
    from ms_exporter.sinks.shared.queued_writer import WAIT_SECONDS

    with small_disk(tmp_path / "disk") as disk:
        try:
            done = subprocess.run(
                [sys.executable, "-c", _TENSORBOARD_CHILD, str(disk)],
                capture_output=True,
                text=True,
                timeout=120,
                cwd=Path(__file__).parents[2],
                check=False,
            )
        except subprocess.TimeoutExpired as exc:
            pytest.fail(f"train end, SIGTERM or close waited on the TensorBoard writer for good: {exc.stderr!r}")
        assert done.returncode == 0, done.stderr[-3000:]
        [line] = [line for line in done.stdout.splitlines() if line.startswith("RESULT ")]
        result = json.loads(line.removeprefix("RESULT "))
        for hook, seconds in result["took"].items():
            assert seconds < WAIT_SECONDS + 2, (hook, seconds)
        assert result["dropped"]["tensorboard"] == 200  # every step record lost to the full disk, counted
        assert result["errors"]["tensorboard"] >= 1
        events = list((disk / "tensorboard" / "default" / "rank0").glob("events.out.tfevents.*"))
        assert len(events) == 1 and events[0].stat().st_size < 4096  # the header record only: no torn record
