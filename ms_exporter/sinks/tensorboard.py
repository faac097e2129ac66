"""The `tensorboard` backend: TensorBoard event files through tensorboardX, written by a background thread."""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Callable, Mapping
from pathlib import Path
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


class TensorBoardWriter(Sink):
    """One scalar per step and key, the keys of the JSON Lines step records (`loss`, `learning_rate`,
    `tokens_per_second`, `step_duration_seconds`, ...), at the step's global step and wall time; evaluation results
    as `eval/<name>`. The training thread only queues; a thread hands the queue to tensorboardX every `interval`
    seconds (and at train end, on SIGTERM/SIGINT and at close), and tensorboardX writes the event file.

    Event files go to `save_dir/tensorboard/rank<r>`: `tensorboard --logdir save_dir/tensorboard` shows one run
    per rank.
    """

    name = "tensorboard"
    needs_signals = True

    def __init__(self, store: MetricStore, log_dir: Path, interval: float,
                 on_error: Callable[[str, BaseException], None], breaker: Breaker | None = None) -> None:
        from tensorboardX import SummaryWriter  # the extra: build_sinks turns its absence into a ConfigError

        self.log_dir = log_dir
        self._writer = SummaryWriter(logdir=str(log_dir), flush_secs=max(1, round(interval)))
        self._columns = StepColumns(store)
        self._queue: deque[tuple[str, Any]] = deque(maxlen=QUEUE_CAP)
        self._dropped = store.register(catalogue.DROPPED_RECORDS).series(sink=self.name)
        self._on_error = on_error
        self._breaker = breaker
        self._lock = threading.Lock()
        self._thread = PeriodicThread("ms_exporter-tensorboard", interval, self._tick, first_at_once=False)
        self._writes = 0
        self._off = False
        self._closed = False

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
                try:
                    self._writer.close()
                except Exception as exc:
                    self._on_error(self.name, exc)

    # -- the writer thread --------------------------------------------------------------------------
    def _tick(self) -> None:
        try:
            self.flush()
        except Exception as exc:  # flush() counts its own failures; this is the last guard of the thread
            self._on_error(self.name, exc)

    def flush(self) -> None:
        """Hand every queued record to tensorboardX and flush its event file."""
        with self._lock:
            if self._off or self._closed:
                return
            items = []
            while self._queue:
                items.append(self._queue.popleft())
            try:
                for kind, payload in items:
                    if kind == "step":
                        self._write_step(*payload)
                    else:
                        self._write_eval(*payload)
                self._writer.flush()
            except Exception as exc:  # a full disk, a broken writer: counted, never raised into training
                self._dropped.value += len(items)
                self._writes += 1
                if self._breaker is None:
                    self._on_error(self.name, exc)
                elif self._breaker.failed(self.name, exc, self._writes):
                    self._off = True
                    self._queue.clear()
            else:
                self._writes += 1

    def _write_step(self, sample: StepSample, keys: tuple[str, ...], values: tuple[float, ...]) -> None:
        add = self._writer.add_scalar
        step, wall_time = sample.step, sample.wall_time
        for attribute, key in _SAMPLE_SCALARS:
            value = getattr(sample, attribute)
            if value is not None:
                add(key, value, global_step=step, walltime=wall_time)
        for key, value in zip(keys, values, strict=True):
            add(key, value, global_step=step, walltime=wall_time)

    def _write_eval(self, step: int, metrics: dict[str, Any]) -> None:
        for name, value in metrics.items():
            try:
                number = float(value)
            except (TypeError, ValueError):
                continue  # a metric that is not one number (a confusion matrix): not a scalar
            self._writer.add_scalar(f"eval/{name}", number, global_step=step)
