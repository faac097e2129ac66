"""Memory by kind (host RSS, device allocated/reserved/peak) and how it grows; sampled off the hot path."""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable

import psutil

from ms_exporter.config import MonitorConfig
from ms_exporter.core import catalogue
from ms_exporter.core.part import PartContext
from ms_exporter.core.probe import Probe
from ms_exporter.core.registry import ProbeEntry
from ms_exporter.core.sample import StepSample
from ms_exporter.core.store import MetricStore, Series

MIB = 1024 * 1024


def _device_readers() -> dict[str, Callable[[], int]]:
    """MindSpore's runtime memory API for Ascend/GPU; a kind that never reported a value is not exported.

    On CPU the API is documented to return 0, and calling it also surfaces errors pending from other
    MindSpore calls in this thread's place: it is not called at all there.
    """
    try:
        import mindspore
        from mindspore import runtime

        if str(mindspore.get_context("device_target")).upper() == "CPU":
            return {}
    except Exception:
        return {}
    readers = {}
    for kind, attr in (
        ("device_allocated", "memory_allocated"),
        ("device_reserved", "memory_reserved"),
        ("device_peak", "max_memory_allocated"),
    ):
        func = getattr(runtime, attr, None)
        if callable(func):
            readers[kind] = func
    return readers


class _KindState:
    """Growth bookkeeping for one memory kind."""

    def __init__(self, store_series: dict[str, Series], window: int) -> None:
        self.series = store_series
        self.baseline: float | None = None
        self.previous: float | None = None
        self.points: deque[tuple[float, float]] = deque(maxlen=window)


class MemoryProbe(Probe):
    """Host memory is sampled every `interval` seconds by the monitor's sampler thread (psutil, no MindSpore call).
    Device memory is read through MindSpore, so only on the training thread: when a publication finds `interval`
    seconds gone since the last read (MindSpore called from a second thread while a step runs can deadlock).

    The growth baseline is the first sample after `warmup_steps` steps, so graph compilation and the
    first allocations do not count as growth.

    | name | type | labels | unit |
    |---|---|---|---|
    | mindspore_train_memory_bytes | gauge | kind | bytes |
    | mindspore_train_memory_growth_ratio | gauge | kind | ratio (0.3 = 30% above baseline) |
    | mindspore_train_memory_growth_bytes_per_second | gauge | kind | bytes/s (least-squares slope) |
    | mindspore_train_memory_consecutive_increases | gauge | kind | samples that grew by > 1 MiB in a row |
    """

    name = "memory"

    def __init__(
        self,
        store: MetricStore,
        warmup_steps: int,
        window: int,
        interval: float,
        device_readers: dict[str, Callable[[], int]] | None = None,
    ) -> None:
        self._bytes = store.register(catalogue.MEMORY_BYTES)
        self._ratio = store.register(catalogue.MEMORY_GROWTH_RATIO)
        self._slope = store.register(catalogue.MEMORY_GROWTH_RATE)
        self._increases = store.register(catalogue.MEMORY_RISING)
        self._warmup_steps = warmup_steps
        self._window = window
        self._process = psutil.Process()
        self._device = _device_readers() if device_readers is None else device_readers
        self._kinds: dict[str, _KindState] = {}
        self._steps_seen = 0
        self._interval = interval
        self._next_device_read = 0.0

    def on_step(self, sample: StepSample) -> None:
        self._steps_seen += sample.steps
        if self._device:
            now = time.monotonic()
            if now >= self._next_device_read:
                self._next_device_read = now + self._interval
                self.sample_device(now)

    def sample_host(self) -> None:
        """One host sample; called from the sampler thread."""
        self._record(
            "host_rss", float(self._process.memory_info().rss), time.monotonic(), self._steps_seen >= self._warmup_steps
        )

    def sample_device(self, now: float) -> None:
        """One device sample; called on the training thread (from on_step)."""
        warmed_up = self._steps_seen >= self._warmup_steps
        for kind, read in self._device.items():
            value = float(read())
            if value > 0 or kind in self._kinds:
                self._record(kind, value, now, warmed_up)

    def _record(self, kind: str, value: float, now: float, warmed_up: bool) -> None:
        state = self._kinds.get(kind)
        if state is None:
            state = _KindState({"bytes": self._bytes.series(kind=kind)}, self._window)
            self._kinds[kind] = state
        state.series["bytes"].value = value
        state.points.append((now, value))
        if warmed_up and state.baseline is None and value > 0:
            state.baseline = value
            state.series["ratio"] = self._ratio.series(kind=kind)
            state.series["slope"] = self._slope.series(kind=kind)
            state.series["increases"] = self._increases.series(kind=kind)
        if state.baseline is not None:
            state.series["ratio"].value = (value - state.baseline) / state.baseline
            state.series["slope"].value = _slope(state.points)
            grew = state.previous is not None and value - state.previous > MIB
            state.series["increases"].value = state.series["increases"].value + 1 if grew else 0
        state.previous = value


def _slope(points: deque[tuple[float, float]]) -> float:
    """Least-squares slope of value over time; 0 until there are two points."""
    n = len(points)
    if n < 2:
        return 0.0
    mean_t = sum(t for t, _ in points) / n
    mean_v = sum(v for _, v in points) / n
    var = sum((t - mean_t) ** 2 for t, _ in points)
    if var == 0:
        return 0.0
    return sum((t - mean_t) * (v - mean_v) for t, v in points) / var


def build(context: PartContext) -> list[Probe]:
    config: MonitorConfig = context.config
    return [MemoryProbe(context.store, config.warmup_steps, config.memory_window, config.memory_interval)]


PART = ProbeEntry("memory", build, ("memory_usage",), order=160)
