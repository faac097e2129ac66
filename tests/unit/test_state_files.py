"""The goodput ledger's state files against what an earlier process, a full disk or another job may leave in
save_dir: odd state files, planted links, a full disk, two processes on one save_dir and rank, and the saver
thread of a construction that fails."""

from __future__ import annotations

import contextlib
import errno
import fcntl
import gc
import json
import logging
import math
import os
import select
import struct
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from ms_exporter import TrainingMonitor
from ms_exporter.config import ConfigError, load_config
from ms_exporter.core import catalogue as c
from ms_exporter.core.files import run_lock
from ms_exporter.core.phases import PhaseClock
from ms_exporter.core.store import MetricStore
from ms_exporter.features.goodput import Goodput
from ms_exporter.tools.report import load_run, summary
from tests.support.cb_params import context

ROOT = Path(__file__).resolve().parents[2]
RUN_ID = "odd"
STATE = f"ms_exporter-run-{RUN_ID}-rank0.json"
MARK = f"ms_exporter-run-{RUN_ID}-rank0.step"
OTHER_PID = 4242  # the earlier process (not this one: a restart)
# 8 bytes that read as a step of about 8.97e18: what a .step of random bytes holds 99.95% of the time.
RANDOM_STEP = bytes.fromhex("9e5b7d0e84f3a17c")


def a_state(**changes: Any) -> dict[str, Any]:
    """A well-formed state of run `odd`, rank 0: 2 restarts, step 10 reached, 1 s per bucket so far."""
    state: dict[str, Any] = {
        "format": 1,
        "run_id": RUN_ID,
        "rank": 0,
        "restarts": 2,
        "highest_step": 10,
        "saved": 1.7e9,
        "finished": False,
        "earlier_seconds": dict.fromkeys(c.TIME_BUCKETS, 1.0),
        "process": {"pid": OTHER_PID, "seconds": dict.fromkeys(c.TIME_BUCKETS, 1.0)},
    }
    state.update(changes)
    return state


def encoded(state: dict[str, Any]) -> bytes:
    return json.dumps(state).encode()  # NaN as NaN, as json.dumps writes it by default


@pytest.fixture
def monitor_in(caplog: pytest.LogCaptureFixture) -> Iterator[Callable[[Path], TrainingMonitor]]:
    made: list[TrainingMonitor] = []

    def make(save_dir: Path, **more: Any) -> TrainingMonitor:
        caplog.set_level(logging.WARNING, "ms_exporter")
        monitor = TrainingMonitor(backend="local", save_dir=str(save_dir), run_id=RUN_ID, interval=3600, **more)
        made.append(monitor)
        return monitor

    yield make
    for monitor in made:
        monitor.close()


def exported(monitor: TrainingMonitor) -> dict[str, Any]:
    store = monitor.store
    return {
        "restarts": store.value_of(c.RESTARTS),
        "run_time": {dict(s.labels)["bucket"]: s.value for s in store.series_of(c.RUN_TIME_SECONDS)},
        "errors": {dict(s.labels)["component"]: s.value for s in store.series_of(c.ERRORS)},
        "redo_until": monitor.part_of(Goodput)._redo_until if monitor.part_of(Goodput) is not None else None,
    }


def assert_sane(values: dict[str, Any]) -> None:
    assert set(values["run_time"]) == set(c.TIME_BUCKETS)
    assert all(math.isfinite(v) and 0 <= v < 1e6 for v in values["run_time"].values()), values
    assert values["restarts"] in (0, 3) and values["redo_until"] in (0, 10), values


def moved_aside(directory: Path, name: str) -> list[Path]:
    return sorted(directory.glob(f"{name}.unusable-*"))


# -- odd run state files -----------------------------------------------------------------------------------------------
ODD_STATES = {
    "not_utf8": b"\xff\xfe" + encoded(a_state()),
    "highest_step_text": encoded(a_state(highest_step="abc")),
    "highest_step_1e30": encoded(a_state(highest_step=1e30)),
    "highest_step_huge_int": encoded(a_state(highest_step=10**30)),
    "process_list": encoded(a_state(process=[])),
    "negative_restarts": encoded(a_state(restarts=-7)),
    "nan_seconds": encoded(a_state(earlier_seconds={**dict.fromkeys(c.TIME_BUCKETS, 1.0), "productive": math.nan})),
    "infinite_process_seconds": encoded(a_state(process={"pid": OTHER_PID, "seconds": {"redo": math.inf}})),
    "restarts_bool": encoded(a_state(restarts=True)),
    "not_an_object": b"[1, 2, 3]",
    "nested_too_deep": b"[" * 200_000,
    "larger_than_a_state_file": encoded(a_state()) + b" " * 100_000,
}


@pytest.mark.parametrize("content", ODD_STATES.values(), ids=ODD_STATES.keys())
def test_an_odd_run_state_is_moved_aside_and_the_run_starts_anew(
    tmp_path: Path, content: bytes, monitor_in: Callable[..., TrainingMonitor], caplog: pytest.LogCaptureFixture
) -> None:
    (tmp_path / STATE).write_bytes(content)
    monitor = monitor_in(tmp_path)  # constructs: no UnicodeDecodeError, ValueError, struct.error, OverflowError ...
    values = exported(monitor)
    assert values["restarts"] == 0 and values["redo_until"] == 0  # nothing carried over from what was unusable
    assert_sane(values)
    (aside,) = moved_aside(tmp_path, STATE)
    assert aside.read_bytes() == content  # kept for a look, as it was
    assert f"the run state file {tmp_path / STATE} is unusable (" in caplog.text and f"moved to {aside}" in caplog.text
    assert monitor.part_of(Goodput) is not None
    monitor.part_of(Goodput).start()  # as training does
    monitor.close()
    saved = json.loads((tmp_path / STATE).read_text())  # a good one in its place, of this process
    assert saved["restarts"] == 0 and saved["process"]["pid"] == os.getpid()


def test_a_fifo_as_run_state_does_not_hang_construction(
    tmp_path: Path, monitor_in: Callable[..., TrainingMonitor], caplog: pytest.LogCaptureFixture
) -> None:
    fifo = tmp_path / STATE
    os.mkfifo(fifo)
    made: list[TrainingMonitor] = []
    builder = threading.Thread(target=lambda: made.append(monitor_in(tmp_path)), daemon=True)
    builder.start()
    builder.join(60)
    if builder.is_alive():  # the code before: open() waits for a writer; give it one so the thread can end
        with contextlib.suppress(OSError):
            os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))
        builder.join(10)
        pytest.fail("TrainingMonitor() hung on a FIFO at the run state's name")
    assert made, "construction raised"
    assert exported(made[0])["restarts"] == 0
    (aside,) = moved_aside(tmp_path, STATE)
    assert aside.is_fifo() and "is not a regular file" in caplog.text


def test_a_symlink_to_dev_zero_as_run_state_is_not_read(
    tmp_path: Path, monitor_in: Callable[..., TrainingMonitor], caplog: pytest.LogCaptureFixture
) -> None:
    (tmp_path / STATE).symlink_to("/dev/zero")
    monitor = monitor_in(tmp_path)  # the code before read /dev/zero until memory ran out
    assert exported(monitor)["restarts"] == 0
    (aside,) = moved_aside(tmp_path, STATE)
    assert os.readlink(aside) == "/dev/zero" and "a symbolic link" in caplog.text


ODD_MARKS = {
    "random_bytes": RANDOM_STEP,
    "negative": struct.pack("<q", -5),
    "wrong_size_long": RANDOM_STEP + b"\0" * 4088,
    "wrong_size_short": b"\x01\x02\x03",
}


@pytest.mark.parametrize("content", ODD_MARKS.values(), ids=ODD_MARKS.keys())
def test_an_odd_step_mark_is_moved_aside_and_the_saved_highest_step_counts(
    tmp_path: Path, content: bytes, monitor_in: Callable[..., TrainingMonitor], caplog: pytest.LogCaptureFixture
) -> None:
    (tmp_path / STATE).write_bytes(encoded(a_state()))
    (tmp_path / MARK).write_bytes(content)
    monitor = monitor_in(tmp_path)
    values = exported(monitor)
    # The run goes on from its state file (restart 3, steps up to 10 redone), not from the mark's garbage (the
    # code before: every step of the run booked as redo).
    assert values["restarts"] == 3 and values["redo_until"] == 10
    assert_sane(values)
    (aside,) = moved_aside(tmp_path, MARK)
    assert aside.read_bytes() == content and f"the run state file {tmp_path / MARK} is unusable (" in caplog.text
    assert struct.unpack("<q", (tmp_path / MARK).read_bytes()) == (10,)  # a fresh mark, 8 bytes


def test_a_good_step_mark_past_the_last_save_is_the_redo_limit(
    tmp_path: Path, monitor_in: Callable[..., TrainingMonitor], caplog: pytest.LogCaptureFixture
) -> None:
    (tmp_path / STATE).write_bytes(encoded(a_state()))
    (tmp_path / MARK).write_bytes(struct.pack("<q", 250))
    values = exported(monitor_in(tmp_path))
    assert values["restarts"] == 3 and values["redo_until"] == 250 and "unusable" not in caplog.text
    assert moved_aside(tmp_path, MARK) == [] and moved_aside(tmp_path, STATE) == []


# -- no write follows a link -------------------------------------------------------------------------------------------
def test_a_symlink_at_the_step_mark_is_not_written_through(
    tmp_path: Path, monitor_in: Callable[..., TrainingMonitor]
) -> None:
    precious = tmp_path / "elsewhere" / "precious.bin"
    precious.parent.mkdir()
    precious.write_bytes(RANDOM_STEP + b"the training user's data")
    save_dir = tmp_path / "save"
    save_dir.mkdir()
    (save_dir / STATE).write_bytes(encoded(a_state()))
    (save_dir / MARK).symlink_to(precious)
    monitor = monitor_in(save_dir)
    values = exported(monitor)
    assert precious.read_bytes() == RANDOM_STEP + b"the training user's data"  # the code before: cut to 8 bytes
    assert values["redo_until"] == 10  # ... and read back as the step
    assert not (save_dir / MARK).is_symlink() and struct.unpack("<q", (save_dir / MARK).read_bytes()) == (10,)
    (aside,) = moved_aside(save_dir, MARK)
    assert aside.is_symlink()


def test_the_run_state_is_saved_through_a_fresh_temporary(
    tmp_path: Path, monitor_in: Callable[..., TrainingMonitor]
) -> None:
    precious = tmp_path / "precious.txt"
    precious.write_text("the training user's data")
    save_dir = tmp_path / "save"
    monitor = monitor_in(save_dir)
    goodput = monitor.part_of(Goodput)
    assert goodput is not None
    # The code before wrote to a predictable temporary name, following a link planted there.
    (save_dir / f".{STATE}.{os.getpid()}.{threading.get_ident()}.tmp").symlink_to(precious)
    (save_dir / STATE).unlink(missing_ok=True)  # saved once when the monitor was built
    (save_dir / STATE).symlink_to(precious)  # a link at the state's own name is replaced, not written through
    goodput.start()
    goodput.save()
    assert precious.read_text() == "the training user's data"
    assert not (save_dir / STATE).is_symlink()
    assert json.loads((save_dir / STATE).read_text())["process"]["pid"] == os.getpid()
    assert exported(monitor)["errors"]["goodput"] == 0


# -- a full disk -------------------------------------------------------------------------------------------------------
@pytest.mark.integration
def test_a_full_disk_at_construction_switches_the_ledger_files_off_without_sigbus(
    tmp_path: Path,
) -> None:
    from tests.support.disks import fill, small_disk

    script = (
        "import json; from ms_exporter import TrainingMonitor; from ms_exporter.core import catalogue as c\n"
        "from ms_exporter.features.goodput import Goodput\n"
        "m = TrainingMonitor(port=0)\n"
        "m.part_of(Goodput).step_ended(5)\n"
        "m.part_of(Goodput).save()\n"
        "errors = {dict(s.labels)['component']: s.value for s in m.store.series_of(c.ERRORS)}\n"
        "run = sum(s.value for s in m.store.series_of(c.RUN_TIME_SECONDS))\n"
        "print(json.dumps({'errors': errors.get('goodput'), 'kept': m.part_of(Goodput).state is not None, "
        "'run': run}))\n"
        "m.close()\n"
    )
    with small_disk(tmp_path / "disk") as disk:
        fill(disk, leave=0)
        done = subprocess.run(
            [sys.executable, "-X", "faulthandler", "-c", script],
            cwd=disk,
            capture_output=True,
            text=True,
            timeout=300,
            check=False,
            env={**os.environ, "PYTHONPATH": str(ROOT), "GLOG_v": "3"},
        )
        # The code before: -7, SIGBUS on the first store into the mapped hole of the new .step file.
        assert done.returncode == 0, (done.returncode, done.stderr[-3000:])
        result = json.loads(done.stdout.strip().splitlines()[-1])
        assert result["errors"] == 1 and result["kept"] is False and result["run"] > 0
        assert "cannot keep the run state" in done.stderr
        leftovers = [p.name for p in (disk / "monitor_output").iterdir()]
        assert not any(name.endswith(".partial") for name in leftovers), leftovers


def test_the_step_mark_is_allocated_before_it_is_mapped(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """Without a tmpfs to fill: a file system that has no block for the mark is the same ENOSPC."""
    from ms_exporter.features import run_state

    def no_space(fd: int, offset: int, length: int) -> None:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(run_state.os, "posix_fallocate", no_space)
    errors: list[BaseException] = []
    config = load_config({"save_dir": str(tmp_path), "run_id": RUN_ID})
    store = MetricStore()
    goodput = Goodput(config, store, PhaseClock(store), 0, None, errors.append)
    try:
        assert goodput.state is None and [e.errno for e in errors if isinstance(e, OSError)] == [errno.ENOSPC]
        goodput.step_ended(3)  # no mapping to store into
        goodput.save()
        assert store.value_of(c.RUN_TIME_SECONDS) >= 0 and sum(s.value for s in store.series_of(c.RUN_TIME_SECONDS)) > 0
    finally:
        goodput.close()
    assert "cannot keep the run state" in caplog.text
    assert sorted(p.name for p in tmp_path.iterdir()) == []  # no hole of a .step, no temporary, no lock left


# -- two processes on one save_dir and rank ----------------------------------------------------------------------------
def test_a_second_process_leaves_the_owners_files_alone(
    tmp_path: Path, monitor_in: Callable[..., TrainingMonitor], caplog: pytest.LogCaptureFixture
) -> None:
    """The other process is a lock taken here on a descriptor of its own (flock is per open file description)."""
    lock = tmp_path / "ms_exporter-rank0.lock"
    other = os.open(lock, os.O_RDWR | os.O_CREAT, 0o640)
    try:
        fcntl.flock(other, fcntl.LOCK_EX | fcntl.LOCK_NB)
        os.write(other, b"4242 otherhost\n")
        owners = encoded(a_state())
        (tmp_path / STATE).write_bytes(owners)
        (tmp_path / MARK).write_bytes(struct.pack("<q", 10))
        monitor = monitor_in(tmp_path)
        goodput = monitor.part_of(Goodput)
        assert goodput is not None
        monitor.on_train_begin(context(399, 0.0))  # trains on: step 400 and a save
        goodput.step_ended(400)
        goodput.save()
        assert monitor.jsonl_path == str(tmp_path / f"metrics-rank0-pid{os.getpid()}.jsonl")
        monitor.close()
        assert (tmp_path / STATE).read_bytes() == owners and (tmp_path / MARK).read_bytes() == struct.pack("<q", 10)
        assert "pid 4242 on host otherhost" in caplog.text and "give each job a save_dir of its own" in caplog.text
        values = exported(monitor)
        assert values["restarts"] == 0 and sum(values["run_time"].values()) > 0  # this process's own time
    finally:
        os.close(other)


def test_a_claim_is_shared_by_the_monitors_of_one_process_and_let_go_with_the_last(tmp_path: Path) -> None:
    first = run_lock.claim(tmp_path, 3)
    second = run_lock.claim(tmp_path, 3)
    assert (first.owner, first.suffix, second.owner) == (True, "", True)
    lock = tmp_path / "ms_exporter-rank3.lock"
    assert lock.read_text().split()[0] == str(os.getpid())
    first.release()
    first.release()  # once only
    assert lock.exists()
    second.release()
    assert not lock.exists()
    third = run_lock.claim(tmp_path, 3)
    del third  # collected unreleased: lets go too
    gc.collect()
    assert not lock.exists()


def test_a_link_at_the_lock_name_is_moved_aside(tmp_path: Path) -> None:
    precious = tmp_path / "precious.txt"
    precious.write_text("data")
    (tmp_path / "ms_exporter-rank0.lock").symlink_to(precious)
    claimed = run_lock.claim(tmp_path, 0)
    try:
        assert claimed.owner and precious.read_text() == "data"
        assert not (tmp_path / "ms_exporter-rank0.lock").is_symlink()
    finally:
        claimed.release()


CHILD = """
import json, sys
from ms_exporter import TrainingMonitor
from tests.support.cb_params import context
monitor = TrainingMonitor(backend="local", save_dir=sys.argv[1], interval=3600)
print(json.dumps({"jsonl": monitor.jsonl_path}), flush=True)
for line in sys.stdin:
    words = line.split()
    if words[0] == "train":
        first, last = int(words[1]), int(words[2])
        monitor.on_train_begin(context(first - 1, 0.0))
        for step in range(first, last + 1):
            monitor.on_train_step_begin(context(step, 1.0))
            monitor.on_train_step_end(context(step, 1.0))
        monitor.on_train_end(context(last, 1.0))
        print(json.dumps({"trained": last}), flush=True)
    elif words[0] == "close":
        monitor.close()
        print(json.dumps({"closed": True}), flush=True)
        break
"""


class Child:
    """A training process on `save_dir` with the default run id, told what to do on stdin."""

    def __init__(self, save_dir: Path, log: Path) -> None:
        self.log = log
        self.proc = subprocess.Popen(
            [sys.executable, "-c", CHILD, str(save_dir)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=log.open("w"),
            text=True,
            cwd=ROOT,
            env={**os.environ, "PYTHONPATH": str(ROOT), "GLOG_v": "3"},
        )

    def answer(self, seconds: float = 180) -> dict[str, Any]:
        assert self.proc.stdout is not None
        ready, _, _ = select.select([self.proc.stdout], [], [], seconds)
        line = self.proc.stdout.readline() if ready else ""
        assert line, f"no answer from pid {self.proc.pid} (exit {self.proc.poll()}): {self.log.read_text()[-3000:]}"
        return dict(json.loads(line))

    def tell(self, command: str) -> dict[str, Any]:
        assert self.proc.stdin is not None
        self.proc.stdin.write(command + "\n")
        self.proc.stdin.flush()
        return self.answer()

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait(60)


@pytest.mark.integration
def test_two_processes_on_one_save_dir_keep_their_files_apart(tmp_path: Path) -> None:
    save_dir = tmp_path / "save"
    first = Child(save_dir, tmp_path / "first.log")
    try:
        first_jsonl = Path(first.answer()["jsonl"])
        second = Child(save_dir, tmp_path / "second.log")
        try:
            second_jsonl = Path(second.answer()["jsonl"])
            assert first_jsonl == save_dir / "metrics-rank0.jsonl"
            assert second_jsonl == save_dir / f"metrics-rank0-pid{second.proc.pid}.jsonl"
            assert first.tell("train 1 5") == {"trained": 5}
            assert second.tell("train 101 103") == {"trained": 103}
            assert first.tell("close") == {"closed": True}
            (state,) = save_dir.glob("ms_exporter-run-*-rank0.json")
            owners = state.read_bytes()
            assert second.tell("close") == {"closed": True}
            second.proc.wait(60)
            first.proc.wait(60)
        finally:
            second.stop()
    finally:
        first.stop()
    # The second process said so, naming the first, and never wrote the first's ledger.
    warned = (tmp_path / "second.log").read_text()
    assert f"belong to another process (pid {first.proc.pid} on host" in warned, warned[-3000:]
    assert state.read_bytes() == owners and json.loads(owners)["process"]["pid"] == first.proc.pid
    assert sorted(p.name for p in save_dir.glob("ms_exporter-run-*")) == [state.name, state.with_suffix(".step").name]
    # Each JSON Lines file holds its own process's steps: the report of the first reads the first only.
    steps = {
        path: [r["step"] for r in map(json.loads, path.read_text().splitlines()) if r["type"] == "step"]
        for path in (first_jsonl, second_jsonl)
    }
    assert steps == {first_jsonl: [1, 2, 3, 4, 5], second_jsonl: [101, 102, 103]}
    assert summary(load_run([first_jsonl]))["records"] == 5
    assert not (save_dir / "ms_exporter-rank0.lock").exists()  # let go by the owner's close


# -- a monitor whose construction fails leaves no saver thread ---------------------------------------------------------
def goodput_threads() -> int:
    return sum(1 for thread in threading.enumerate() if thread.name == "ms_exporter-goodput")


def test_goodput_starts_its_saver_only_when_told(tmp_path: Path) -> None:
    config = load_config({"save_dir": str(tmp_path), "run_id": RUN_ID, "goodput": {"save_seconds": 0.1}})
    store = MetricStore()
    before = goodput_threads()
    goodput = Goodput(config, store, PhaseClock(store), 0, None, lambda exc: pytest.fail(str(exc)))
    try:
        time.sleep(0.3)
        assert goodput_threads() == before and not (tmp_path / STATE).exists()  # nothing runs, nothing written
    finally:
        goodput.close()  # what the monitor calls when its construction fails after this point
    assert goodput_threads() == before and not (tmp_path / STATE).exists()
    assert not (tmp_path / "ms_exporter-rank0.lock").exists()


def test_a_config_error_after_the_ledger_leaves_no_saver_thread(tmp_path: Path) -> None:
    """The monitor closes its ledger when a later part raises (callback.py); the ledger started nothing anyway."""
    kept = TrainingMonitor(backend="local", save_dir=str(tmp_path), interval=3600)
    try:
        before = goodput_threads()
        with pytest.raises(ConfigError, match="already written by another TrainingMonitor"):
            TrainingMonitor(backend="local", save_dir=str(tmp_path), interval=3600)
        assert goodput_threads() == before
    finally:
        kept.close()
