"""The monitor's one background thread: host memory every `interval` seconds, and the slow thresholds."""

from __future__ import annotations

import threading
from collections.abc import Callable

from ms_exporter.monitor.errors import Breaker
from ms_exporter.probes.memory import MemoryProbe


class MemorySampler:
    """Samples host RSS (psutil: no MindSpore call, which a second thread must not make during a step) and runs
    `check_slow` after each sample. Started at train begin, stopped at train end; start() twice is harmless."""

    def __init__(self, memory: MemoryProbe, interval: float, breaker: Breaker,
                 check_slow: Callable[[], None], on_error: Callable[[BaseException], None]) -> None:
        self._memory = memory
        self._interval = interval
        self._breaker = breaker
        self._check_slow = check_slow
        self._on_error = on_error
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        if self._thread is not None and self._thread.is_alive():
            return
        self._stop.clear()
        self._thread = threading.Thread(target=self._loop, name="ms_exporter-sampler", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(5.0)
            self._thread = None

    def _loop(self) -> None:
        tick = 0
        while True:
            tick += 1
            if "memory" not in self._breaker.disabled:
                try:
                    self._memory.sample_host()
                except Exception as exc:
                    self._breaker.failed("memory", exc, tick)
            try:
                self._check_slow()
            except Exception as exc:
                self._on_error(exc)
            if self._stop.wait(self._interval):
                return
