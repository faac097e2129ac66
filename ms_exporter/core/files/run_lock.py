"""Which process owns a rank's files in save_dir: one flock'ed lock file per (save_dir, rank).

Two jobs started from one directory (the same save_dir, so the same derived run id, and rank 0 each) would otherwise
rewrite each other's goodput ledger and append to one JSON Lines file. The first process to lock
`save_dir/ms_exporter-rank<r>.lock` owns the rank's files (the goodput ledger `ms_exporter-run-*-rank<r>.*` and
`metrics-rank<r>.jsonl`); another process that comes while it lives is told so (a WARNING with the owner's pid and
host, which the owner writes into the lock file) and gets `suffix` (`-pid<its pid>`) for the files it writes.

The lock is flock(2): the kernel drops it when the process ends, however it ends, so a crashed process never
leaves a stale lock. The monitors of one process share the process's claim (counted, released with the last one);
they are kept apart by the in-process checks of the run state and of the JSON Lines writer.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import logging
import os
import socket
import threading
import weakref
from dataclasses import dataclass, field
from pathlib import Path

from ms_exporter.core.files import safe_files

logger = logging.getLogger("ms_exporter")

LOCK_NAME = "ms_exporter-rank{rank}.lock"
_HOLDER_LIMIT = 512  # bytes of the lock file a non-owner reads: "<pid> <host>"


@dataclass
class _Held:
    fd: int
    path: Path
    count: int


_HELD: dict[Path, _Held] = {}  # lock file (its directory resolved) -> this process's lock on it
_WARNED: set[Path] = set()
_GUARD = threading.Lock()


@dataclass(eq=False)
class Claim:
    """This process's claim on a rank's files in save_dir.

    `owner`: the files are this process's (also when the lock could not be taken at all: then nothing can be
    told, and the monitor behaves as before the lock existed). `suffix`: '' for the owner, `-pid<pid>` for the
    process that came second, to put into the names of the files it writes. `holder`: who owns them, for a
    non-owner ("pid 1234 on host a"). Call release() when done (the monitor's close); a claim that is collected
    unreleased releases itself.
    """

    owner: bool
    suffix: str
    path: Path
    holder: str = ""
    _release: weakref.finalize | None = field(default=None, repr=False)

    def release(self) -> None:
        if self._release is not None:
            self._release()


def claim(save_dir: str | Path, rank: int) -> Claim:
    """Claim rank `rank`'s files in `save_dir` (creating the directory if missing); never raises."""
    path = Path(save_dir) / LOCK_NAME.format(rank=rank)
    with _GUARD:
        try:
            if not Path(save_dir).is_dir():
                safe_files.make_dir(save_dir)
            key = path.parent.resolve() / path.name
            held = _HELD.get(key)
            if held is None:
                fd = _lock(path)
                if fd is not None:
                    held = _HELD[key] = _Held(fd, path, 0)
                    _write_holder(fd)
        except OSError as exc:
            if path not in _WARNED:
                _WARNED.add(path)
                logger.warning(
                    "ms_exporter: cannot lock %s (%s): a second process on this save_dir and rank would "
                    "not be told apart from this one",
                    path,
                    exc,
                )
            return Claim(owner=True, suffix="", path=path)
        if held is not None:
            held.count += 1
            owned = Claim(owner=True, suffix="", path=path)
            owned._release = weakref.finalize(owned, _release, key)
            return owned
    holder = _holder(path)
    suffix = f"-pid{os.getpid()}"
    with _GUARD:
        first = key not in _WARNED
        _WARNED.add(key)
    if first:
        logger.warning(
            "ms_exporter: rank %d's files in %s (the goodput ledger ms_exporter-run-*-rank%d.*, "
            "metrics-rank%d.jsonl) belong to another process (%s; lock file %s) that uses the same "
            "save_dir and rank: this process (pid %d) leaves them alone and names the files it writes "
            "with %r; give each job a save_dir of its own",
            rank,
            save_dir,
            rank,
            rank,
            holder,
            path,
            os.getpid(),
            suffix,
        )
    return Claim(owner=False, suffix=suffix, path=path, holder=holder)


def _lock(path: Path) -> int | None:
    """A descriptor holding the lock on `path`; None when another process holds it."""
    for _ in range(5):
        try:
            fd = safe_files.open_regular(path, os.O_RDWR | os.O_CREAT)
        except OSError as exc:  # a link, a FIFO or a directory at the lock's name: out of the way, once
            if not (isinstance(exc, safe_files.UnsafeFile) or exc.errno == errno.ELOOP):
                raise
            aside = safe_files.move_aside(path, "not-a-lock-file")
            logger.warning("ms_exporter: %s was no regular file (%s); moved to %s", path, exc, aside)
            continue
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            return None
        except BaseException:
            os.close(fd)
            raise
        # The owner removes the file when it lets go: a lock taken on the file it just removed guards nothing.
        if _same_file(fd, path):
            return fd
        os.close(fd)
    raise OSError(errno.EAGAIN, "the lock file kept changing", str(path))


def _same_file(fd: int, path: Path) -> bool:
    try:
        named = os.stat(path, follow_symlinks=False)
    except FileNotFoundError:
        return False
    opened = os.fstat(fd)
    return (named.st_dev, named.st_ino) == (opened.st_dev, opened.st_ino)


def _write_holder(fd: int) -> None:
    with contextlib.suppress(OSError):  # only for the other process's warning: a full disk loses nothing else
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()} {socket.gethostname()}\n".encode(errors="replace"), 0)


def _holder(path: Path) -> str:
    try:
        pid, host = safe_files.read_small(path, _HOLDER_LIMIT).decode("utf-8", "replace").split()
        return f"pid {int(pid)} on host {host}"
    except (OSError, ValueError):
        return "a process that did not say which"


def _after_fork_in_child() -> None:
    """A forked child shares the parent's lock (flock belongs to the open file, which fork shares): its copies are
    closed, so the lock ends with the parent, and the child's exit (its finalizers) never removes the parent's
    lock file. A monitor the child builds claims anew and is told the parent owns the files."""
    for held in _HELD.values():
        with contextlib.suppress(OSError):
            os.close(held.fd)
    _HELD.clear()
    global _GUARD
    _GUARD = threading.Lock()  # a lock a parent's thread held at the fork stays held in the child


def _release(key: Path) -> None:
    with _GUARD:
        held = _HELD.get(key)
        if held is None:
            return
        held.count -= 1
        if held.count > 0:
            return
        del _HELD[key]
        with contextlib.suppress(OSError):
            if _same_file(held.fd, held.path):  # removed while locked: the next process creates it anew
                os.unlink(held.path)
        os.close(held.fd)


os.register_at_fork(after_in_child=_after_fork_in_child)
