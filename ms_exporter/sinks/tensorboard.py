"""The `tensorboard` backend: TensorBoard event files (tensorboardX's records), written by a background thread."""

from __future__ import annotations

import errno
import os
import socket
import struct
import time
from pathlib import Path

from ms_exporter.config.run_identity import run_folder_of
from ms_exporter.core import safe_files
from ms_exporter.core.errors import Breaker, OnError
from ms_exporter.core.part import PartContext
from ms_exporter.core.sink import Sink
from ms_exporter.core.store import MetricStore
from ms_exporter.sinks.queued_writer import QueuedStepWriter


class TensorBoardWriter(QueuedStepWriter):
    """The step and evaluation scalars of QueuedStepWriter as TensorBoard scalars, at the step's global step and
    wall time.

    Event files go to `save_dir/tensorboard/<run>/rank<r>` (`<run>`: run_id, else the project): `tensorboard
    --logdir save_dir/tensorboard` shows each project (each run) apart, one run per rank. The records are
    tensorboardX's (its `summary.scalar`, its Event proto and record checksum); the file
    is written here, by the writer thread, in whole records: tensorboardX's SummaryWriter hands events to a thread
    of its own that dies on the first failed write (a full disk) and then blocks every later `add_scalar` for
    ever. Here a failed write is an OSError on the writer thread, counted like any other; the file is cut back to
    where the batch began, so no torn record is left. The event file is created exclusively (O_EXCL, no symlink
    followed) under a directory made 0750 (`safe_files`); a directory that cannot be made or written (read-only)
    is an OSError at construction, which `build_sinks` counts: training goes on without TensorBoard.
    """

    name = "tensorboard"

    def __init__(
        self, store: MetricStore, log_dir: Path, interval: float, on_error: OnError, breaker: Breaker | None = None
    ) -> None:
        # the extra: build_sinks turns its absence into a ConfigError
        import tensorboardX  # noqa: F401  (the package itself: its submodules may be imported already)
        from tensorboardX.proto.event_pb2 import Event
        from tensorboardX.record_writer import masked_crc32c
        from tensorboardX.summary import scalar

        self._event, self._crc, self._scalar = Event, masked_crc32c, scalar
        self.log_dir = log_dir
        safe_files.make_dir(log_dir)
        # The name TensorBoard looks for (`*tfevents*`), as tensorboardX makes it, with the pid: two processes on
        # one directory never share a file.
        self.path = log_dir / f"events.out.tfevents.{int(time.time()):010d}.{socket.gethostname()}.{os.getpid()}"
        self._fd: int | None = safe_files.open_regular(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_EXCL)
        self._pending: list[bytes] = []
        try:
            self._append(self._record(Event(wall_time=time.time(), file_version="brain.Event:2")))
        except BaseException:
            self._close_writer()
            raise
        super().__init__(store, interval, on_error, breaker)

    def _record(self, event: object) -> bytes:
        """One TFRecord: length, its masked CRC-32C, the serialized event, its masked CRC-32C."""
        data: bytes = event.SerializeToString()  # type: ignore[attr-defined]
        header = struct.pack("<Q", len(data))
        return header + struct.pack("<I", int(self._crc(header))) + data + struct.pack("<I", int(self._crc(data)))

    def _write_step(self, step: int, wall_time: float, scalars: dict[str, float]) -> None:
        for key, value in scalars.items():
            self._pending.append(
                self._record(self._event(summary=self._scalar(key, value), step=step, wall_time=wall_time))
            )

    def _write_eval(self, step: int, scalars: dict[str, float]) -> None:
        now = time.time()
        for key, value in scalars.items():
            self._pending.append(self._record(self._event(summary=self._scalar(key, value), step=step, wall_time=now)))

    def _flush_writer(self) -> None:
        data, self._pending = b"".join(self._pending), []
        self._append(data)

    def _append(self, data: bytes) -> None:
        """Whole records or nothing: after a failed or short write the file is cut back to where it was."""
        if self._fd is None:
            raise OSError(errno.EBADF, "the event file is closed", str(self.path))
        safe_files.append_whole(self._fd, data, "the TensorBoard records", self.path)

    def _abandon(self) -> None:
        self._pending = []

    def _close_writer(self) -> None:
        self._pending = []
        if self._fd is not None:
            fd, self._fd = self._fd, None
            os.close(fd)


def build(context: PartContext) -> list[Sink]:
    """TensorBoard event files on rank 0 (every rank with tensorboard.all_ranks). A read-only or full save_dir, a
    link planted at the event file: counted and logged once, and training goes on without it."""
    config, rank = context.config, context.rank
    if rank.rank != 0 and not config.tensorboard.all_ranks:
        return []
    try:
        directory = Path(config.save_dir) / "tensorboard" / run_folder_of(config) / f"rank{rank.rank}"
        writer = TensorBoardWriter(context.store, directory, config.interval, context.on_error, context.breaker)
        writer.fall_back = context.fall_back
        return [writer]
    except OSError as exc:
        context.on_error("tensorboard", exc)
        return []
