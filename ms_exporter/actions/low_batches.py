"""data_quality.list_batches: the batches of a data-quality drop go to rollback's save_dir/skipped-batches.json, so
that SkipListedSamples and KeepUnlisted keep their samples out on the next pass (docs/data-quality.md); and the
data_quality probe's builder, which hands the probe that list (a probe, a lower layer, cannot import an action).

A batch is hashed on the training thread when it is found low (its tensors are the step's own and are not kept);
the file is appended by a thread of its own about once a second, all the batches queued since in one append, and
at train end, on SIGTERM/SIGINT and at close. A process lists at most `max_listed` batches: past that, a drop is
still measured and alerted on, and the log says once that no more are listed.

| name | type | labels | unit |
|---|---|---|---|
| mindspore_train_data_listed_batches_total | counter | | batches |
"""

from __future__ import annotations

import logging
import threading
from collections import deque
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from ms_exporter.actions.skipped_batches import SkippedBatches, batch_identity
from ms_exporter.config import MonitorConfig
from ms_exporter.core import catalogue
from ms_exporter.core.errors import OnPartError
from ms_exporter.core.part import PartContext
from ms_exporter.core.periodic import PeriodicThread
from ms_exporter.core.probe import Probe
from ms_exporter.core.registry import ProbeEntry
from ms_exporter.core.store import MetricStore
from ms_exporter.probes.data_quality import DataQualityProbe

logger = logging.getLogger("ms_exporter")

WRITE_SECONDS = 1.0  # the queued batches reach the file this often: one rewrite of the list for all of them


def build(context: PartContext) -> list[Probe]:
    """The data_quality probe when its section is on, with the list when list_batches is."""
    config: MonitorConfig = context.config
    section = config.data_quality
    if not section.enable:
        return []
    batch_list = None
    if section.list_batches:
        on_error = context.on_error
        batch_list = SkippedBatchList(
            Path(config.save_dir),
            context.rank.rank,
            section.max_listed,
            context.store,
            lambda exc: on_error(DataQualityProbe.name, exc),
        )
    return [DataQualityProbe(context.store, section, config.attention_mask_column, config.input_ids_column, batch_list)]


class SkippedBatchList:
    """The probe's BatchList: identities made on the training thread, appended to the list by a writer thread."""

    def __init__(self, save_dir: Path, rank: int, max_listed: int, store: MetricStore, on_error: OnPartError) -> None:
        self._file = SkippedBatches(save_dir)
        self._rank = rank
        self._max = max_listed
        self._taken = 0
        self._queue: deque[dict[str, Any]] = deque()  # appended by the training thread, emptied by the writer
        self._listed = store.register(catalogue.DATA_LISTED_BATCHES).series()
        self._on_error = on_error
        self._lock = threading.Lock()  # one append at a time: the writer's, or a flush's
        self._writer = PeriodicThread("ms_exporter-data-quality", WRITE_SECONDS, self._write, first_at_once=False)

    @property
    def full(self) -> bool:
        return self._taken >= self._max

    @property
    def path(self) -> Path:
        return self._file.path

    def identify(
        self, step: int, epoch: int, position: int | None, columns: Sequence[Any], details: dict[str, Any]
    ) -> dict[str, Any]:
        """The batch as rollback lists it (step, epoch, position, batch and sample hashes, rank) with `details`.
        A batch whose columns cannot be read as arrays is listed by where it was alone."""
        try:
            arrays: list[np.ndarray] | None = [
                np.asarray(column.asnumpy() if hasattr(column, "asnumpy") else column) for column in columns
            ]
        except Exception:  # strings, None columns: no content hash, but still where it was
            arrays = None
        return {**batch_identity(step, epoch, position, arrays), "rank": self._rank, **details}

    def add(self, entries: list[dict[str, Any]]) -> None:
        if self.full:
            return
        taken = entries[: self._max - self._taken]
        self._taken += len(taken)
        self._queue.extend(taken)
        self._writer.start()  # harmless while it runs
        if self.full:
            logger.warning(
                "ms_exporter: data_quality has listed %d batches for %s (data_quality.max_listed); later drops are "
                "measured and alerted on but not listed",
                self._max,
                self._file.path,
            )

    def flush(self) -> None:
        """Stop the writer and write what it left (train end, a signal, close)."""
        self._writer.stop()
        self._write()

    def _write(self) -> None:
        with self._lock:
            entries = []
            while self._queue:
                entries.append(self._queue.popleft())
            if not entries:
                return
            try:
                self._file.append(entries)
            except Exception as exc:  # a full disk, an unwritable save_dir: counted and logged once, not raised
                self._on_error(exc)
                return
            self._listed.value += len(entries)


PART = ProbeEntry("data_quality", build, order=180)
