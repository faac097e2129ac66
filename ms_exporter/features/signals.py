"""SIGTERM/SIGINT while training: let the sinks save what must survive, then do what would have happened anyway.

A Python-level handler runs only on the main thread, between bytecodes: a main thread blocked in native code (a
stuck data loader, a collective that waits for a dead peer) never runs it, and a SIGTERM that would have ended the
process at once would do nothing at all. So the process's relays share one watcher that owns the interpreter's
wakeup file descriptor (`signal.set_wakeup_fd`): Python's C-level handler writes each signal's number there at once,
whatever the main thread does, and the watcher thread reads it. A relay whose handler the main thread has not
entered within HANDLER_GRACE_SECONDS gets its saves from the watcher; the watcher ends the process only where the
handler in place is a relay's whose chain ends in SIGTERM's default action. A handler installed after ours that does
not chain to it owns the signal: the saves are still made, and ending the process is that handler's call
(docs/reliability.md, "Signals that do not need the main thread" and "Signals next to a handler of the script").
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


def _relay_of(handler: Any) -> SignalRelay | None:
    """The relay whose handler `handler` is (a bound `_handle`), else None."""
    owner = getattr(handler, "__self__", None)
    if isinstance(owner, SignalRelay) and getattr(handler, "__func__", None) is SignalRelay._handle:
        return owner
    return None


def _chain_ends(signum: int, handler: Any) -> bool:
    """Whether `handler`, followed through the relays it chains to, ends the process: SIGTERM whose chain is relays
    only, down to the default action. A handler of the script anywhere in the chain decides for itself."""
    if signum != signal.SIGTERM:
        return False
    seen: set[int] = set()
    while (relay := _relay_of(handler)) is not None:
        if id(relay) in seen:
            return True  # relays chained round: the loop ends with the default action (SignalRelay._handle)
        seen.add(id(relay))
        handler = relay._previous.get(signum, signal.SIG_DFL)
    return bool(handler == signal.SIG_DFL)


def _past_closed(signum: int, handler: Any) -> Any:
    """`handler`, or where it is a relay that was restored (a closed monitor that another chained to), the first
    handler down its chain that is not: a closed monitor leaves no handler of its own in place."""
    seen: set[int] = set()
    while (relay := _relay_of(handler)) is not None and not relay._on and id(relay) not in seen:
        seen.add(id(relay))
        handler = relay._previous.get(signum, signal.SIG_DFL)
    return handler


class _Watcher:
    """The one watcher of this process, whatever the number of relays: it owns the wakeup fd while any relay is
    registered, so closing one monitor never leaves another monitor's signals without a watcher.

    Deliveries are counted per signal; each relay counts the deliveries it accounted for (`_seen`: entered on the
    main thread, or taken here). A delivery that some registered relay has not seen within HANDLER_GRACE_SECONDS is
    taken for that relay: its saves are made here, on this thread."""

    def __init__(self) -> None:
        self.changed = threading.Condition(threading.RLock())
        self.relays: list[SignalRelay] = []
        self.delivered: dict[int, int] = dict.fromkeys(SIGNALS, 0)
        self._wakeup_fd: int | None = None  # the write end of the pipe, while it is the wakeup fd
        self._read_end: int | None = None

    def register(self, relay: SignalRelay) -> None:
        """On the main thread: `relay` is installed; start the watcher if none runs yet."""
        with self.changed:
            if relay not in self.relays:
                relay._base = dict(self.delivered)  # deliveries before it was installed are not its own
                relay._seen = dict.fromkeys(SIGNALS, 0)
                self.relays.append(relay)
        self._start(relay._on_error)

    def unregister(self, relay: SignalRelay) -> None:
        """On the main thread: `relay` left; the watcher stops with the last relay."""
        with self.changed:
            if relay in self.relays:
                self.relays.remove(relay)
            last = not self.relays
            self.changed.notify_all()
        if last:
            self._stop()

    def _start(self, on_error: OnPartError) -> None:
        if self._wakeup_fd is not None:
            return
        read_end, write_end = os.pipe()
        os.set_blocking(write_end, False)  # the C-level handler must never block on it
        try:
            earlier = signal.set_wakeup_fd(write_end, warn_on_full_buffer=False)
        except (ValueError, OSError) as exc:
            os.close(read_end)
            os.close(write_end)
            on_error(exc)
            return
        if earlier != -1:  # the program's own (asyncio's): it stays, and the relays work on the main thread only
            signal.set_wakeup_fd(earlier)
            os.close(read_end)
            os.close(write_end)
            return
        self._wakeup_fd, self._read_end = write_end, read_end
        threading.Thread(
            target=self._watch, args=(read_end, write_end, on_error), name="ms_exporter-signals", daemon=True
        ).start()

    def _stop(self) -> None:
        write_end, self._wakeup_fd, self._read_end = self._wakeup_fd, None, None
        if write_end is None:
            return
        with contextlib.suppress(ValueError, OSError):
            current = signal.set_wakeup_fd(-1)
            if current != write_end:  # somebody set theirs since: it stays
                signal.set_wakeup_fd(current)
        with contextlib.suppress(OSError):
            os.write(write_end, b"\0")  # wakes the watcher, which closes both ends

    def after_fork_in_child(self) -> None:
        """The child has no watcher thread: no wakeup fd into the parent's pipe, and the child's copies closed."""
        write_end, read_end = self._wakeup_fd, self._read_end
        self._wakeup_fd = self._read_end = None
        self.relays = []
        self.changed = threading.Condition(threading.RLock())  # a lock the parent's watcher held stays held here
        if write_end is None:
            return
        try:
            earlier = signal.set_wakeup_fd(-1)
            if earlier != write_end:  # the program's own since: it stays
                signal.set_wakeup_fd(earlier)
        except (ValueError, OSError):
            return  # still the wakeup fd: keep it open, or a signal's byte would go to whatever reuses its number
        for fd in (read_end, write_end):
            if fd is not None:
                with contextlib.suppress(OSError):
                    os.close(fd)

    def _watch(self, read_end: int, write_end: int, on_error: OnPartError) -> None:
        try:
            while True:
                data = os.read(read_end, 64)
                if not data or 0 in data:
                    return
                for signum in data:
                    if signum in self.delivered:
                        self._on_delivery(signum)
        except Exception as exc:  # the watcher is a safety net: losing it must not cost the training anything
            on_error(exc)
        finally:
            for fd in (read_end, write_end):
                with contextlib.suppress(OSError):
                    os.close(fd)

    def _on_delivery(self, signum: int) -> None:
        """A signal arrived: give the main thread's handlers HANDLER_GRACE_SECONDS to enter, else save here."""
        with self.changed:
            self.delivered[signum] += 1
            delivered = self.delivered[signum]

            def behind() -> list[SignalRelay]:
                return [
                    relay
                    for relay in self.relays
                    if signum in relay._previous and relay._base[signum] + relay._seen[signum] < delivered
                ]

            self.changed.wait_for(lambda: not behind(), HANDLER_GRACE_SECONDS)
            late = behind()
            if not late:
                return  # the main thread's handlers took it (or the relays left meanwhile)
            for relay in late:
                relay._seen[signum] += 1
                relay._taken[signum] += 1
            # getsignal() reads Python's table from any thread. The process ends here only where the handler in place
            # is a relay's that the main thread never entered and whose chain ends in the default action: a handler
            # installed after ours owns the signal, and so does one ours chains to.
            top = _relay_of(signal.getsignal(signum))
            ending = top is not None and top in late and _chain_ends(signum, top._handle)
        for relay in late:
            relay._save(signum, ending)
        if ending:
            end_process(signum)


_WATCHER = _Watcher()


def _after_fork_in_child() -> None:
    """A process forked from the training process (a data-loader worker, a multiprocessing pool) owns none of the
    sinks. A Python-level handler would also defer its SIGTERM until its main thread runs Python again: a
    multiprocessing Pool that terminates its workers then hung (1 in ~200 in a fork-pool-terminate loop, and
    MindSpore's SummaryCollector in `make bench`). The child starts with the dispositions it would have had."""
    relays = list(_INSTALLED)
    for _ in relays:  # a relay installed over another chains to it: unwind one layer per pass
        for relay in relays:
            relay.leave()
    _WATCHER.after_fork_in_child()


class SignalRelay:
    """Installs one handler for SIGTERM and SIGINT that calls `on_signal(name, ending)` and then chains to the handler
    it replaced (or the default action). It never swallows a signal: a SIGTERM still ends the process. `ending` says
    that the process ends right after the saves (SIGTERM whose chain ends in the default action), so a last scrape
    may be awaited.

    Each delivery gets this relay's saves once: from its handler on the main thread, or from the process's watcher
    (`_Watcher`) when the handler was not entered within HANDLER_GRACE_SECONDS (the main thread is stuck in native
    code, or a handler installed after ours does not chain to it). A delivery that arrives while this relay's
    handler still runs (a second SIGTERM during the script's own checkpoint save) gets what Python would have done
    without the relay: the handler it replaced, called again, and no second save. Where the program already set a
    wakeup fd (an asyncio loop in the main thread with signal handlers), that one is left alone and there is no
    watcher.

    Handlers can only be installed from the main thread; elsewhere install() does nothing.
    """

    def __init__(self, on_signal: Callable[[str, bool], None], on_error: OnPartError) -> None:
        self._on_signal = on_signal
        self._on_error = on_error
        self._previous: dict[int, Any] = {}
        self._pid = os.getpid()
        self._on = False  # installed and not restored: its saves are due
        # The frames this relay's handler is running for (main thread only): a call with one of them is a handler
        # that chained back to us; a call with another is a new delivery while the handler runs.
        self._running: list[FrameType | None] = []
        self.received: list[str] = []  # the signals this relay handled, by name, in order
        # Per signal (under the watcher's lock): deliveries before this relay was installed, deliveries it accounted
        # for, those the watcher took for it, and the main-thread calls that came after the watcher took one.
        self._base: dict[int, int] = dict.fromkeys(SIGNALS, 0)
        self._seen: dict[int, int] = dict.fromkeys(SIGNALS, 0)
        self._taken: dict[int, int] = dict.fromkeys(SIGNALS, 0)
        self._answered: dict[int, int] = dict.fromkeys(SIGNALS, 0)

    def install(self) -> None:
        """Put this relay's handler in front (again at each train begin: a handler installed since chains to ours,
        if it chains at all)."""
        if threading.current_thread() is not threading.main_thread():
            return
        self._pid = os.getpid()
        for signum in SIGNALS:
            try:
                previous = signal.getsignal(signum)
                if self._reached_from(signum, previous):
                    continue  # already in front, or behind other relays only: never chain to ourselves
                signal.signal(signum, self._handle)
                self._previous[signum] = previous
                _INSTALLED.add(self)
            except (ValueError, OSError) as exc:  # e.g. an embedding interpreter that owns signals
                self._on_error(exc)
        if self._previous and not self._on:
            self._on = True
            _WATCHER.register(self)

    def _reached_from(self, signum: int, handler: Any) -> bool:
        seen: set[int] = set()
        while (relay := _relay_of(handler)) is not None and id(relay) not in seen:
            if relay is self:
                return True
            seen.add(id(relay))
            handler = relay._previous.get(signum, signal.SIG_DFL)
        return False

    def leave(self) -> None:
        """In a forked child: the handlers this relay replaced, back (the child's only thread is its main one); the
        watcher's wakeup fd goes with _Watcher.after_fork_in_child."""
        self._on = False
        self._running = []
        for signum, previous in list(self._previous.items()):
            try:
                if signal.getsignal(signum) == self._handle:
                    signal.signal(signum, _past_closed(signum, previous))
            except (ValueError, OSError, TypeError):
                pass

    def restore(self) -> None:
        """Give back the handlers install() replaced (those still ours); a closed monitor leaves the signal path. A
        relay that another handler chains to stays a link of that chain: it only passes the signal on."""
        if threading.current_thread() is not threading.main_thread():
            return
        was_on, self._on = self._on, False
        for signum, previous in list(self._previous.items()):
            if signal.getsignal(signum) == self._handle:
                signal.signal(signum, _past_closed(signum, previous))
        if was_on:
            _WATCHER.unregister(self)

    # -- the main thread's handler ----------------------------------------------------------------------------------
    def _handle(self, signum: int, frame: FrameType | None) -> None:
        if os.getpid() != self._pid:
            # A process forked from the training process (a data-loader or summary worker) inherited this
            # handler: it owns none of the sinks, and must die or stop as it would without us.
            default_action(signum)
            return
        if any(running is frame for running in self._running):
            # A handler installed after ours chained back to us with the frame we passed it: end the loop with the
            # default action.
            default_action(signum)
            return
        # A call while ours runs with another frame is a new delivery (Python runs a handler again when a signal
        # comes during it): pass it on as Python would have without us, and save nothing twice.
        nested = bool(self._running)
        with _WATCHER.changed:
            if self._taken[signum] > self._answered[signum]:
                self._answered[signum] += 1  # the watcher made this delivery's saves
                saves = False
            else:
                self._seen[signum] += 1
                saves = self._on and not nested
            _WATCHER.changed.notify_all()
        self._running.append(frame)
        try:
            if saves:
                self._save(signum, _chain_ends(signum, self._handle))
            elif nested:
                self.received.append(signal.Signals(signum).name)  # a signal ran handlers: the record says so
            previous = self._previous.get(signum, signal.SIG_DFL)
            if callable(previous):
                previous(signum, frame)
            elif previous != signal.SIG_IGN:
                default_action(signum)
        finally:
            self._running.pop()

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
