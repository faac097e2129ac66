"""Step writers for experiment trackers (TensorBoard, W&B): the training thread only queues; a thread writes."""

from __future__ import annotations

import contextlib
import logging
import os
import select
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator, Mapping
from typing import Any

from ms_exporter.core import catalogue
from ms_exporter.core.compat import zip_strict
from ms_exporter.core.errors import Breaker, OnError
from ms_exporter.core.part import PartContext
from ms_exporter.core.sample import StepSample
from ms_exporter.core.sink import Sink
from ms_exporter.core.store import MetricStore
from ms_exporter.sinks.jsonl import MAX_UNWRITTEN_SECONDS
from ms_exporter.sinks.shared.step_columns import StepColumns

logger = logging.getLogger("ms_exporter")

QUEUE_CAP = 100_000  # records held between writes; past this the oldest are dropped (and counted)
# The longest train end, a SIGTERM/SIGINT or close() waits for the writer thread to finish a write. A writer
# still busy after that is stuck (a disk that does not answer, a library blocked on its own dead thread): its
# records are counted as lost and the backend is switched off, so the training script never waits on it.
WAIT_SECONDS = 10.0
_POLL_SECONDS = 0.01  # how often a bounded wait looks again (no lock: it may run inside a signal handler)
# The sample's own per-step scalars, under the keys JSON Lines gives them.
_SAMPLE_SCALARS = (
    ("loss", catalogue.LOSS.short),
    ("duration", catalogue.STEP_DURATION.short),
    ("data_wait", catalogue.DATA_WAIT.short),
)


class QueuedStepWriter(Sink):
    """One scalar per step and key, the keys of the JSON Lines step records (`loss`, `learning_rate`,
    `tokens_per_second`, `step_duration_seconds`, ...), at the step's global step; evaluation results as
    `eval/<name>`.

    The training thread only queues. Only the writer thread calls the writer (the library), every `interval`
    seconds but at least every MAX_UNWRITTEN_SECONDS (a `kill -9` loses no more than JSON Lines does), and when
    asked: train end, SIGTERM/SIGINT and close() wake it and wait for it at most WAIT_SECONDS,
    without taking a lock (a signal handler may interrupt the training thread anywhere). A writer that keeps
    failing is switched off by the breaker; one that does not return within WAIT_SECONDS is switched off at once;
    either way its records are counted in `mindspore_exporter_dropped_samples_total{sink}`.
    Subclasses write: `_write_step`, `_write_eval`, `_flush_writer`, `_close_writer`; `_ready` says whether there
    is a writer to hand records to yet.
    """

    needs_signals = True

    def __init__(self, store: MetricStore, interval: float, on_error: OnError, breaker: Breaker | None) -> None:
        self._columns = self._step_columns(store)
        self._queue: deque[tuple[str, Any]] = deque(maxlen=QUEUE_CAP)
        self._dropped = store.register(catalogue.DROPPED_RECORDS).series(sink=self.name)
        self._disabled = store.register(catalogue.COMPONENT_DISABLED)
        self._on_error = on_error
        self._breaker = breaker
        self._interval = interval
        self._thread: threading.Thread | None = None
        # The thread sleeps in poll() on this pipe; a byte written to it wakes the thread. os.write takes no lock,
        # so a signal handler can wake the thread whatever the training thread was doing when it was interrupted.
        self._wake_read, self._wake_write = os.pipe()
        os.set_blocking(self._wake_read, False)
        os.set_blocking(self._wake_write, False)
        self._asked = 0  # flush requests made (the training thread, signal handlers)
        self._done = 0  # the newest request a finished write pass covered (written by the writer thread only)
        self._in_flight = 0  # records the writer thread holds in the pass it is in
        self._closing = False
        self._writer_closed = False
        self._writes = 0
        self._off = False
        self.fall_back: Callable[[str], None] | None = None  # PartContext.fall_back, set by the builder

    # -- what a writer implements -----------------------------------------------------------------
    def _step_columns(self, store: MetricStore) -> StepColumns:
        """The series each step record carries, and their keys."""
        return StepColumns(store)

    def _write_histograms(self, step: int, wall_time: float, arrays: list[tuple[str, Any]]) -> None:
        """(tag, what the training thread measured of a tensor's distribution: for TensorBoard a row of
        device_reductions.histograms) pairs the writer records."""

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

    def _before_pass(self) -> None:
        """Raise (an OSError) when this batch cannot be written: it is then counted as lost."""

    def _abandon(self) -> None:
        """A write pass failed: forget what the writer holds of it (those records are counted as lost)."""

    # -- the sink lifecycle --------------------------------------------------------------------------
    def on_train_begin(self, cb_params: Any) -> None:
        self._start_thread()

    def on_step(self, sample: StepSample) -> None:
        if self._off:
            return
        if len(self._queue) == QUEUE_CAP:
            self._dropped.value += 1
        self._queue.append(("step", (sample, *self._columns.read())))

    def on_eval(self, step: int, metrics: Mapping[str, Any]) -> None:
        if not self._off:
            self._queue.append(("eval", (step, dict(metrics))))

    def _queue_histograms(self, step: int, wall_time: float, arrays: list[tuple[str, Any]]) -> None:
        """Hand histograms, reduced on the training thread, to the writer thread (`_write_histograms`)."""
        if self._off:
            return
        if len(self._queue) == QUEUE_CAP:
            self._dropped.value += 1
        self._queue.append(("histograms", (step, wall_time, arrays)))

    def on_train_end(self, step: int, completed: bool = True) -> None:
        self.flush()

    def on_signal(self, signal_name: str, step: int) -> None:
        self.flush()

    def close(self) -> None:
        """Write what is queued and close the writer, on the writer thread; returns within WAIT_SECONDS."""
        if self._closing:
            return
        self._closing = True
        if self._thread is None:  # never started: nothing was handed to a writer
            self._count_lost(len(self._queue))
            self._queue.clear()
            self._close_on_this_thread()
            self._close_pipe()
            return
        self._wake()
        self._wait(lambda: self._writer_closed, "close")
        if self._writer_closed:
            self._thread.join(1.0)  # it returns right after closing the writer
        if not self._thread.is_alive():  # a stuck thread keeps its pipe: its descriptors are never reused
            self._close_on_this_thread()  # a thread that died before closing the writer
            self._close_pipe()

    def flush(self) -> None:
        """Have the writer thread write everything queued now; wait for it at most WAIT_SECONDS."""
        if self._off or self._closing:
            return
        self._start_thread()
        self._asked += 1
        ticket = self._asked
        self._wake()
        self._wait(lambda: self._done >= ticket, "write")

    # -- the training thread's side: wake, and wait with a bound ---------------------------------------
    def _start_thread(self) -> None:
        if self._thread is None and not self._closing:
            self._thread = threading.Thread(target=self._loop, name=f"ms_exporter-{self.name}", daemon=True)
            self._thread.start()

    def _wake(self) -> None:
        with contextlib.suppress(OSError):  # a full pipe already holds a wake-up
            os.write(self._wake_write, b"\0")

    def _wait(self, finished: Callable[[], bool], what: str) -> None:
        deadline = time.monotonic() + WAIT_SECONDS
        thread = self._thread
        while not finished():
            if self._off and what == "write":
                return
            if time.monotonic() >= deadline or thread is None or not thread.is_alive():
                if not finished():
                    self._give_up(what)
                return
            time.sleep(_POLL_SECONDS)

    def _give_up(self, what: str) -> None:
        """The writer thread did not finish within WAIT_SECONDS: what it holds and what is queued is lost."""
        if self._off:
            return
        self._off = True
        lost = self._in_flight + len(self._queue)
        self._queue.clear()
        self._count_lost(lost)
        with contextlib.suppress(Exception):
            self._disabled.series(component=self.name).value = 1
        self._on_error(
            self.name,
            TimeoutError(
                f"the {self.name} writer did not finish a {what} within {WAIT_SECONDS:.0f} s (a disk that does not "
                f"answer, or a library stuck on its own writer); switched off, {lost} records counted as lost"
            ),
        )
        logger.error(
            "ms_exporter: the %s writer is stuck; it is switched off for the rest of this process and "
            "%d records are counted in %s; training continues",
            self.name,
            lost,
            catalogue.DROPPED_RECORDS.name,
        )
        self._ask_for_json_lines()

    def _count_lost(self, records: int) -> None:
        if records:
            self._dropped.value += records

    # -- the writer thread ----------------------------------------------------------------------------
    def _loop(self) -> None:
        poller = select.poll()
        poller.register(self._wake_read, select.POLLIN)
        try:
            while True:
                ticket = self._asked
                self._pass()
                self._done = ticket
                if self._closing:
                    self._close_on_this_thread()
                    return
                poller.poll(min(self._interval, MAX_UNWRITTEN_SECONDS) * 1000)
                with contextlib.suppress(OSError):
                    os.read(self._wake_read, 4096)
        except Exception as exc:  # the last guard of the thread; a waiter then sees it gone and gives up
            self._on_error(self.name, exc)

    def _pass(self) -> None:
        """Hand every queued record to the writer and flush it; failures counted, never raised."""
        if self._off:
            self._queue.clear()
            return
        if not self._queue or not self._ready():
            return
        items = []
        while self._queue:
            items.append(self._queue.popleft())
        self._in_flight = len(items)
        try:
            self._before_pass()
            for kind, payload in items:
                if kind == "step":
                    sample, keys, values = payload
                    self._write_step(sample.step, sample.wall_time, dict(_step_scalars(sample, keys, values)))
                elif kind == "histograms":
                    self._write_histograms(*payload)
                else:
                    step, metrics = payload
                    self._write_eval(step, dict(_eval_scalars(metrics)))
            self._flush_writer()
        except Exception as exc:  # a full disk, a broken writer: counted, never raised into training
            self._in_flight = 0
            self._abandon()
            if not self._off:  # a waiter that gave up on this pass counted it already
                self._failed(exc, len(items))
        else:
            self._in_flight = 0
            self._writes += 1

    def _failed(self, exc: BaseException, records: int) -> None:
        self._count_lost(records)
        self._writes += 1
        if self._breaker is None:
            self._on_error(self.name, exc)
        elif self._breaker.failed(self.name, exc, self._writes):
            self._off = True
            self._count_lost(len(self._queue))
            self._queue.clear()
            self._ask_for_json_lines()

    def _ask_for_json_lines(self) -> None:
        if self.fall_back is not None:
            try:
                self.fall_back(self.name)
            except Exception as exc:  # the fallback must not reach the writer thread's caller either
                self._on_error(self.name, exc)

    def _close_on_this_thread(self) -> None:
        if not self._writer_closed:
            try:
                if self._ready():
                    self._close_writer()
            except Exception as exc:
                self._on_error(self.name, exc)
            finally:
                self._writer_closed = True

    def _close_pipe(self) -> None:
        for fd in (self._wake_read, self._wake_write):
            with contextlib.suppress(OSError):
                os.close(fd)
        self._wake_read = self._wake_write = -1


def writer_could_not_start(context: PartContext, component: str, exc: Exception) -> list[Sink]:
    """A tracker's writer that cannot start (a read-only save_dir, a library that breaks on setup): counted under its
    component, and the run's step records go to JSON Lines instead (monitor/writer_fallback.py). No sink is built."""
    context.on_error(component, exc)
    if context.fall_back is not None:
        context.fall_back(component)
    return []


def _step_scalars(sample: StepSample, keys: tuple[str, ...], values: tuple[float, ...]) -> Iterator[tuple[str, float]]:
    for attribute, key in _SAMPLE_SCALARS:
        value = getattr(sample, attribute)
        if value is not None:
            yield key, value
    yield from zip_strict(keys, values)


def _eval_scalars(metrics: Mapping[str, Any]) -> Iterator[tuple[str, float]]:
    for name, value in metrics.items():
        try:
            yield f"eval/{name}", float(value)
        except (TypeError, ValueError):
            continue  # a metric that is not one number (a confusion matrix): not a scalar
