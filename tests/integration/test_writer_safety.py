"""The writing sinks on a read-only or full save_dir and with links planted at the
names they write; on real tmpfs mounts (root, as in CI) with real tensorboardX and wandb."""

from __future__ import annotations

import contextlib
import json
import os
import stat
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from ms_exporter import TrainingMonitor
from ms_exporter.core import catalogue as c
from ms_exporter.features import watchdog
from ms_exporter.sinks.jsonl import JsonlWriter
from ms_exporter.sinks.tensorboard import TensorBoardWriter
from ms_exporter.sinks.wandb import WandbWriter
from tests.support.cb_params import context
from tests.support.disks import fill, small_disk
from tests.support.jsonl import steps_of

pytestmark = pytest.mark.integration


@contextlib.contextmanager
def read_only_disk(where: Path) -> Iterator[Path]:
    """A tmpfs remounted read-only: root's writes fail there too (EROFS), as on a read-only volume."""
    with small_disk(where) as disk:
        remounted = subprocess.run(
            ["mount", "-o", "remount,ro", str(disk)], capture_output=True, text=True, check=False
        )
        if remounted.returncode != 0:
            pytest.skip(f"cannot remount read-only here: {remounted.stderr.strip()}")
        yield disk


def counted(monitor: TrainingMonitor, family: c.MetricFamily, label: str) -> dict[str, float]:
    return {dict(series.labels)[label]: series.value for series in monitor.store.series_of(family)}


def train_a_little(monitor: TrainingMonitor, steps: range = range(1, 6)) -> None:
    monitor.on_train_begin(context(steps.start - 1, 0.0))
    for step in steps:
        monitor.on_train_step_begin(context(step, 1.0))
        monitor.on_train_step_end(context(step, 1.0))
    monitor.on_train_end(context(steps.stop - 1, 1.0))


# -- a read-only or full save_dir, or a file where a directory goes: counted, training goes on -------------------------
def test_tensorboard_on_a_read_only_save_dir_is_counted_and_training_goes_on(tmp_path: Path) -> None:
    with read_only_disk(tmp_path / "disk") as disk:
        monitor = TrainingMonitor(port=0, backend="tensorboard", save_dir=str(disk), interval=3600)  # no OSError
        try:
            assert monitor.part_of(TensorBoardWriter) is None  # off
            train_a_little(monitor)
        finally:
            monitor.close()
        assert counted(monitor, c.ERRORS, "component")["tensorboard"] == 1


def test_tensorboard_with_a_file_in_place_of_its_directory(tmp_path: Path) -> None:
    (tmp_path / "tensorboard").write_text("not a directory")
    monitor = TrainingMonitor(port=0, backend="tensorboard", save_dir=str(tmp_path), interval=3600)
    try:
        train_a_little(monitor)
    finally:
        monitor.close()
    assert counted(monitor, c.ERRORS, "component")["tensorboard"] == 1
    assert (tmp_path / "tensorboard").read_text() == "not a directory"


def test_wandb_on_a_read_only_save_dir_never_writes_elsewhere(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    elsewhere = tmp_path / "system-temp"  # where wandb falls back to: tempfile.gettempdir()
    elsewhere.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(elsewhere))
    with read_only_disk(tmp_path / "disk") as disk:
        monitor = TrainingMonitor(port=0, backend="wandb", save_dir=str(disk), interval=3600)
        try:
            train_a_little(monitor)
        finally:
            monitor.close()
        assert counted(monitor, c.ERRORS, "component")["wandb"] == 1
    assert not (elsewhere / "wandb").exists()  # no run in the system temporary directory


def test_wandb_records_lost_to_a_full_disk_are_counted(tmp_path: Path) -> None:
    with small_disk(tmp_path / "disk", size=8 << 20) as disk:
        monitor = TrainingMonitor(port=0, backend="wandb", save_dir=str(disk), interval=3600)
        try:
            monitor.on_train_begin(context(0, 0.0))
            writer = monitor.part_of(WandbWriter)
            assert writer is not None and writer.run_dir is not None
            for step in range(1, 11):  # handed to wandb
                monitor.on_train_step_begin(context(step, 1.0))
                monitor.on_train_step_end(context(step, 1.0))
            monitor.publish()
            writer.flush()
            fill(disk, leave=0)
            for step in range(11, 61):  # lost to the full disk
                monitor.on_train_step_begin(context(step, 1.0))
                monitor.on_train_step_end(context(step, 1.0))
            monitor.publish()
            writer.flush()
            monitor.on_train_end(context(60, 1.0))
        finally:
            monitor.close()
        assert counted(monitor, c.DROPPED_RECORDS, "sink")["wandb"] == 50
        assert counted(monitor, c.ERRORS, "component")["wandb"] >= 1


# -- no write follows a planted link -----------------------------------------------------------------------------------
def victim(tmp_path: Path) -> Path:
    """A file of the training user that a planted link points at: it must stay as it is."""
    target = tmp_path / "victim.txt"
    target.write_text("precious\n")
    return target


def test_a_link_at_the_json_lines_name_is_not_followed(tmp_path: Path) -> None:
    precious = victim(tmp_path)
    save_dir = tmp_path / "run"
    save_dir.mkdir()
    (save_dir / "metrics-rank0.jsonl").symlink_to(precious)
    monitor = TrainingMonitor(port=0, backend="local", save_dir=str(save_dir), interval=3600)
    try:
        train_a_little(monitor)
    finally:
        monitor.close()
    assert precious.read_text() == "precious\n"
    assert counted(monitor, c.ERRORS, "component")["local"] >= 1


def test_rotation_past_a_planted_directory_keeps_writing(tmp_path: Path) -> None:
    (tmp_path / "metrics-rank0.jsonl.1").mkdir()  # no rename may land there
    monitor = TrainingMonitor(
        port=0, backend="local", save_dir=str(tmp_path), interval=3600, max_file_mb=0.001, max_files=2
    )
    try:
        monitor.on_train_begin(context(0, 0.0))
        writer = monitor.part_of(JsonlWriter)
        assert writer is not None
        for step in range(1, 31):
            monitor.on_train_step_begin(context(step, 1.0))
            monitor.on_train_step_end(context(step, 1.0))
            if step % 10 == 0:
                monitor.publish()
                writer.flush()
        monitor.on_train_end(context(30, 1.0))
    finally:
        monitor.close()
    assert steps_of(tmp_path / "metrics-rank0.jsonl") == list(range(1, 31))  # every batch written, none lost
    assert counted(monitor, c.DROPPED_RECORDS, "sink")["local"] == 0
    assert counted(monitor, c.ERRORS, "component")["local"] >= 1  # the refused renames, counted
    assert (tmp_path / "metrics-rank0.jsonl.1").is_dir()


def test_file_sd_writes_through_no_planted_link(tmp_path: Path) -> None:
    precious = victim(tmp_path)
    shared = tmp_path / "targets"
    shared.mkdir()
    os.chmod(shared, 0o777)  # as older versions made it: any local user could plant links here
    name = "ms-exporter-default-rank0.json"
    (shared / f".{name}.{os.getpid()}.tmp").symlink_to(precious)  # the old, predictable temporary
    (shared / name).symlink_to(precious)
    monitor = TrainingMonitor(port=0, backend="prometheus", file_sd_dir=str(shared), save_dir=str(tmp_path / "run"))
    try:
        assert (shared / name).is_file() and not (shared / name).is_symlink()
        assert json.loads((shared / name).read_text())[0]["targets"]  # the target, readable
        train_a_little(monitor)
    finally:
        monitor.close()
    assert precious.read_text() == "precious\n"


def test_hang_dumps_write_through_no_planted_link(tmp_path: Path) -> None:
    precious = victim(tmp_path)
    path = tmp_path / "run" / "hang-rank0-20260101T000000Z.txt"
    path.parent.mkdir()
    path.with_name(f".{path.name}.{os.getpid()}.tmp").symlink_to(precious)
    path.symlink_to(precious)
    watchdog._write_atomically(path, "stacks\n")
    assert precious.read_text() == "precious\n"
    assert path.read_text() == "stacks\n" and not path.is_symlink()


def test_directories_the_monitor_creates_are_not_world_writable(tmp_path: Path) -> None:
    save_dir = tmp_path / "run" / "deeper"
    shared = tmp_path / "ms-exporter-targets"  # the documented default, /tmp/ms-exporter-targets, created fresh
    monitor = TrainingMonitor(
        port=0,
        backend=["prometheus", "local", "tensorboard"],
        save_dir=str(save_dir),
        file_sd_dir=str(shared),
        interval=3600,
    )
    try:
        train_a_little(monitor)
        # Prometheus reads the target as a user of its own (a mkstemp temporary alone would be 0600).
        assert [stat.S_IMODE(p.stat().st_mode) for p in shared.iterdir()] == [0o644]
    finally:
        monitor.close()
    watchdog._write_atomically(tmp_path / "dumps" / "hang-rank0-20260101T000000Z.txt", "stacks\n")
    modes = {
        path: stat.S_IMODE(path.stat().st_mode)
        for path in (
            tmp_path / "run",
            save_dir,
            save_dir / "tensorboard",
            save_dir / "tensorboard" / "default",
            save_dir / "tensorboard" / "default" / "rank0",
            tmp_path / "dumps",
            shared,
        )
    }
    assert modes.pop(shared) == 0o1777  # sticky: anyone adds a target, none removes or replaces another's
    assert set(modes.values()) == {0o750}, modes
    for path in (save_dir / "metrics-rank0.jsonl", *(save_dir / "tensorboard" / "default" / "rank0").iterdir()):
        assert stat.S_IMODE(path.stat().st_mode) & 0o022 == 0, path


def test_a_shared_directory_without_the_sticky_bit_is_named(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    shared = tmp_path / "ms-exporter-targets"
    shared.mkdir()
    os.chmod(shared, 0o777)  # as older versions made /tmp/ms-exporter-targets
    monitor = TrainingMonitor(port=0, file_sd_dir=str(shared))
    try:
        assert any(
            f"{shared} is writable by every user without the sticky bit" in r.getMessage() for r in caplog.records
        )
    finally:
        monitor.close()
