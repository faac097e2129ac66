"""The last steps of this rank, kept in a bounded ring for the live page (`GET /`, `GET /api/series`).

The hot path appends one tuple per step to a deque with a fixed maxlen: no lock (appends and a reader's
copy are each atomic under the GIL), no formatting. Readers turn it into JSON at their own pace.
"""

from __future__ import annotations

import math
import time
from collections import deque
from collections.abc import Callable, Mapping
from typing import Any

from ms_exporter.config import Bound
from ms_exporter.core import catalogue
from ms_exporter.core.catalogue import MEMORY_IN_USE_ORDER
from ms_exporter.core.device.reading import HOST
from ms_exporter.core.sample import StepSample
from ms_exporter.core.sink import Sink
from ms_exporter.core.stall import median_cycle, stall_of
from ms_exporter.core.store import MetricStore, Series
from ms_exporter.core.thresholds import DEFAULTS

HISTORY_STEPS = 4096
# Columns after step, time, loss, step_time and data_wait (the sample's own): the store series read each step
# (the unlabelled one, else the first); memory is the first kind of MEMORY_IN_USE_ORDER present, and
# `memory_kind` in the payload names it.
SERIES_COLUMNS = (
    catalogue.LOSS_SMOOTHED,
    catalogue.LEARNING_RATE,
    catalogue.TOKENS_PER_SECOND,
    catalogue.SAMPLES_PER_SECOND,
    catalogue.GRAD_NORM,
    catalogue.MEMORY_BYTES,
)
# The hardware monitor's readings (docs/hardware.md), one column each: the highest of the rank's accelerators, else
# the host's (a CPU-only rank); `devices` in the payload names the devices a column covers.
DEVICE_COLUMNS = (catalogue.DEVICE_TEMPERATURE, catalogue.DEVICE_UTILIZATION)
COLUMNS = (
    "step",
    "time",
    "loss",
    "step_time",
    "data_wait",
    *(family.short for family in SERIES_COLUMNS),
    *(family.short for family in DEVICE_COLUMNS),
    "breaches",
)
_TIME, _SMOOTHED = 1, 5  # indices of the step's end time and of loss_smoothed in a row


class StepHistory(Sink):
    """A ring of the last HISTORY_STEPS steps: (step, time, loss, step time, the SERIES_COLUMNS, breaches).

    A sink of the `prometheus` backend: its endpoint serves the ring.
    """

    name = "prometheus"

    def __init__(
        self,
        store: MetricStore,
        bounds: Mapping[str, Bound],
        size: int = HISTORY_STEPS,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self._store = store
        self._clock = clock  # wall-clock seconds: the payload's `now`, and the stall's age
        self.bounds = {key: {bound.direction: bound.value} for key, bound in bounds.items()}
        # A row's loss is None where the step's outputs held no readable loss (no number, and not a non-finite one).
        self.rows: deque[tuple[float | None, ...]] = deque(maxlen=size)
        self.capacity = size
        self._series: tuple[Series | None, ...] = ()
        self._devices: tuple[tuple[Series, ...], ...] = ()  # per DEVICE_COLUMNS, the series its column is the max of
        self.devices: dict[str, str] = {}  # DEVICE_COLUMNS short name -> the devices it covers ("gpu0, gpu1", "host")
        self._breaches: tuple[tuple[Series, str], ...] = ()  # each breach counter with its `metric` label
        self._version = -1
        self.memory_kind: str | None = None
        # (step, metric) where a breach episode began: the page marks it on that metric's chart only.
        self.breach_events: deque[tuple[int, str]] = deque(maxlen=size)
        self._breach_counts: dict[str, float] = {}

    def on_step(self, sample: StepSample) -> None:
        """Hot path: one tuple into the ring."""
        if self._version != self._store.version:
            self._bind()
        breaches = 0.0
        counts = self._breach_counts
        for counter, metric in self._breaches:
            value = counter.value
            breaches += value
            if value > counts.get(metric, 0.0):  # a new episode of this metric
                self.breach_events.append((sample.step, metric))
            counts[metric] = value
        loss = sample.loss
        row: list[float | None] = [
            sample.step,
            sample.wall_time,
            loss,
            sample.duration / max(sample.steps, 1),
            _number(sample.data_wait),
            *[s.value if s is not None else math.nan for s in self._series],
            *[_highest(group) for group in self._devices],
            breaches,
        ]
        if loss is not None and not math.isfinite(loss):
            row[_SMOOTHED] = math.nan  # the smoothed loss of a NaN step is no loss: a gap, not a flat line
        self.rows.append(tuple(row))

    def _bind(self) -> None:
        self._version = self._store.version
        bound: list[Series | None] = []
        for family in SERIES_COLUMNS:
            children = self._store.series_of(family)
            if family is catalogue.MEMORY_BYTES:
                by_kind = {dict(c.labels).get("kind"): c for c in children}
                self.memory_kind = next((kind for kind in MEMORY_IN_USE_ORDER if kind in by_kind), None)
                bound.append(by_kind.get(self.memory_kind))
            else:
                bound.append(children[0] if children else None)
        self._series = tuple(bound)
        groups: list[tuple[Series, ...]] = []
        names: dict[str, str] = {}
        for family in DEVICE_COLUMNS:
            children = self._store.series_of(family)
            accelerators = tuple(c for c in children if dict(c.labels).get("device") != HOST)
            group = accelerators or tuple(c for c in children if dict(c.labels).get("device") == HOST)
            groups.append(group)
            if group:
                names[family.short] = ", ".join(dict(c.labels)["device"] for c in group)
        self._devices, self.devices = tuple(groups), names
        self._breaches = tuple(
            (counter, dict(counter.labels)["metric"]) for counter in self._store.series_of(catalogue.BREACHES)
        )

    def since(self, step: int, limit: int = HISTORY_STEPS) -> dict[str, Any]:
        """Rows after `step` (at most `limit`, the newest), as JSON-ready data: non-finite numbers become null."""
        rows = list(self.rows)  # one atomic copy; the training thread keeps appending to the deque
        now, phase = self._clock(), self._phase()
        newer = [row for row in rows if _step(row) > step][-limit:]
        return {
            "columns": list(COLUMNS),
            "rows": [[_json(v) for v in row] for row in newer],
            "nonfinite_loss_steps": [_step(row) for row in newer if _nonfinite(row[2])],
            # The newest step's loss as the page's headline says it: a number, "NaN", "Inf" or "-Inf", null unread.
            "last_loss": _loss_text(rows[-1][2]) if rows else None,
            "breach_events": [
                [event_step, metric] for event_step, metric in list(self.breach_events) if event_step > step
            ],
            "last_step": _step(rows[-1]) if rows else None,
            "capacity": self.capacity,
            "memory_kind": self.memory_kind,
            "devices": dict(self.devices),
            "bounds": {key: bound for key, bound in self.bounds.items() if key in _PLOTTED} | self._device_hot(),
            "now": now,
            **phase,
            "stall": _stall(rows, now, phase),
        }

    def _device_hot(self) -> dict[str, dict[str, float]]:
        """MindSporeTrainingDeviceHot's threshold on the temperature chart, where it shows accelerators (a host
        CPU's thermal limits are its own)."""
        shown = self.devices.get(catalogue.DEVICE_TEMPERATURE.short)
        if shown is None or shown == HOST:
            return {}
        return {catalogue.DEVICE_TEMPERATURE.short: {"max": DEFAULTS.device_hot_celsius}}

    def _phase(self) -> dict[str, Any]:
        """Where the rank is now and for how long, and how long that phase may last (docs/hangs.md)."""
        phase = next((dict(s.labels)["phase"] for s in self._store.series_of(catalogue.PHASE) if s.value == 1), None)
        return {
            "phase": phase,
            "phase_seconds": _json(self._store.value_of(catalogue.PHASE_SECONDS)),
            "hang_deadline": _json(self._store.value_of(catalogue.HANG_DEADLINE)),
        }


# Bounds drawn on the live page's charts (memory growth has no chart of its own).
_PLOTTED = frozenset({"loss", "loss_smoothed", "tokens_per_second", "samples_per_second", "grad_norm"})


def _stall(rows: list[tuple[float | None, ...]], now: float, phase: dict[str, Any]) -> dict[str, Any] | None:
    """The page's stall banner (ms_exporter/core/stall.py, `top`'s rule): from the rows' step end times."""
    times = [row[_TIME] for row in rows]
    last = times[-1] if times else None
    verdict = stall_of(
        None if last is None else max(0.0, now - last),
        phase["phase"],
        median_cycle(times),
        phase["phase_seconds"],
        phase["hang_deadline"],
        ended=phase["phase"] == catalogue.ENDED,
    )
    if verdict is None:
        return None
    return {
        "seconds": verdict.seconds,
        "past_deadline": verdict.past_deadline,
        "deadline": verdict.deadline,
        "phase_seconds": verdict.phase_seconds,
    }


def _highest(group: tuple[Series, ...]) -> float:
    """The highest value of the group; NaN while none was read (the step path: no allocation)."""
    highest = math.nan
    for series in group:
        value = series.value
        if value > highest or highest != highest:  # NaN to start with: the first value wins
            highest = value
    return highest


def _number(value: float | None) -> float:
    return math.nan if value is None else value


def _json(value: float | None) -> float | None:
    return value if value is not None and math.isfinite(value) else None


def _step(row: tuple[float | None, ...]) -> int:
    return int(row[0] or 0)  # never None: the sample's step


def _nonfinite(loss: float | None) -> bool:
    return loss is not None and not math.isfinite(loss)


def _loss_text(loss: float | None) -> float | str | None:
    if loss is None or math.isfinite(loss):
        return loss
    return "NaN" if math.isnan(loss) else "Inf" if loss > 0 else "-Inf"
