"""SIGTERM/SIGINT while training: let the sinks save what must survive, then do what would have happened anyway.

A Python-level handler runs only on the main thread, between bytecodes: a main thread blocked in native code (a
stuck data loader, a collective that waits for a dead peer) never runs it, and a SIGTERM that would have ended the
process at once would do nothing at all. So the relay also owns the interpreter's wakeup file descriptor
(`signal.set_wakeup_fd`): Python's C-level handler writes each signal's number there at once, whatever the main
thread does, and a watcher thread reads it. When the main thread has not entered the handler within
HANDLER_GRACE_SECONDS, the watcher does the saves itself and, where the signal's action is to end the process
(SIGTERM with the default action), ends it with that signal (docs/reliability.md, "Signals that do not need the
main thread").
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import threading
import time
import weakref
from collections.abc import Callable
from types import FrameType
from typing import Any

from ms_exporter.core.errors import OnPartError

SIGNALS = (signal.SIGTERM, signal.SIGINT)
HANDLER_GRACE_SECONDS = 2.0  # the main thread's handler starts within this when the main thread runs Python

# The relays whose handlers are installed: a forked child gets the dispositions they replaced back at once.
_INSTALLED: weakref.WeakSet[SignalRelay] = weakref.WeakSet()


def _after_fork_in_child() -> None:
    """A process forked from the training process (a data-loader worker, a multiprocessing pool) owns none of the
    sinks. A Python-level handler would also defer its SIGTERM until its main thread runs Python again: a
    multiprocessing Pool that terminates its workers then hung (1 in ~200 in a fork-pool-terminate loop, and
    MindSpore's SummaryCollector in `make bench`). The child starts with the dispositions it would have had."""
    relays = list(_INSTALLED)
    for _ in relays:  # a relay installed over another chains to it: unwind one layer per pass
        for relay in relays:
            relay.leave()


class SignalRelay:
    """Installs one handler for SIGTERM and SIGINT that calls `on_signal(name, ending)` and then chains to the handler
    it replaced (or the default action). It never swallows a signal: a SIGTERM still ends the process. `ending` says
    that the process ends right after the saves (SIGTERM with the default action), so a last scrape may be awaited.

    While installed, a watcher thread reads the interpreter's wakeup fd: a signal whose handler the main thread has
    not entered within HANDLER_GRACE_SECONDS (it is blocked in native code) gets its saves from the watcher, and a
    SIGTERM whose action is to end the process then ends it. Where the program already set a wakeup fd (an asyncio
    loop in the main thread with signal handlers), that one is left alone and there is no watcher.

    Handlers can only be installed from the main thread; elsewhere install() does nothing.
    """

    def __init__(self, on_signal: Callable[[str, bool], None], on_error: OnPartError) -> None:
        self._on_signal = on_signal
        self._on_error = on_error
        self._previous: dict[int, Any] = {}
        self._pid = os.getpid()
        self._busy = False
        self.received: list[str] = []  # the signals this relay handled, by name, in order
        # Each delivery of a signal is handled once: by the main thread's handler (entered) or by the watcher (taken).
        # A main-thread call that comes after the watcher took its delivery only chains (answered).
        self._changed = threading.Condition(threading.RLock())
        self._entered: dict[int, int] = dict.fromkeys(SIGNALS, 0)
        self._taken: dict[int, int] = dict.fromkeys(SIGNALS, 0)
        self._answered: dict[int, int] = dict.fromkeys(SIGNALS, 0)
        self._delivered: dict[int, int] = dict.fromkeys(SIGNALS, 0)
        self._wakeup_fd: int | None = None  # the write end of the watcher's pipe, while it is the wakeup fd

    def install(self) -> None:
        if threading.current_thread() is not threading.main_thread():
            return
        self._pid = os.getpid()
        for signum in SIGNALS:
            try:
                previous = signal.getsignal(signum)
                if previous == self._handle:
                    continue  # already ours (a train() inside train()): never chain to ourselves
                signal.signal(signum, self._handle)
                self._previous[signum] = previous
                _INSTALLED.add(self)
            except (ValueError, OSError) as exc:  # e.g. an embedding interpreter that owns signals
                self._on_error(exc)
        if self._previous:
            self._start_watcher()

    def leave(self) -> None:
        """In a forked child: the handlers this relay replaced, back (the child's only thread is its main one), and
        no wakeup fd: a signal to the child must not reach the parent's watcher through the inherited pipe."""
        for signum, previous in list(self._previous.items()):
            try:
                if signal.getsignal(signum) == self._handle:
                    signal.signal(signum, previous)
            except (ValueError, OSError, TypeError):
                pass
        if self._wakeup_fd is not None:
            with contextlib.suppress(ValueError, OSError):
                if signal.set_wakeup_fd(-1) != self._wakeup_fd:
                    signal.set_wakeup_fd(-1)
            self._wakeup_fd = None

    def restore(self) -> None:
        """Give back the handlers install() replaced (those still ours); a closed monitor leaves the signal path."""
        if threading.current_thread() is not threading.main_thread():
            return
        for signum, previous in list(self._previous.items()):
            if signal.getsignal(signum) == self._handle:
                signal.signal(signum, previous)
            del self._previous[signum]
        self._stop_watcher()

    # -- the watcher ---------------------------------------------------------------------------------------------
    def _start_watcher(self) -> None:
        if self._wakeup_fd is not None:
            return
        read_end, write_end = os.pipe()
        os.set_blocking(write_end, False)  # the C-level handler must never block on it
        try:
            earlier = signal.set_wakeup_fd(write_end, warn_on_full_buffer=False)
        except (ValueError, OSError) as exc:
            os.close(read_end)
            os.close(write_end)
            self._on_error(exc)
            return
        if earlier != -1:  # the program's own (asyncio's): it stays, and this relay works on the main thread only
            signal.set_wakeup_fd(earlier)
            os.close(read_end)
            os.close(write_end)
            return
        self._wakeup_fd = write_end
        threading.Thread(
            target=self._watch, args=(read_end, write_end), name="ms_exporter-signals", daemon=True
        ).start()

    def _stop_watcher(self) -> None:
        write_end, self._wakeup_fd = self._wakeup_fd, None
        if write_end is None:
            return
        with contextlib.suppress(ValueError, OSError):
            current = signal.set_wakeup_fd(-1)
            if current != write_end:  # somebody set theirs since: it stays
                signal.set_wakeup_fd(current)
        with contextlib.suppress(OSError):
            os.write(write_end, b"\0")  # wakes the watcher, which closes both ends

    def _watch(self, read_end: int, write_end: int) -> None:
        try:
            while True:
                data = os.read(read_end, 64)
                if not data or 0 in data:
                    return
                for signum in data:
                    if signum in self._delivered:
                        self._on_delivery(signum)
        except Exception as exc:  # the watcher is a safety net: losing it must not cost the training anything
            self._on_error(exc)
        finally:
            for fd in (read_end, write_end):
                with contextlib.suppress(OSError):
                    os.close(fd)

    def _on_delivery(self, signum: int) -> None:
        """A signal arrived: give the main thread's handler HANDLER_GRACE_SECONDS to enter, else do its work here."""
        with self._changed:
            self._delivered[signum] += 1
            delivered = self._delivered[signum]
            self._changed.wait_for(
                lambda: self._entered[signum] + self._taken[signum] >= delivered, HANDLER_GRACE_SECONDS
            )
            if self._entered[signum] + self._taken[signum] >= delivered or signum not in self._previous:
                return  # the main thread handled it (or the relay was restored meanwhile)
            self._taken[signum] += 1
            ending = self._ends_process(signum)
        self._save(signum, ending)
        if ending:
            end_process(signum)

    # -- the main thread's handler ----------------------------------------------------------------------------------
    def _handle(self, signum: int, frame: FrameType | None) -> None:
        if os.getpid() != self._pid:
            # A process forked from the training process (a data-loader or summary worker) inherited this
            # handler: it owns none of the sinks, and must die or stop as it would without us.
            default_action(signum)
            return
        if self._busy:
            # A handler installed after ours chained back to us: end the loop with the default action.
            default_action(signum)
            return
        with self._changed:
            saves = self._taken[signum] <= self._answered[signum]  # else the watcher made this delivery's saves
            if saves:
                self._entered[signum] += 1
            else:
                self._answered[signum] += 1
            self._changed.notify_all()
        self._busy = True
        try:
            if saves:
                self._save(signum, self._ends_process(signum))
            previous = self._previous.get(signum, signal.SIG_DFL)
            if callable(previous):
                previous(signum, frame)
            elif previous != signal.SIG_IGN:
                default_action(signum)
        finally:
            self._busy = False

    def _ends_process(self, signum: int) -> bool:
        return signum == signal.SIGTERM and self._previous.get(signum, signal.SIG_DFL) == signal.SIG_DFL

    def _save(self, signum: int, ending: bool) -> None:
        name = signal.Signals(signum).name
        self.received.append(name)
        try:
            self._on_signal(name, ending)
        except Exception as exc:
            self._on_error(exc)


def end_process(signum: int) -> None:
    """End this process with `signum`'s default action from any thread (signal.signal() works on the main thread
    only, so the C library's signal() sets the default first); exit 128 + signum if that cannot be done."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.signal.argtypes = (ctypes.c_int, ctypes.c_void_p)
        libc.signal.restype = ctypes.c_void_p
        libc.signal(signum, None)  # SIG_DFL
        os.kill(os.getpid(), signum)
        time.sleep(10)  # the kernel ends the process meanwhile
    finally:
        os._exit(128 + signum)


def default_action(signum: int) -> None:
    """What Python does with SIGINT (KeyboardInterrupt) and the OS with anything else (SIGTERM ends the process)."""
    if signum == signal.SIGINT:
        raise KeyboardInterrupt
    signal.signal(signum, signal.SIG_DFL)
    os.kill(os.getpid(), signum)


os.register_at_fork(after_in_child=_after_fork_in_child)
