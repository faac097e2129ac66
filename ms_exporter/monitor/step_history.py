"""The last steps of this rank, kept in a bounded ring for the live page (`GET /`, `GET /api/series`).

The hot path appends one tuple per step to a deque with a fixed maxlen: no lock (appends and a reader's
copy are each atomic under the GIL), no formatting. Readers turn it into JSON at their own pace.
"""

from __future__ import annotations

import math
import time
from collections import deque
from collections.abc import Mapping
from typing import Any

from ms_exporter.config import Bound
from ms_exporter.monitor.breach_watch import BREACHES_METRIC, WATCHED_FAMILIES
from ms_exporter.monitor.sample import StepSample
from ms_exporter.monitor.store import MetricStore, Series

HISTORY_STEPS = 4096
# Columns after step, time, loss and step_time: (name, family, labels) of the store series read each step.
SERIES_COLUMNS = (
    ("loss_smoothed", "mindspore_train_loss_smoothed", {}),
    ("learning_rate", "mindspore_train_learning_rate", {}),
    ("tokens_per_second", "mindspore_train_tokens_per_second", {}),
    ("samples_per_second", "mindspore_train_samples_per_second", {}),
    ("grad_norm", "mindspore_train_grad_norm", {}),
    ("memory_bytes", "mindspore_train_memory_bytes", None),  # the first kind present (device, else host)
)
COLUMNS = ("step", "time", "loss", "step_time", *(name for name, _, _ in SERIES_COLUMNS), "breaches")
_MEMORY_KINDS = ("device_used", "device_reserved", "host_rss")


class StepHistory:
    """A ring of the last HISTORY_STEPS steps: (step, time, loss, step time, the SERIES_COLUMNS, breaches)."""

    def __init__(self, store: MetricStore, bounds: Mapping[str, Bound], size: int = HISTORY_STEPS) -> None:
        self._store = store
        self.bounds = {key: {bound.direction: bound.value} for key, bound in bounds.items()}
        self.rows: deque[tuple[float, ...]] = deque(maxlen=size)
        self._series: tuple[Series | None, ...] = ()
        self._breaches: tuple[Series, ...] = ()
        self._version = -1

    def record(self, sample: StepSample) -> None:
        """Hot path: one tuple into the ring."""
        if self._version != self._store.version:
            self._bind()
        breaches = 0.0
        for counter in self._breaches:
            breaches += counter.value
        self.rows.append((sample.step, sample.wall_time, _number(sample.loss), sample.duration / max(sample.steps, 1),
                          *[s.value if s is not None else math.nan for s in self._series], breaches))

    def _bind(self) -> None:
        self._version = self._store.version
        bound = []
        for _, name, labels in SERIES_COLUMNS:
            family = self._store.get(name)
            children = [c for c in family.children() if isinstance(c, Series)] if family is not None else []
            if labels is None:  # memory: prefer the device's figure, else the host's
                by_kind = {dict(c.labels).get("kind"): c for c in children}
                bound.append(next((by_kind[k] for k in _MEMORY_KINDS if k in by_kind), None))
            else:
                bound.append(next((c for c in children if not c.labels), children[0] if children else None))
        self._series = tuple(bound)
        family = self._store.get(BREACHES_METRIC)
        self._breaches = tuple(c for c in family.children() if isinstance(c, Series)) if family else ()

    def since(self, step: int, limit: int = HISTORY_STEPS) -> dict[str, Any]:
        """Rows after `step` (at most `limit`, the newest), as JSON-ready data: non-finite numbers become null."""
        rows = list(self.rows)  # one atomic copy; the training thread keeps appending to the deque
        newer = [row for row in rows if row[0] > step][-limit:]
        return {
            "columns": list(COLUMNS),
            "rows": [[_json(v) for v in row] for row in newer],
            "nonfinite_loss_steps": [int(row[0]) for row in newer if not math.isfinite(row[2])],
            "last_step": int(rows[-1][0]) if rows else None,
            "capacity": self.rows.maxlen,
            "bounds": {key: bound for key, bound in self.bounds.items() if key in _PLOTTED},
            "now": time.time(),
        }


_PLOTTED = {"loss", "loss_smoothed", "tokens_per_second", "samples_per_second", "grad_norm"} & set(WATCHED_FAMILIES)


def _number(value: float | None) -> float:
    return math.nan if value is None else value


def _json(value: float) -> float | None:
    return value if math.isfinite(value) else None
