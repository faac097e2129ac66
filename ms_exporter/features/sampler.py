"""The monitor's one background thread: host memory every `interval` seconds, and the slow thresholds."""

from __future__ import annotations

from collections.abc import Callable

from ms_exporter.core.errors import Breaker, OnPartError
from ms_exporter.core.part import ThreadPart
from ms_exporter.core.periodic import PeriodicThread
from ms_exporter.probes.memory import MemoryProbe


class MemorySampler(ThreadPart):
    """Samples host RSS (psutil: no MindSpore call, which a second thread must not make during a step) and runs
    `check_slow` after each sample. Started at train begin, stopped at train end; start() twice is harmless."""

    name = "sampler"

    def __init__(
        self,
        memory: MemoryProbe,
        interval: float,
        breaker: Breaker,
        check_slow: Callable[[], None],
        on_error: OnPartError,
    ) -> None:
        self._memory = memory
        self._breaker = breaker
        self._check_slow = check_slow
        self._on_error = on_error
        self._thread = PeriodicThread("ms_exporter-sampler", interval, self._sample, first_at_once=True)
        self._tick = 0

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._thread.stop()

    def _sample(self) -> None:
        self._tick += 1
        if "memory" not in self._breaker.disabled:
            try:
                self._memory.sample_host()
            except Exception as exc:
                self._breaker.failed("memory", exc, self._tick)
        try:
            self._check_slow()
        except Exception as exc:
            self._on_error(exc)
