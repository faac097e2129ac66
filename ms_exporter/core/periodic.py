"""A daemon thread that calls one function every few seconds until stopped: the sampler's and the watchdog's loop."""

from __future__ import annotations

import threading
from collections.abc import Callable


class PeriodicThread:
    """Calls `tick()` every `every` seconds (at once on start when `first_at_once`); start() twice is harmless,
    stop() joins for at most 5 s. `tick` must not raise: its owner catches what it can fail with."""

    def __init__(self, name: str, every: float, tick: Callable[[], None], first_at_once: bool) -> None:
        self._name = name
        self._every = every
        self._tick = tick
        self._first_at_once = first_at_once
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        if self._thread is not None and self._thread.is_alive():
            return
        self._stop.clear()
        self._thread = threading.Thread(target=self._loop, name=self._name, daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(5.0)
            self._thread = None

    def _loop(self) -> None:
        if self._first_at_once:
            self._tick()
        while not self._stop.wait(self._every):
            self._tick()
