"""The `tensorboard` backend: TensorBoard event files (tensorboardX's records), written by a background thread."""

from __future__ import annotations

import errno
import logging
import os
import re
import socket
import struct
import time
from pathlib import Path
from typing import Any

import numpy as np

from ms_exporter.config.run_identity import run_folder_of
from ms_exporter.core import catalogue
from ms_exporter.core.catalogue import MetricFamily
from ms_exporter.core.cb_params import step_of, trained_weights_of
from ms_exporter.core.compat import zip_strict
from ms_exporter.core.device.device_reductions import (
    HIST_COUNT,
    HIST_MAX,
    HIST_MIN,
    HIST_SUM,
    HIST_SUM_SQUARES,
    HISTOGRAM_HEAD,
    histograms,
)
from ms_exporter.core.errors import Breaker, OnError
from ms_exporter.core.files.safe_files import append_whole, make_dir, open_regular
from ms_exporter.core.part import PartContext
from ms_exporter.core.registry import BackendEntry
from ms_exporter.core.sample import StepSample
from ms_exporter.core.sink import Sink
from ms_exporter.core.store import MetricStore
from ms_exporter.sinks.shared.queued_writer import QueuedStepWriter, writer_could_not_start
from ms_exporter.sinks.shared.step_columns import StepColumns, jsonl_key_of

logger = logging.getLogger("ms_exporter")

# Per-layer series as TensorBoard tags with a prefix (the TensorBoard article's `grad/layer1_norm`), written
# every `collect_freq` steps: `grad/<layer>`, `weight/<layer>`, `update_ratio/<layer>`.
LAYER_TAGS: dict[MetricFamily, str] = {
    catalogue.LAYER_GRAD_NORM: "grad",
    catalogue.WEIGHT_NORM: "weight",
    catalogue.LAYER_UPDATE_RATIO: "update_ratio",
}
_LAYER_PREFIXES = tuple(f"{prefix}/" for prefix in LAYER_TAGS.values())
HISTOGRAM_BINS = 64  # equal bins between the finite values' min and max, as numpy.histogram(values, bins=64) makes them
MAX_HISTOGRAMS = 64  # parameters histogrammed at most (a regular expression that matches a whole LLM is a mistake)
# The characters tensorboardX's summary functions replace by `_` in a tag (summary._clean_tag): histogram_raw takes
# the tag as it is given, so a parameter's tag is cleaned here as summary.histogram cleaned it.
_NOT_IN_TAGS = re.compile(r"[^-/\w\.]")


def tag_of(family: MetricFamily, labels: tuple[tuple[str, str], ...]) -> str:
    """A step column's TensorBoard tag: a layer family's `<prefix>/<layer>`, else the JSON Lines key."""
    prefix = LAYER_TAGS.get(family)
    if prefix is not None:
        return f"{prefix}/{dict(labels).get('layer', '')}"
    return jsonl_key_of(family, labels)


class TensorBoardWriter(QueuedStepWriter):
    """The step and evaluation scalars of QueuedStepWriter as TensorBoard scalars, at the step's global step and
    wall time.

    Event files go to `save_dir/tensorboard/<run>/rank<r>` (`<run>`: run_id, else the project): `tensorboard
    --logdir save_dir/tensorboard` shows each project (each run) apart, one run per rank. The records are
    tensorboardX's (its `summary.scalar` and `summary.histogram_raw`, its Event proto and record checksum); the file
    is written here, by the writer thread, in whole records: tensorboardX's SummaryWriter hands events to a thread
    of its own that dies on the first failed write (a full disk) and then blocks every later `add_scalar` for
    ever. Here a failed write is an OSError on the writer thread, counted like any other; the file is cut back to
    where the batch began, so no torn record is left. The event file is created exclusively (O_EXCL, no symlink
    followed) under a directory made 0750 (`safe_files`); a directory that cannot be made or written (read-only)
    is an OSError at construction, which `build_sinks` counts: training goes on without TensorBoard.

    As MindSpore's SummaryCollector (`collect_freq`, `histogram_regular`), every `collect_freq` steps: the layer
    norms and update ratios as `grad/<layer>`, `weight/<layer>`, `update_ratio/<layer>`, and histograms of the
    parameters whose names `histogram_regular` matches (`weight/<parameter>`; `grad/<parameter>` too where the train
    cell returns its gradients). An event file that reached `max_file_bytes` is closed and a new one begun.

    The values never leave the device. At the sampled step the training thread reduces all the chosen parameters in
    one compiled call (`device_reductions.histograms`), and that step's gradients in one more when the step is
    published (still the training thread; the step's record holds them until then), each tensor to one row of
    5 + HISTOGRAM_BINS numbers (min, max, count, sum, sum of squares, the bins' counts): one transfer of n x 69
    float32 (276 bytes a tensor, whatever its size) per call, queued as it is. The writer thread turns each row
    into TensorBoard's histogram (tensorboardX's `summary.histogram_raw`) as `summary.histogram` drew the values:
    the bins are numpy.histogram's (equal, between the min and max; a tensor of one value gets numpy's
    [v - 0.5, v + 0.5]), and only the occupied bins are kept, with one empty bin on their left. Non-finite values
    (NaN, +-inf) are left out on the device: min, max, count, sum and sum of squares are those of the finite values,
    and no bin counts them; a tensor with no finite value has no histogram at that step (the loss and gradient norm
    scalars show what went wrong). The sums are float32 on the device, where numpy summed in float64.
    """

    name = "tensorboard"

    def __init__(
        self,
        store: MetricStore,
        log_dir: Path,
        interval: float,
        on_error: OnError,
        breaker: Breaker | None = None,
        *,
        collect_freq: int = 10,
        histogram_regular: str | None = None,
        max_file_bytes: int = 0,
    ) -> None:
        # the extra: build_sinks turns its absence into a ConfigError
        import tensorboardX  # noqa: F401  (the package itself: its submodules may be imported already)
        from tensorboardX.proto.event_pb2 import Event
        from tensorboardX.record_writer import masked_crc32c
        from tensorboardX.summary import histogram_raw, scalar

        self._event, self._crc, self._scalar, self._histogram = Event, masked_crc32c, scalar, histogram_raw
        self.log_dir = log_dir
        self._collect_freq = collect_freq
        self._histogram_regular = re.compile(histogram_regular) if histogram_regular is not None else None
        self._max_file_bytes = max_file_bytes
        self._layers_mark = -1  # (the writer thread's) step // collect_freq of the last layer tags written
        self._histogram_mark = -1  # (the training thread's) step // collect_freq of the last histograms taken
        self._histogram_parameters: list[Any] = []
        self._weight_tags: list[str] = []  # `weight/<parameter>` of each histogrammed parameter, in their order
        self._grad_tags: list[tuple[str, str]] = []  # (parameter name, `grad/<parameter>`)
        self._grad_steps: set[int] = set()  # steps whose gradients are histogrammed when they are published
        self._files = 0
        self._file_bytes = 0
        make_dir(log_dir)
        self._fd: int | None = None
        self._pending: list[bytes] = []
        self._open_file()
        super().__init__(store, interval, on_error, breaker)

    def _open_file(self) -> None:
        """A new event file, begun with its version record. The name is the one TensorBoard looks for
        (`*tfevents*`), as tensorboardX makes it, with the pid (two processes on one directory never share a file)
        and, after a rotation, a number: TensorBoard reads a directory's files in the order of their names."""
        name = f"events.out.tfevents.{int(time.time()):010d}.{socket.gethostname()}.{os.getpid()}"
        if self._files:
            name += f".{self._files}"
        self._files += 1
        self.path = self.log_dir / name
        self._fd = open_regular(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_EXCL)
        self._file_bytes = 0
        try:
            self._append(self._record(self._event(wall_time=time.time(), file_version="brain.Event:2")))
        except BaseException:
            self._close_writer()
            raise

    def _step_columns(self, store: MetricStore) -> StepColumns:
        return StepColumns(store, extra=(catalogue.LAYER_GRAD_NORM, catalogue.WEIGHT_NORM), key_of=tag_of)

    # -- the training thread: reduce the values a histogram is made of, on the device ---------------------------
    def on_train_begin(self, cb_params: Any) -> None:
        super().on_train_begin(cb_params)
        self._histogram_mark = step_of(cb_params) // self._collect_freq - 1
        if self._histogram_regular is None:
            return
        weights = trained_weights_of(cb_params)
        chosen = [p for p in weights if self._histogram_regular.match(str(getattr(p, "name", "")))]
        if not chosen:
            logger.warning(
                "ms_exporter: tensorboard.histogram_regular %r matches no parameter of this model: no histograms",
                self._histogram_regular.pattern,
            )
        elif len(chosen) > MAX_HISTOGRAMS:
            logger.warning(
                "ms_exporter: tensorboard.histogram_regular matches %d parameters; histograms of the first %d",
                len(chosen),
                MAX_HISTOGRAMS,
            )
        self._histogram_parameters = chosen[:MAX_HISTOGRAMS]
        names = [str(p.name) for p in self._histogram_parameters]
        self._weight_tags = [_tag("weight", name) for name in names]
        self._grad_tags = [(name, _tag("grad", name)) for name in names]

    def on_step_end(self, step: int, outputs: Any) -> None:
        if not self._histogram_parameters or step // self._collect_freq <= self._histogram_mark:
            return
        self._histogram_mark = step // self._collect_freq
        rows = histograms(self._histogram_parameters, HISTOGRAM_BINS)
        self._queue_histograms(step, time.time(), list(zip_strict(self._weight_tags, rows)))
        self._grad_steps.add(step)

    def on_step(self, sample: StepSample) -> None:
        super().on_step(sample)
        if not self._grad_steps:
            return
        due = sample.step in self._grad_steps
        self._grad_steps = {step for step in self._grad_steps if step > sample.step}
        if not due:
            return
        grads_at = sample.layout.grads
        if grads_at is None:
            return
        grads = sample.outputs[grads_at]
        if not hasattr(grads, "get"):
            return
        # The step's own gradients, still on the device (the step record holds them until it is published).
        found = [(tag, grads.get(name)) for name, tag in self._grad_tags]
        found = [(tag, grad) for tag, grad in found if grad is not None]
        if not found:
            return
        rows = histograms([grad for _, grad in found], HISTOGRAM_BINS)
        self._queue_histograms(sample.step, sample.wall_time, [(tag, row) for (tag, _), row in zip_strict(found, rows)])

    def _record(self, event: object) -> bytes:
        """One TFRecord: length, its masked CRC-32C, the serialized event, its masked CRC-32C."""
        data: bytes = event.SerializeToString()  # type: ignore[attr-defined]
        header = struct.pack("<Q", len(data))
        return header + struct.pack("<I", int(self._crc(header))) + data + struct.pack("<I", int(self._crc(data)))

    def _write_step(self, step: int, wall_time: float, scalars: dict[str, float]) -> None:
        layers_due = step // self._collect_freq > self._layers_mark
        if layers_due:
            self._layers_mark = step // self._collect_freq
        for key, value in scalars.items():
            if not layers_due and key.startswith(_LAYER_PREFIXES):
                continue
            self._pending.append(
                self._record(self._event(summary=self._scalar(key, value), step=step, wall_time=wall_time))
            )

    def _write_histograms(self, step: int, wall_time: float, arrays: list[tuple[str, Any]]) -> None:
        for tag, row in arrays:
            count = int(row[HIST_COUNT])
            if count == 0:
                continue  # nothing to draw: the non-finite values show in the scalars (loss, grad_norm)
            limits, counts = _buckets(row)
            summary = self._histogram(
                tag,
                min=float(row[HIST_MIN]),
                max=float(row[HIST_MAX]),
                num=count,
                sum=float(row[HIST_SUM]),
                sum_squares=float(row[HIST_SUM_SQUARES]),
                bucket_limits=limits,
                bucket_counts=counts,
            )
            self._pending.append(self._record(self._event(summary=summary, step=step, wall_time=wall_time)))

    def _write_eval(self, step: int, scalars: dict[str, float]) -> None:
        now = time.time()
        for key, value in scalars.items():
            self._pending.append(self._record(self._event(summary=self._scalar(key, value), step=step, wall_time=now)))

    def _flush_writer(self) -> None:
        data, self._pending = b"".join(self._pending), []
        self._append(data)
        if self._max_file_bytes and self._file_bytes >= self._max_file_bytes:
            self._close_writer()
            self._open_file()

    def _append(self, data: bytes) -> None:
        """Whole records or nothing: after a failed or short write the file is cut back to where it was."""
        if self._fd is None:
            raise OSError(errno.EBADF, "the event file is closed", str(self.path))
        append_whole(self._fd, data, "the TensorBoard records", self.path)
        self._file_bytes += len(data)

    def _abandon(self) -> None:
        self._pending = []

    def _close_writer(self) -> None:
        self._pending = []
        if self._fd is not None:
            fd, self._fd = self._fd, None
            os.close(fd)


def build(context: PartContext) -> list[Sink]:
    """TensorBoard event files on rank 0 (every rank with tensorboard.all_ranks). A read-only or full save_dir, a
    link planted at the event file, a tensorboardX that breaks on import (not a missing one: that is the extra's
    ConfigError): counted and logged once, the run falls back to JSON Lines, and training goes on."""
    config, rank = context.config, context.rank
    if rank.rank != 0 and not config.tensorboard.all_ranks:
        return []
    try:
        directory = Path(config.save_dir) / "tensorboard" / run_folder_of(config) / f"rank{rank.rank}"
        tensorboard = config.tensorboard
        writer = TensorBoardWriter(
            context.store,
            directory,
            config.interval,
            context.on_error,
            context.breaker,
            collect_freq=tensorboard.collect_freq,
            histogram_regular=tensorboard.histogram_regular,
            max_file_bytes=int(tensorboard.max_file_mb * 2**20),
        )
        writer.fall_back = context.fall_back
        return [writer]
    except ImportError:
        raise
    except Exception as exc:
        return writer_could_not_start(context, "tensorboard", exc)


def _tag(prefix: str, name: str) -> str:
    return _NOT_IN_TAGS.sub("_", f"{prefix}/{name}").lstrip("/")


def _buckets(row: np.ndarray) -> tuple[list[float], list[float]]:
    """A histogram row's bucket limits and counts as tensorboardX's `make_histogram` gives them for numpy's
    histogram of the values: the right edge of each bin from the first occupied one to the last, and one empty bin
    on the left, whose right edge is the lowest value (TensorBoard reads bucket i as (limit[i-1], limit[i]])."""
    low, high = row[HIST_MIN], row[HIST_MAX]
    counts = row[HISTOGRAM_HEAD:]
    edges = np.histogram_bin_edges(np.array([low, high]), bins=counts.size)
    if low == high:
        # The device put every value in the first bin; numpy widens the range to [v - 0.5, v + 0.5].
        counts = np.histogram(np.array([low]), bins=edges)[0] * row[HIST_COUNT]
    occupied = np.flatnonzero(counts)
    start, end = int(occupied[0]), int(occupied[-1]) + 1
    kept = counts[start - 1 : end] if start > 0 else np.concatenate([[0.0], counts[:end]])
    return edges[start : end + 1].tolist(), kept.tolist()


PART = BackendEntry("tensorboard", build, extra="tensorboard", order=40)
