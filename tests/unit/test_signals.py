"""The signal relay: a process forked from the training process starts with the handlers it would have had."""

from __future__ import annotations

import os
import signal

from ms_exporter.features.signals import SignalRelay


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
