"""SIGTERM/SIGINT while training: let the sinks save what must survive, then do what would have happened anyway."""

from __future__ import annotations

import os
import signal
import threading
import weakref
from collections.abc import Callable
from types import FrameType
from typing import Any

SIGNALS = (signal.SIGTERM, signal.SIGINT)

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
    """Installs one handler for SIGTERM and SIGINT that calls `on_signal(name)` and then chains to the handler it
    replaced (or the default action). It never swallows a signal: a SIGTERM still ends the process.

    Handlers can only be installed from the main thread; elsewhere install() does nothing.
    """

    def __init__(self, on_signal: Callable[[str], None], on_error: Callable[[BaseException], None]) -> None:
        self._on_signal = on_signal
        self._on_error = on_error
        self._previous: dict[int, Any] = {}
        self._pid = os.getpid()
        self._busy = False

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

    def leave(self) -> None:
        """In a forked child: the handlers this relay replaced, back (the child's only thread is its main one)."""
        for signum, previous in list(self._previous.items()):
            try:
                if signal.getsignal(signum) == self._handle:
                    signal.signal(signum, previous)
            except (ValueError, OSError, TypeError):
                pass

    def restore(self) -> None:
        """Give back the handlers install() replaced (those still ours); a closed monitor leaves the signal path."""
        if threading.current_thread() is not threading.main_thread():
            return
        for signum, previous in list(self._previous.items()):
            if signal.getsignal(signum) == self._handle:
                signal.signal(signum, previous)
            del self._previous[signum]

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
        self._busy = True
        try:
            try:
                self._on_signal(signal.Signals(signum).name)
            except Exception as exc:
                self._on_error(exc)
            previous = self._previous.get(signum, signal.SIG_DFL)
            if callable(previous):
                previous(signum, frame)
            elif previous != signal.SIG_IGN:
                default_action(signum)
        finally:
            self._busy = False


def default_action(signum: int) -> None:
    """What Python does with SIGINT (KeyboardInterrupt) and the OS with anything else (SIGTERM ends the process)."""
    if signum == signal.SIGINT:
        raise KeyboardInterrupt
    signal.signal(signum, signal.SIG_DFL)
    os.kill(os.getpid(), signum)


os.register_at_fork(after_in_child=_after_fork_in_child)
