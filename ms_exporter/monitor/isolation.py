"""Which exceptions out of a part are the part's failure: all of them, except what a signal raised through it.

The monitor calls code it does not control on the training thread: a user's strategy, a probe handed in, a sink.
Whatever that code raises, `asyncio.CancelledError`, `SystemExit` from a `sys.exit`, a `KeyboardInterrupt` from a
`__float__`, is that part's failure: counted, logged once, and after repeated failures the part is switched off,
while the training goes on. One exception is not the part's: a signal's. Python runs a signal's handler on the
main thread between two bytecodes of whatever runs there, so a Ctrl-C (SIGINT's KeyboardInterrupt) or a script's
SIGTERM handler that calls `sys.exit` raises inside the part that happened to be running. That exception is meant
for the training and must reach it.

The two are told apart by the signal record, not by the exception: the relay (features/signals.py) fronts SIGINT
and SIGTERM, records each signal it handles before it chains to the handler it replaced, and so marks every Ctrl-C
and every SIGTERM handler's exit. A KeyboardInterrupt or SystemExit is passed on to the training when

- a signal was recorded while the part ran (the count moved since `mark()`), or
- the record cannot tell: this monitor's relay is not the Python handler of SIGINT or SIGTERM (not installed, or a
  handler installed after it does not chain to it), or another signal has a Python handler of its own, which may
  exit too. Passing on what might be a Ctrl-C is the safe side: a stopped training can be restarted, a swallowed
  Ctrl-C cannot be taken back.

Anything else (CancelledError, GeneratorExit, a BaseException of the part's own) is the part's: no signal handler
raises those. Off the main thread no Python signal handler runs at all, so everything raised there is the part's.
"""

from __future__ import annotations

import signal
import threading
from typing import Any

# The signals the relay fronts (features/signals.py installs one handler for both).
_FRONTED = (signal.SIGINT, signal.SIGTERM)


class Isolation:
    """Decides whether a BaseException out of a part is passed on to the training (module docstring)."""

    def __init__(self) -> None:
        self._relay: Any = None  # a SignalRelay once the monitor has one: its `received` is the signal record

    def watch(self, relay: Any) -> None:
        self._relay = relay

    def mark(self) -> int:
        """The signal record's length now: take it before calling a part, hand it to `passes` after."""
        relay = self._relay
        return len(relay.received) if relay is not None else 0

    def passes(self, exc: BaseException, mark: int) -> bool:
        """True when `exc` must reach the training (re-raise it); False when it is the part's failure."""
        if isinstance(exc, Exception):
            return False
        if threading.current_thread() is not threading.main_thread():
            return False
        if self.mark() != mark:
            return True  # a signal's handler ran while the part did: what it raised is the signal's
        if isinstance(exc, (KeyboardInterrupt, SystemExit)):
            return not self._record_is_complete()
        return False

    def _record_is_complete(self) -> bool:
        """Whether every Python-level signal handler of this process goes through this monitor's relay (so a signal
        that raised would have been recorded). Only on the rare path of a KeyboardInterrupt or SystemExit."""
        relay = self._relay
        if relay is None:
            return False
        try:
            for signum in signal.valid_signals():
                handler = signal.getsignal(signum)
                ours = getattr(handler, "__self__", None) is relay
                if signum in _FRONTED and not ours:
                    return False
                if signum not in _FRONTED and callable(handler) and not ours:
                    return False  # e.g. a script's SIGUSR1 handler that calls sys.exit: nothing records it
        except (ValueError, OSError, TypeError):
            return False
        return True
