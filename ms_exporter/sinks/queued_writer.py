"""Step writers for experiment trackers (TensorBoard, W&B): the training thread only queues; a thread writes."""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Callable, Iterator, Mapping
from typing import Any

from ms_exporter import catalogue
from ms_exporter.monitor.errors import Breaker
from ms_exporter.monitor.periodic import PeriodicThread
from ms_exporter.monitor.sample import StepSample
from ms_exporter.monitor.store import MetricStore
from ms_exporter.sinks.base import Sink
from ms_exporter.sinks.step_columns import StepColumns

QUEUE_CAP = 100_000  # records held between writes; past this the oldest are dropped (and counted)
# The sample's own per-step scalars, under the keys JSON Lines gives them.
_SAMPLE_SCALARS = (("loss", catalogue.LOSS.short), ("duration", catalogue.STEP_DURATION.short),
                   ("data_wait", catalogue.DATA_WAIT.short))


class QueuedStepWriter(Sink):
    """One scalar per step and key, the keys of the JSON Lines step records (`loss`, `learning_rate`,
    `tokens_per_second`, `step_duration_seconds`, ...), at the step's global step; evaluation results as
    `eval/<name>`. The training thread only queues; a thread hands the queue to the writer every `interval`
    seconds (and at train end, on SIGTERM/SIGINT and at close). A writer that keeps failing is switched off by the
    breaker, its records dropped and counted. Subclasses write: `_write_step`, `_write_eval`, `_flush_writer`,
    `_close_writer`; `_ready` says whether there is a writer to hand records to yet.
    """

    needs_signals = True

    def __init__(self, store: MetricStore, interval: float, on_error: Callable[[str, BaseException], None],
                 breaker: Breaker | None) -> None:
        self._columns = StepColumns(store)
        self._queue: deque[tuple[str, Any]] = deque(maxlen=QUEUE_CAP)
        self._dropped = store.register(catalogue.DROPPED_RECORDS).series(sink=self.name)
        self._on_error = on_error
        self._breaker = breaker
        self._lock = threading.Lock()
        self._thread = PeriodicThread(f"ms_exporter-{self.name}", interval, self._tick, first_at_once=False)
        self._writes = 0
        self._off = False
        self._closed = False

    # -- what a writer implements -----------------------------------------------------------------
    def _ready(self) -> bool:
        return True

    def _write_step(self, step: int, wall_time: float, scalars: dict[str, float]) -> None:
        raise NotImplementedError

    def _write_eval(self, step: int, scalars: dict[str, float]) -> None:
        raise NotImplementedError

    def _flush_writer(self) -> None:
        """Whatever the writer buffers goes to disk."""

    def _close_writer(self) -> None:
        raise NotImplementedError

    # -- the sink lifecycle --------------------------------------------------------------------------
    def start(self, step: int) -> None:
        self._thread.start()

    def on_step(self, sample: StepSample) -> None:
        if self._off:
            return
        if len(self._queue) == QUEUE_CAP:
            self._dropped.value += 1
        self._queue.append(("step", (sample, *self._columns.read())))

    def on_eval(self, step: int, metrics: Mapping[str, Any]) -> None:
        self._queue.append(("eval", (step, dict(metrics))))

    def run_ended(self, step: int) -> None:
        self._thread.stop()
        self.flush()

    def interrupted(self, signal_name: str, step: int) -> None:
        self.flush()

    def close(self) -> None:
        self._thread.stop()
        self.flush()
        with self._lock:
            if not self._closed:
                self._closed = True
                if self._ready():
                    try:
                        self._close_writer()
                    except Exception as exc:
                        self._on_error(self.name, exc)

    # -- the writer thread --------------------------------------------------------------------------
    def _tick(self) -> None:
        try:
            self.flush()
        except Exception as exc:  # flush() counts its own failures; this is the last guard of the thread
            self._on_error(self.name, exc)

    def flush(self) -> None:
        """Hand every queued record to the writer and flush it."""
        with self._lock:
            if self._off or self._closed or not self._ready():
                return
            items = []
            while self._queue:
                items.append(self._queue.popleft())
            try:
                for kind, payload in items:
                    if kind == "step":
                        sample, keys, values = payload
                        self._write_step(sample.step, sample.wall_time, dict(_step_scalars(sample, keys, values)))
                    else:
                        step, metrics = payload
                        self._write_eval(step, dict(_eval_scalars(metrics)))
                self._flush_writer()
            except Exception as exc:  # a full disk, a broken writer: counted, never raised into training
                self._failed(exc, len(items))
            else:
                self._writes += 1

    def _failed(self, exc: BaseException, records: int) -> None:
        self._dropped.value += records
        self._writes += 1
        if self._breaker is None:
            self._on_error(self.name, exc)
        elif self._breaker.failed(self.name, exc, self._writes):
            self._off = True
            self._queue.clear()


def _step_scalars(sample: StepSample, keys: tuple[str, ...], values: tuple[float, ...]) -> Iterator[tuple[str, float]]:
    for attribute, key in _SAMPLE_SCALARS:
        value = getattr(sample, attribute)
        if value is not None:
            yield key, value
    yield from zip(keys, values, strict=True)


def _eval_scalars(metrics: Mapping[str, Any]) -> Iterator[tuple[str, float]]:
    for name, value in metrics.items():
        try:
            yield f"eval/{name}", float(value)
        except (TypeError, ValueError):
            continue  # a metric that is not one number (a confusion matrix): not a scalar
