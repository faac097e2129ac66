"""The endpoint's work budget: a token bucket that bounds what requests may take from the training process."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

# What one token buys: the CPU time of a plain request (a cached /metrics page costs ~0.1-0.3 ms of Python, a
# new render ~2 ms, the live page's whole history ~30 ms). A request pays one token before it is read and, once
# answered, a token more for each further REQUEST_SECONDS of CPU its answer took.
REQUEST_SECONDS = 0.001
# At most this many tokens more for one answer: the charge bounds what a flood of expensive requests takes, and
# the cap bounds how long one expensive answer makes the clients queued behind it wait (~0.5 s at 20 a second).
MAX_CHARGE = 10.0


class RequestBudget:
    """`rate` tokens a second, bursts of up to a second's worth. A request over budget waits (holding nothing)
    before it is read, so a flood is served at `rate` with growing latency instead of taking more of the training
    process's CPU and GIL; and an expensive answer is paid for by the requests after it."""

    def __init__(
        self, rate: float, clock: Callable[[], float] = time.monotonic, sleep: Callable[[float], None] = time.sleep
    ) -> None:
        self.rate = rate
        self._burst = max(rate, 1.0)
        self._tokens = self._burst
        self._clock = clock
        self._sleep = sleep
        self._updated = clock()
        self._lock = threading.Lock()

    def reserve(self, tokens: float = 1.0) -> float:
        """Take `tokens` now; the seconds to wait before using them (0 within budget)."""
        with self._lock:
            now = self._clock()
            self._tokens = min(self._burst, self._tokens + (now - self._updated) * self.rate)
            self._updated = now
            self._tokens -= tokens  # below zero it is a reservation that the wait pays for
            return -self._tokens / self.rate if self._tokens < 0 else 0.0

    def wait(self) -> None:
        """reserve() one token and sleep what it says (a thread's way; the server's loop awaits instead)."""
        delay = self.reserve()
        if delay > 0:
            self._sleep(delay)

    def charge(self, cpu_seconds: float) -> None:
        """An answer took `cpu_seconds`: the tokens past the one paid up front are owed by later requests."""
        extra = min(cpu_seconds / REQUEST_SECONDS - 1.0, MAX_CHARGE)
        if extra > 0:
            with self._lock:
                self._tokens -= extra
