"""The run state file: what outlives one process of a run (its earlier processes' time, restarts, highest step).

One pair of files per rank in save_dir, so ranks that share a save_dir never write the same file:

- `ms_exporter-run-<run_id>-rank<r>.json`, rewritten whole: a fresh temporary file, then os.replace, so a reader
  (the next process) sees the old state or the new one, never a mix;
- `ms_exporter-run-<run_id>-rank<r>.step`, 8 bytes mapped into memory: the highest step the run reached. The
  training thread stores it at each new step (a memory store, no system call); the kernel writes the page back,
  also when the process is killed, so a restart knows the last step that a SIGKILL interrupted, not only the one
  of the last save. The file is made whole (its block allocated, posix_fallocate) before it is mapped: a store
  into a mapped hole on a full disk would be a SIGBUS, which kills the training.

Both are opened through safe_files (no symlink followed, regular files only, bounded reads). A file left by an
earlier process is checked field by field; one that is no regular file, too large, not UTF-8 JSON, or holds a
value of the wrong type or out of range is moved aside (logged: which file, why, where to) and that file starts
anew.
"""

from __future__ import annotations

import contextlib
import errno
import json
import logging
import math
import mmap
import os
import struct
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ms_exporter.core import catalogue as c
from ms_exporter.core.compat import zip_strict
from ms_exporter.core.files import safe_files

logger = logging.getLogger("ms_exporter")

FORMAT = 1
_MARK = struct.Struct("<q")
STATE_LIMIT = 64 * 1024  # bytes: a state file of this format is about 1 KiB
MAX_SECONDS = 1e9  # a bucket's seconds (31 years of one rank's time)
MAX_STEP = 2**53  # steps (exact in a float, as Prometheus exports them)
MAX_RESTARTS = 10**6
_MAX_PID = 2**31

# The run state files the monitors of this process keep: a second monitor of the same run and rank would overwrite
# the first one's figures with its own.
_KEPT: set[Path] = set()
_KEPT_LOCK = threading.Lock()


class RunStateTaken(RuntimeError):
    """Another TrainingMonitor of this process keeps this run state file."""


class _Unusable(ValueError):
    """A state file that cannot be used as it is: it is moved aside."""


@dataclass(frozen=True)
class _Previous:
    """What an earlier process left, checked."""

    restarts: int
    highest: int
    finished: bool
    earlier: list[float]
    pid: int | None
    seconds: list[float]
    saved: float | None = None  # unix time of its last save


class RunState:
    """Loads what the run's earlier process left, and saves this process's part.

    `earlier` (seconds per bucket of every earlier process), `restarts` and `redo_until` (the highest step an
    earlier process reached: steps up to it are done again) are fixed at construction. A previous state that
    `finished` (its training ended normally) starts a new run instead when the run id was derived, not given.
    Construction raises OSError where the files cannot be kept (the ledger then covers this process only).
    """

    def __init__(self, save_dir: str, run_id: str, rank: int, given: bool) -> None:
        directory = Path(save_dir)
        self.path = directory / f"ms_exporter-run-{run_id}-rank{rank}.json"
        self.mark_path = self.path.with_suffix(".step")
        self.run_id = run_id
        self.rank = rank
        self.earlier = [0.0] * len(c.TIME_BUCKETS)
        self.restarts = 0
        self.redo_until = 0
        self.highest = 0
        self.saved_at: float | None = None
        # When the previous process of the run last saved (unix time), where this one restarts it: about when it
        # stopped, so this process's start less it is the time the failure took to be seen and acted on.
        self.previous_saved: float | None = None
        self._mark: mmap.mmap | None = None
        self._key: Path | None = None
        if not directory.is_dir():
            safe_files.make_dir(directory)
        with _KEPT_LOCK:
            key = directory.resolve() / self.path.name
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
        mark = self._read_mark()  # checked also when unused: an unusable file is moved aside, not written through
        if previous is not None and not (previous.finished and not given):
            # A monitor made again in the same process counts the process's time from its start again: only another
            # process's seconds are earlier ones, and only another process is a restart.
            same_process = previous.pid == os.getpid()
            self.earlier = [
                earlier + (0.0 if same_process else seconds)
                for earlier, seconds in zip_strict(previous.earlier, previous.seconds)
            ]
            self.restarts = previous.restarts + (0 if same_process else 1)
            self.previous_saved = None if same_process else previous.saved
            self.redo_until = max(previous.highest, mark)
            self.highest = self.redo_until
        elif previous is not None:
            logger.info(
                "ms_exporter: run %s ended normally before; this process starts it anew (set run_id to continue a run)",
                self.run_id,
            )
        self._mark = _map_mark(self.mark_path, self.highest)

    def _load(self) -> _Previous | None:
        data = self._read(self.path, STATE_LIMIT)
        if data is None:
            return None
        try:
            return _parse(data, self.run_id, self.rank)
        except _Unusable as exc:
            self._move_aside(self.path, "invalid", str(exc))
            return None

    def _read_mark(self) -> int:
        """The step in the mark file; 0 where there is none or it is unusable (then moved aside)."""
        data = self._read(self.mark_path, _MARK.size)
        if data is None:
            return 0
        step = int(_MARK.unpack(data)[0]) if len(data) == _MARK.size else -1
        if len(data) != _MARK.size or not 0 <= step <= MAX_STEP:
            why = (
                f"{len(data)} bytes, not {_MARK.size}"
                if len(data) != _MARK.size
                else f"step {step} is not between 0 and {MAX_STEP}"
            )
            self._move_aside(self.mark_path, "invalid", why)
            return 0
        return step

    def _read(self, path: Path, limit: int) -> bytes | None:
        """The file's bytes; None where there is none, or it was no regular file of at most `limit` bytes (then
        moved aside). Raises OSError where it can be neither read nor moved (the ledger then keeps no files)."""
        try:
            return safe_files.read_small(path, limit)
        except FileNotFoundError:
            return None
        except safe_files.UnsafeFile as exc:
            self._move_aside(path, "unsafe", str(exc))
        except OSError as exc:
            if exc.errno != errno.ELOOP:
                raise
            self._move_aside(path, "symlink", "a symbolic link")
        return None

    def _move_aside(self, path: Path, reason: str, why: str) -> None:
        try:
            aside = safe_files.move_aside(path, reason)
        except OSError as exc:
            raise OSError(
                exc.errno, f"{path} is unusable ({why}) and cannot be moved aside: {exc.strerror}", str(path)
            ) from exc
        logger.warning(
            "ms_exporter: the run state file %s is unusable (%s); moved to %s, and this process starts that file anew",
            path,
            why,
            aside,
        )

    def mark(self, step: int) -> None:
        """A step the run reached (the training thread, at each step end): kept when it is a new highest."""
        if step > self.highest:
            self.highest = step
            if self._mark is not None and 0 <= step <= MAX_STEP:
                _MARK.pack_into(self._mark, 0, step)

    def save(self, seconds: list[float], finished: bool) -> None:
        """This process's seconds per bucket so far; `finished` when its training ended normally. Raises OSError
        (and ValueError for a number JSON cannot hold)."""
        now = time.time()
        state = {
            "format": FORMAT,
            "run_id": self.run_id,
            "rank": self.rank,
            "restarts": self.restarts,
            "highest_step": self.highest,
            "saved": now,
            "finished": finished,
            "earlier_seconds": dict(zip_strict(c.TIME_BUCKETS, self.earlier)),
            "process": {"pid": os.getpid(), "seconds": dict(zip_strict(c.TIME_BUCKETS, seconds))},
        }
        safe_files.replace_file(self.path, (json.dumps(state, indent=1, allow_nan=False) + "\n").encode("utf-8"))
        self.saved_at = now

    def close(self) -> None:
        if self._mark is not None:
            self._mark.close()
            self._mark = None
        if self._key is not None:
            with _KEPT_LOCK:
                _KEPT.discard(self._key)
            self._key = None


def _parse(data: bytes, run_id: str, rank: int) -> _Previous:
    """The checked content of a state file; _Unusable says what is wrong with it."""
    try:
        state = json.loads(data.decode("utf-8"), parse_constant=_no_constant)
    except (ValueError, RecursionError) as exc:  # UnicodeDecodeError and JSONDecodeError are ValueErrors
        raise _Unusable(f"not UTF-8 JSON: {exc}") from None
    if not isinstance(state, dict):
        raise _Unusable("not a JSON object")
    if state.get("format") != FORMAT or state.get("run_id") != run_id:
        raise _Unusable(f"not a format-{FORMAT} state of run {run_id}")
    if "rank" in state and _count(state, "rank", _MAX_PID) != rank:
        raise _Unusable(f"the state of rank {state['rank']}, not {rank}")
    saved = _seconds(state, "saved", 1e11) if "saved" in state else None
    finished = state.get("finished", False)
    if not isinstance(finished, bool):
        raise _Unusable(f"finished: {finished!r} is not true or false")
    process = state.get("process", {})
    if not isinstance(process, dict):
        raise _Unusable(f"process: {_short(process)} is not an object")
    return _Previous(
        restarts=_count(state, "restarts", MAX_RESTARTS),
        highest=_count(state, "highest_step", MAX_STEP) if "highest_step" in state else 0,
        finished=finished,
        earlier=_buckets(state, "earlier_seconds"),
        pid=_count(process, "pid", _MAX_PID) if "pid" in process else None,
        seconds=_buckets(process, "seconds") if "seconds" in process else [0.0] * len(c.TIME_BUCKETS),
        saved=saved,
    )


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is no number a state file holds")


def _count(fields: dict[str, Any], name: str, bound: int) -> int:
    value = fields.get(name)
    if type(value) is not int or not 0 <= value <= bound:
        raise _Unusable(f"{name}: {_short(value)} is not a whole number between 0 and {bound}")
    return value


def _seconds(fields: dict[str, Any], name: str, bound: float) -> float:
    value = fields.get(name)
    if (
        isinstance(value, bool)
        or not isinstance(value, (int, float))
        or not math.isfinite(value)
        or not 0 <= value <= bound
    ):
        raise _Unusable(f"{name}: {_short(value)} is not a number of seconds between 0 and {bound:g}")
    return float(value)


def _buckets(fields: dict[str, Any], name: str) -> list[float]:
    """Seconds per bucket of catalogue.TIME_BUCKETS; a bucket the file does not name has 0, one it names that
    this version does not know is left out."""
    values = fields.get(name)
    if not isinstance(values, dict):
        raise _Unusable(f"{name}: {_short(values)} is not an object of seconds per bucket")
    return [_seconds(values, bucket, MAX_SECONDS) if bucket in values else 0.0 for bucket in c.TIME_BUCKETS]


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


def _map_mark(path: Path, step: int) -> mmap.mmap:
    """The step mark, set to `step` and mapped; raises OSError (a full disk: ENOSPC) where it cannot be made.

    Made as a new file beside the old one and renamed over it: the block is allocated before the mapping exists,
    so a store into it can never fault, and nothing is written through whatever the old name pointed to."""
    descriptor, temporary = safe_files.new_temporary(path)
    try:
        os.posix_fallocate(descriptor, 0, _MARK.size)
        os.pwrite(descriptor, _MARK.pack(step), 0)
        mapped = mmap.mmap(descriptor, _MARK.size)
        try:
            os.replace(temporary, path)
        except BaseException:
            mapped.close()
            raise
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(temporary)
        raise
    finally:
        os.close(descriptor)  # the mapping keeps the file
    return mapped
