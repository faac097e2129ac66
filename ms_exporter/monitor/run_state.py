"""The run state file: what outlives one process of a run (its earlier processes' time, restarts, highest step).

One pair of files per rank in save_dir, so ranks that share a save_dir never write the same file:

- `ms_exporter-run-<run_id>-rank<r>.json`, rewritten whole: a temporary file of this process, then os.replace,
  so a reader (the next process) sees the old state or the new one, never a mix;
- `ms_exporter-run-<run_id>-rank<r>.step`, 8 bytes mapped into memory: the highest step the run reached. The
  training thread stores it at each new step (a memory store, no system call); the kernel writes the page back,
  also when the process is killed, so a restart knows the last step that a SIGKILL interrupted, not only the one
  of the last save.
"""

from __future__ import annotations

import contextlib
import json
import logging
import mmap
import os
import struct
import threading
import time
from pathlib import Path
from typing import Any

from ms_exporter import catalogue as c

logger = logging.getLogger("ms_exporter")

FORMAT = 1
_MARK = struct.Struct("<q")

# The run state files the monitors of this process keep: a second monitor of the same run and rank would overwrite
# the first one's figures with its own.
_KEPT: set[Path] = set()
_KEPT_LOCK = threading.Lock()


class RunStateTaken(RuntimeError):
    """Another TrainingMonitor of this process keeps this run state file."""


class RunState:
    """Loads what the run's earlier process left, and saves this process's part.

    `earlier` (seconds per bucket of every earlier process), `restarts` and `redo_until` (the highest step an
    earlier process reached: steps up to it are done again) are fixed at construction. A previous state that
    `finished` (its training ended normally) starts a new run instead when the run id was derived, not given.
    """

    def __init__(self, save_dir: str, run_id: str, rank: int, given: bool) -> None:
        directory = Path(save_dir)
        self.path = directory / f"ms_exporter-run-{run_id}-rank{rank}.json"
        self.run_id = run_id
        self.rank = rank
        self.earlier = [0.0] * len(c.TIME_BUCKETS)
        self.restarts = 0
        self.redo_until = 0
        self.highest = 0
        self.saved_at: float | None = None
        self._mark: mmap.mmap | None = None
        self._key: Path | None = None
        directory.mkdir(parents=True, exist_ok=True)
        with _KEPT_LOCK:
            key = self.path.resolve()
            if key in _KEPT:
                raise RunStateTaken(f"{self.path} is kept by another TrainingMonitor of this process")
            _KEPT.add(key)
        self._key = key
        try:
            self._open(given)
        except BaseException:
            self.close()
            raise

    def _open(self, given: bool) -> None:
        previous = self._load()
        mark_path = self.path.with_suffix(".step")
        if previous is not None and not (previous.get("finished") and not given):
            # A monitor made again in the same process counts the process's time from its start again: only another
            # process's seconds are earlier ones, and only another process is a restart.
            same_process = previous.get("process", {}).get("pid") == os.getpid()
            seconds = {} if same_process else previous.get("process", {}).get("seconds", {})
            self.earlier = [float(previous["earlier_seconds"].get(bucket, 0.0)) + float(seconds.get(bucket, 0.0))
                            for bucket in c.TIME_BUCKETS]
            self.restarts = int(previous["restarts"]) + (0 if same_process else 1)
            self.redo_until = max(int(previous.get("highest_step", 0)), _read_mark(mark_path))
            self.highest = self.redo_until
        elif previous is not None:
            logger.info("ms_exporter: run %s ended normally before; this process starts it anew (set run_id to "
                        "continue a run)", self.run_id)
        self._mark = _map_mark(mark_path, self.highest)

    def _load(self) -> dict[str, Any] | None:
        try:
            text = self.path.read_text(encoding="utf-8")
        except FileNotFoundError:
            return None
        try:
            state = json.loads(text)
            if state.get("format") != FORMAT or state.get("run_id") != self.run_id:
                raise ValueError(f"not a format-{FORMAT} state of run {self.run_id}")
            {bucket: float(value) for bucket, value in state["earlier_seconds"].items()}  # noqa: B018 - validates
            int(state["restarts"])
            return dict(state)
        except (ValueError, KeyError, TypeError, AttributeError) as exc:
            aside = self.path.with_name(self.path.name + ".unreadable")
            os.replace(self.path, aside)
            logger.warning("ms_exporter: the run state %s could not be read (%s); moved to %s, this process starts "
                           "the run's ledger anew", self.path, exc, aside)
            return None

    def mark(self, step: int) -> None:
        """A step the run reached (the training thread, at each step end): kept when it is a new highest."""
        if step > self.highest:
            self.highest = step
            if self._mark is not None:
                _MARK.pack_into(self._mark, 0, step)

    def save(self, seconds: list[float], finished: bool) -> None:
        """This process's seconds per bucket so far; `finished` when its training ended normally. Raises OSError."""
        now = time.time()
        state = {
            "format": FORMAT, "run_id": self.run_id, "rank": self.rank, "restarts": self.restarts,
            "highest_step": self.highest, "saved": now, "finished": finished,
            "earlier_seconds": dict(zip(c.TIME_BUCKETS, self.earlier, strict=True)),
            "process": {"pid": os.getpid(), "seconds": dict(zip(c.TIME_BUCKETS, seconds, strict=True))},
        }
        temporary = self.path.with_name(f".{self.path.name}.{os.getpid()}.{threading.get_ident()}.tmp")
        try:
            temporary.write_text(json.dumps(state, indent=1) + "\n", encoding="utf-8")
            os.replace(temporary, self.path)
        finally:
            with contextlib.suppress(OSError):
                temporary.unlink()
        self.saved_at = now

    def close(self) -> None:
        if self._mark is not None:
            self._mark.close()
            self._mark = None
        if self._key is not None:
            with _KEPT_LOCK:
                _KEPT.discard(self._key)
            self._key = None


def _read_mark(path: Path) -> int:
    try:
        data = path.read_bytes()
    except OSError:
        return 0
    return int(_MARK.unpack_from(data)[0]) if len(data) >= _MARK.size else 0


def _map_mark(path: Path, step: int) -> mmap.mmap | None:
    """The step mark, mapped and set to `step`; None (and a warning) where the file system cannot map it."""
    try:
        descriptor = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            os.ftruncate(descriptor, _MARK.size)
            mapped = mmap.mmap(descriptor, _MARK.size)
        finally:
            os.close(descriptor)  # the mapping keeps the file
    except (OSError, ValueError) as exc:
        logger.warning("ms_exporter: cannot map %s (%s): a restart after a kill counts as redo only the steps up to "
                       "the last save of the run state", path, exc)
        return None
    _MARK.pack_into(mapped, 0, step)
    return mapped
