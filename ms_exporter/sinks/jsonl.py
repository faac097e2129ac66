"""The `local` backend: JSON Lines per rank, written and flushed by a background thread, rotated by size."""

from __future__ import annotations

import json
import logging
import math
import os
import stat
import threading
import time
from collections import deque
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from ms_exporter.config import ConfigError
from ms_exporter.config.run_identity import run_id_of
from ms_exporter.core import catalogue
from ms_exporter.core.cb_params import step_of
from ms_exporter.core.compat import zip_strict
from ms_exporter.core.errors import OnError
from ms_exporter.core.files import run_lock
from ms_exporter.core.files.safe_files import UnsafeFile, append_whole, make_dir, open_append
from ms_exporter.core.part import PartContext
from ms_exporter.core.registry import BackendEntry
from ms_exporter.core.sample import StepSample
from ms_exporter.core.sink import Sink
from ms_exporter.core.store import HistogramSeries, MetricStore, Series
from ms_exporter.sinks.shared.step_columns import StepColumns

logger = logging.getLogger("ms_exporter")

QUEUE_CAP = 100_000  # step records held between flushes; older ones are dropped (and counted) past this
FLUSH_AT = 5_000  # a backlog this long wakes the writer before its interval: bounds memory on fast steps
# Queued records reach the file at least this often, whatever `interval` (30 s by default) says: a `kill -9` loses
# at most these seconds of records. The snapshot line still comes every `interval`. The writer thread does the
# writing; the step path only appends to the queue, as before.
MAX_UNWRITTEN_SECONDS = 5.0
# After a failed write (a full disk, a link planted at the name) the writer thread tries again after its usual
# pause (min(interval, MAX_UNWRITTEN_SECONDS)), doubled at each failure in a row up to RETRY_MAX_SECONDS: a disk that
# was full for an hour costs a few dozen cheap failed writes, and the file is written again within a minute of space
# coming back. The writer is never switched off: what it could not write is counted in
# mindspore_exporter_dropped_samples_total{sink="local"}.
RETRY_MAX_SECONDS = 60.0
STEP_FIELDS = ("step", "epoch", "steps", "loss", "duration", "data_wait", "samples", "tokens", "wall_time")
_FIELD_NAMES = {"duration": catalogue.STEP_DURATION.short, "data_wait": catalogue.DATA_WAIT.short, "wall_time": "time"}


def _json_number(value: float | int | None) -> float | int | str | None:
    """Strict JSON has no NaN/Inf: write them as the strings "NaN", "Inf", "-Inf"."""
    if isinstance(value, float) and not math.isfinite(value):
        return "NaN" if math.isnan(value) else ("Inf" if value > 0 else "-Inf")
    return value


def series_key(family_name: str, series: Series | HistogramSeries) -> str:
    return catalogue.jsonl_key(family_name, series.labels)


# The JSON Lines files open writers of this process hold: two monitors appending to one file would interleave
# their records and rotate each other's files.
_CLAIMED: set[Path] = set()
_CLAIMED_LOCK = threading.Lock()


def _claim(path: Path) -> None:
    with _CLAIMED_LOCK:
        resolved = path.resolve()
        if resolved in _CLAIMED:
            raise ConfigError(
                [
                    f"monitor_config.save_dir: {path} is already written by another TrainingMonitor of "
                    "this process; give each monitor a save_dir of its own, or close() the other first"
                ]
            )
        _CLAIMED.add(resolved)


def _release(path: Path) -> None:
    with _CLAIMED_LOCK:
        _CLAIMED.discard(path.resolve())


class JsonlWriter(Sink):
    """Hot path: `on_step()` appends to a bounded deque. The thread drains it every `interval` seconds (at least
    every MAX_UNWRITTEN_SECONDS).

    Lines: {"type": "step", ...} per step, with the sample's own fields and the catalogue's JSONL_STEP_COLUMNS
    (one key per series, e.g. `learning_rate`, `learning_rate{group="1"}`); {"type": "snapshot", "metrics": {...}}
    with every series at each flush; {"type": "event", "event": ...} for train begin/end, evaluations, signals.

    A batch that cannot be written (a full disk) is counted, record by record, in
    `mindspore_exporter_dropped_samples_total{sink="local"}` and as one error of `local`; the thread tries again
    after a back-off (its usual pause, doubling up to RETRY_MAX_SECONDS) with what was queued meanwhile, so the
    file picks up again once the disk has room. Queue overflow is counted the same way.
    """

    name = "local"
    needs_signals = True

    def __init__(
        self,
        store: MetricStore,
        save_dir: str,
        rank: int,
        project: str,
        interval: float,
        max_file_mb: float,
        max_files: int,
        on_error: OnError,
        name: str = "metrics",
        run: str | None = None,
    ) -> None:
        self._store = store
        self._rank_claim = run_lock.claim(save_dir, rank)  # another process on this save_dir and rank: `-pid<pid>`
        self.path = Path(save_dir) / f"{name}-rank{rank}{self._rank_claim.suffix}.jsonl"
        _claim(self.path)
        # Every record says whose it is: runs that share a save_dir (and so this file) stay apart in the report.
        self._identity = {"rank": rank, "project": project, **({"run": run} if run is not None else {})}
        self._interval = interval
        self._max_bytes = int(max_file_mb * 1024 * 1024)
        self._max_files = max_files
        self._queue: deque[tuple[str, Any]] = deque(maxlen=QUEUE_CAP)
        self._dropped = store.register(catalogue.DROPPED_RECORDS).series(sink="local")
        self._fd: int | None = None
        # One flush at a time (the thread, train end, signal handlers); re-entrant because a signal handler may
        # interrupt the training thread while it is itself flushing at train end.
        self._lock = threading.RLock()
        self._wake = threading.Event()
        self._stopping = False
        self._thread: threading.Thread | None = None
        self._on_error = on_error
        self._failures = 0  # failed writes in a row
        self._lost_while_failing = 0  # records counted as lost since the last write that worked
        self._retry_at = 0.0  # monotonic time before which the writer thread does not try again
        self._columns = StepColumns(store)

    @property
    def records_path(self) -> str | None:
        return str(self.path)

    # -- the sink lifecycle --------------------------------------------------------------------------
    def on_train_begin(self, cb_params: Any) -> None:
        step = step_of(cb_params)
        self.record_event("train_begin", step=step)
        self._start_thread()

    def start(self) -> None:
        """Start writing in the middle of a run (a fallback for another writer: monitor/writer_fallback.py)."""
        self._start_thread()

    def on_step(self, sample: StepSample) -> None:
        self.record_step(sample, *self._columns.read())

    def on_eval(self, step: int, metrics: Mapping[str, Any]) -> None:
        self.record_event("eval", step=step, metrics={str(k): _plain(v) for k, v in metrics.items()})

    def on_action(self, step: int, action: str, details: Mapping[str, Any]) -> None:
        self.record_event("action", step=step, action=action, **{str(k): _plain(v) for k, v in details.items()})

    def on_train_end(self, step: int, completed: bool = True) -> None:
        self.record_event("train_end", step=step)
        self.stop()

    def on_signal(self, signal_name: str, step: int) -> None:
        self.record_event("signal", signal=signal_name, step=step)
        self.flush()

    # -- training thread -----------------------------------------------------------------------------
    def record_step(self, sample: StepSample, keys: tuple[str, ...], values: tuple[float, ...]) -> None:
        queue = self._queue
        backlog = len(queue)
        if backlog >= FLUSH_AT:
            if backlog == QUEUE_CAP:
                self._dropped.value += 1
            if not self._failures and not self._wake.is_set():  # a failing writer waits for its retry time
                self._wake.set()
        queue.append(("step", (sample, keys, values)))

    def record_event(self, event: str, **fields: Any) -> None:
        if len(self._queue) == QUEUE_CAP:
            self._dropped.value += 1
        self._queue.append(("event", {"event": event, "time": time.time(), **fields}))

    # -- the writer thread ----------------------------------------------------------------------------
    def _start_thread(self) -> None:
        if self._thread is not None and self._thread.is_alive():
            return
        self._stopping = False
        self._wake.clear()
        self._thread = threading.Thread(target=self._run, name="ms_exporter-jsonl", daemon=True)
        self._thread.start()

    def stop(self, timeout: float = 5.0) -> None:
        self._stopping = True
        self._wake.set()
        if self._thread is not None:
            self._thread.join(timeout)
            self._thread = None
        self.flush()

    def close(self) -> None:
        """Flush what is queued and close the file; never raises (a full disk is counted, not thrown)."""
        self.stop()
        with self._lock:
            self._close_file()
        _release(self.path)
        self._rank_claim.release()

    def _close_file(self) -> None:
        if self._fd is not None:
            try:
                os.close(self._fd)
            except OSError as exc:
                self._on_error("local", exc)
            self._fd = None

    def _run(self) -> None:
        next_snapshot = time.monotonic() + self._interval
        while True:
            wait = min(self._interval, MAX_UNWRITTEN_SECONDS)
            if self._failures:
                wait = max(self._retry_at - time.monotonic(), 0.0)
            self._wake.wait(wait)
            self._wake.clear()
            if self._stopping:
                return  # stop() flushes once more itself
            now = time.monotonic()
            if self._failures and now < self._retry_at:
                continue  # woken early while backing off: the records wait in the (bounded) queue
            snapshot = now >= next_snapshot or self._failures > 0  # a retry always writes: the snapshot, at least
            if snapshot:
                next_snapshot = now + self._interval
            self.flush(snapshot)

    def flush(self, snapshot: bool = True) -> None:
        """Write everything queued (plus a snapshot line), then flush the file to the OS. Called from train end,
        a signal or close() it tries even while the writer thread backs off: it may be the last chance."""
        with self._lock:
            items = self._drain()
            if not items and not snapshot:
                return
            try:
                lines = [self._line(kind, payload) for kind, payload in items]
                if snapshot:
                    lines.append(self._snapshot_line())
                self._write("".join(lines).encode("utf-8"))
            except Exception as exc:  # a full disk must not reach training: counted, logged once, tried again later
                self._failed(exc, len(items))  # none of this batch is in the file (see _write)
            else:
                self._written()

    def _failed(self, exc: Exception, records: int) -> None:
        self._dropped.value += records
        self._lost_while_failing += records
        self._failures += 1
        pause = min(self._interval, MAX_UNWRITTEN_SECONDS)
        backoff = min(pause * 2 ** min(self._failures - 1, 16), RETRY_MAX_SECONDS)
        self._retry_at = time.monotonic() + backoff
        self._on_error("local", exc)

    def _written(self) -> None:
        if self._failures:
            logger.warning(
                "ms_exporter: %s is written again after %d failed writes; %d records were lost meanwhile (counted "
                "in %s)",
                self.path,
                self._failures,
                self._lost_while_failing,
                catalogue.DROPPED_RECORDS.name,
            )
        self._failures = 0
        self._lost_while_failing = 0

    def _drain(self) -> list[tuple[str, Any]]:
        items = []
        queue = self._queue
        while queue:
            items.append(queue.popleft())
        return items

    def _line(self, kind: str, payload: Any) -> str:
        if kind == "step":
            sample, keys, values = payload
            record: dict[str, Any] = {"type": "step", **self._identity}
            for name in STEP_FIELDS:
                record[_FIELD_NAMES.get(name, name)] = _json_number(getattr(sample, name))
            for key, value in zip_strict(keys, values):
                record[key] = _json_number(value)
        else:
            record = {"type": kind, **self._identity, **payload}
        return json.dumps(record, separators=(",", ":")) + "\n"

    def _snapshot_line(self) -> str:
        metrics: dict[str, Any] = {}
        for family in self._store.families(lambda exc: self._on_error("local", exc)):
            for child in family.children:
                key = series_key(family.name, child)
                if isinstance(child, HistogramSeries):
                    _, count, total = child.cumulative()
                    metrics[key] = {"count": count, "sum": _json_number(total)}
                else:
                    metrics[key] = _json_number(child.value)
        record = {"type": "snapshot", "time": time.time(), **self._identity, "metrics": metrics}
        return json.dumps(record, separators=(",", ":")) + "\n"

    def _write(self, data: bytes) -> None:
        """Append whole lines or nothing: unbuffered writes to an O_APPEND descriptor, and after a failed or short
        write (a full disk) the file is cut back to where this batch began, so no torn line is ever left."""
        if self._fd is None:  # a link planted at the name is refused (ELOOP), never followed: counted as a failure
            make_dir(self.path.parent)
            self._fd = open_append(self.path)
        # One writer (under the lock): the batch starts at the end.
        began = append_whole(self._fd, data, "the JSON Lines batch", self.path)
        if began + len(data) >= self._max_bytes:
            self._rotate()

    def _rotate(self) -> None:
        """metrics-rank0.jsonl -> .1 -> .2 ...; the oldest beyond max_files is deleted.

        Renames and unlinks act on names, never through links; only regular files are moved, and a rename that
        fails (a directory planted at a rotated name) is counted, not raised: the batch just written stays
        written."""
        self._close_file()
        self._rotate_step(None, self.path.with_name(f"{self.path.name}.{self._max_files}"))
        for index in range(self._max_files - 1, 0, -1):
            self._rotate_step(
                self.path.with_name(f"{self.path.name}.{index}"), self.path.with_name(f"{self.path.name}.{index + 1}")
            )
        self._rotate_step(self.path, self.path.with_name(f"{self.path.name}.1"))

    def _rotate_step(self, source: Path | None, target: Path) -> None:
        """Move `source` to `target` (None: remove `target`) when it is a regular file of ours."""
        try:
            if source is None:
                if stat.S_ISREG(target.lstat().st_mode):
                    target.unlink()
                return
            if not stat.S_ISREG(source.lstat().st_mode):
                raise UnsafeFile(f"{source} is not a regular file; left where it is")
            os.replace(source, target)
        except FileNotFoundError:  # gaps in the numbering are fine
            pass
        except OSError as exc:
            self._on_error("local", exc)


def _plain(value: Any) -> Any:
    try:
        return float(value)
    except (TypeError, ValueError):
        return str(value)


def build(context: PartContext) -> list[Sink]:
    """JSON Lines files in save_dir (the registry's `local` backend)."""
    config = context.config
    return [
        JsonlWriter(
            context.store,
            config.save_dir,
            context.rank.rank,
            config.project,
            config.interval,
            config.max_file_mb,
            config.max_files,
            context.on_error,
            config.jsonl_name,
            run_id_of(config),
        )
    ]


PART = BackendEntry("local", build, order=30)
