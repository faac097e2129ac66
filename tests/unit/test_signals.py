"""The signal relay: a forked process starts with the handlers it would have had; a second delivery during a handler
is passed on as Python would; one watcher serves every relay; a forked child leaves the parent's lock alone."""

from __future__ import annotations

import fcntl
import os
import signal
import threading
from pathlib import Path

import pytest

from ms_exporter.core.files import run_lock
from ms_exporter.features.signals import SignalRelay
from tests.support.waiting import wait_until


def test_a_forked_child_gets_the_replaced_handlers_back_even_under_two_relays() -> None:
    """A Python-level SIGTERM handler in a forked worker defers the signal until the worker runs Python again: a
    multiprocessing Pool terminating its workers hung that way (1 in ~200 terminations)."""
    before = {signum: signal.getsignal(signum) for signum in (signal.SIGTERM, signal.SIGINT)}
    first, second = SignalRelay(lambda name: None, print), SignalRelay(lambda name: None, print)
    first.install()
    second.install()  # chains to the first
    try:
        assert signal.getsignal(signal.SIGTERM) != before[signal.SIGTERM]
        pid = os.fork()
        if pid == 0:  # the child: exit 0 only if both handlers are the ones from before the relays
            os._exit(0 if all(signal.getsignal(s) == h for s, h in before.items()) else 1)
        _, status = os.waitpid(pid, 0)
        assert os.waitstatus_to_exitcode(status) == 0
        # The parent keeps its relays.
        assert signal.getsignal(signal.SIGTERM) != before[signal.SIGTERM]
    finally:
        second.restore()
        first.restore()
    assert {signum: signal.getsignal(signum) for signum in before} == before


def test_a_second_signal_during_the_replaced_handler_runs_it_again_without_a_second_save() -> None:
    """Without the relay, Python runs a handler again when its signal comes while it runs; with it, the same
    (the handler it replaced, called again) and one save for the first delivery only."""
    saves: list[str] = []
    calls: list[int] = []

    def script_handler(signum: int, frame: object) -> None:
        calls.append(len(calls))
        if len(calls) == 1:
            signal.raise_signal(signal.SIGINT)  # the second delivery, while this handler runs
            calls.append(-1)  # a bytecode after it: Python runs pending handlers here at the latest

    before = signal.signal(signal.SIGINT, script_handler)
    relay = SignalRelay(lambda name, ending: saves.append(name), print)
    relay.install()
    try:
        signal.raise_signal(signal.SIGINT)
    finally:
        relay.restore()
        signal.signal(signal.SIGINT, before)
    assert saves == ["SIGINT"]
    assert calls == [0, 1, -1]  # re-entered once, then the first call went on


def test_a_handler_that_chains_back_to_the_relay_ends_in_the_default_action() -> None:
    """A handler installed over the relay that chains to it with the frame it got, while the relay chains to it:
    the loop ends with SIGINT's default action (KeyboardInterrupt) after one save."""
    saves: list[str] = []
    relay = SignalRelay(lambda name, ending: saves.append(name), print)
    before = signal.getsignal(signal.SIGINT)
    relay.install()
    chained_to = signal.getsignal(signal.SIGINT)

    def script_handler(signum: int, frame: object) -> None:
        chained_to(signum, frame)  # type: ignore[operator]

    signal.signal(signal.SIGINT, script_handler)
    relay.install()  # a train begin: the relay in front again, chaining to the script's handler
    try:
        with pytest.raises(KeyboardInterrupt):
            signal.raise_signal(signal.SIGINT)
    finally:
        relay.restore()
        signal.signal(signal.SIGINT, before)
    assert saves == ["SIGINT"]


def test_one_watcher_serves_every_relay_until_the_last_leaves() -> None:
    """Closing the monitor whose relay came first leaves the other's signals watched, and its own handler out of
    the chain once the other leaves too."""
    # A watcher stopped by an earlier test ends on its own thread, woken by a byte: let it finish before counting.
    wait_until(lambda: _watchers() == 0, 10, "earlier tests' signal watchers to end")
    before = {signum: signal.getsignal(signum) for signum in (signal.SIGTERM, signal.SIGINT)}
    first, second = SignalRelay(lambda name, ending: None, print), SignalRelay(lambda name, ending: None, print)
    first.install()
    second.install()
    try:
        first.restore()  # the first monitor closes
        watching = signal.set_wakeup_fd(-1)
        signal.set_wakeup_fd(watching)
        assert watching != -1  # still watched for the second
        assert _watchers() == 1
    finally:
        second.restore()
    assert signal.set_wakeup_fd(-1) == -1  # the last relay left: the wakeup fd is no longer ours
    assert {signum: signal.getsignal(signum) for signum in before} == before


def test_a_forked_child_never_removes_the_parents_lock(tmp_path: Path) -> None:
    """A child shares the parent's flock (fork shares the open file): its release at exit must not unlink the lock
    file, and its copy is closed, so the lock ends with the parent."""
    held = run_lock.claim(tmp_path, 0)
    assert held.owner
    try:
        pid = os.fork()
        if pid == 0:
            held.release()  # what the child's exit (the claim's finalizer) would do
            os._exit(0 if not run_lock._HELD else 1)
        _, status = os.waitpid(pid, 0)
        assert os.waitstatus_to_exitcode(status) == 0
        lock = tmp_path / run_lock.LOCK_NAME.format(rank=0)
        assert lock.exists()
        other = os.open(lock, os.O_RDWR)  # another open file: it conflicts with the parent's flock
        try:
            with pytest.raises(BlockingIOError):
                fcntl.flock(other, fcntl.LOCK_EX | fcntl.LOCK_NB)
        finally:
            os.close(other)
    finally:
        held.release()


def test_a_forked_child_closing_the_monitor_leaves_the_parents_target_and_lock(tmp_path: Path) -> None:
    """A monitor is off in a forked child: its close() there (also the child's atexit) touches no file of the
    parent's. The parent's own close() still removes them."""
    from ms_exporter import TrainingMonitor

    monitor = TrainingMonitor(
        port=0, backend=["prometheus", "local"], save_dir=str(tmp_path), file_sd_dir=str(tmp_path / "sd")
    )
    target = tmp_path / "sd" / "ms-exporter-default-rank0.json"
    lock = tmp_path / run_lock.LOCK_NAME.format(rank=0)
    try:
        assert target.exists() and lock.exists()
        pid = os.fork()
        if pid == 0:
            monitor.close()
            os._exit(0)
        _, status = os.waitpid(pid, 0)
        assert os.waitstatus_to_exitcode(status) == 0
        assert target.exists() and lock.exists()
    finally:
        monitor.close()
    assert not target.exists() and not lock.exists()


def _watchers() -> int:
    return [thread.name for thread in threading.enumerate()].count("ms_exporter-signals")
