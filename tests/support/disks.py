"""A small real disk (tmpfs) that a test or a benchmark can fill, for what the monitor does when writes meet ENOSPC."""

from __future__ import annotations

import contextlib
import errno
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

DISK_BYTES = 64 * 1024


@contextlib.contextmanager
def mounted_tmpfs(where: Path, size: int = DISK_BYTES) -> Iterator[str | None]:
    """A tmpfs of `size` bytes at `where` (created); yields None when mounted, else why not (mounting needs root,
    which CI has: it installs Debian packages). A benchmark reports why not; a test skips (small_disk)."""
    where.mkdir()
    mounted = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(where)], capture_output=True, text=True, check=False
    )
    if mounted.returncode != 0:
        yield f"cannot mount a tmpfs here: {mounted.stderr.strip()}"
        return
    try:
        yield None
    finally:
        subprocess.run(["umount", "-l", str(where)], check=False)


@contextlib.contextmanager
def small_disk(where: Path, size: int = DISK_BYTES) -> Iterator[Path]:
    """A 64 KiB tmpfs mounted at `where`; the test is skipped where it cannot be mounted."""
    import pytest  # only tests skip: benchmarks import this module without pytest

    with mounted_tmpfs(where, size) as why_not:
        if why_not is not None:
            pytest.skip(why_not)
        yield where


def fill(disk: Path, leave: int = 0) -> Path:
    """Take all but about `leave` bytes of the disk into a filler file; with `leave` 0, every byte (written until
    the disk says ENOSPC). A thread of the process under test may write meanwhile (the goodput saver): the disk
    filling up before the filler is done is what was asked for."""
    filler = disk / "filler"
    free = os.statvfs(disk).f_bavail * os.statvfs(disk).f_frsize
    wanted = max(free - leave, 0) if leave else None
    fd = os.open(filler, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    try:
        while wanted is None or wanted > 0:
            try:
                written = os.write(fd, b"\0" * (4096 if wanted is None else min(wanted, 4096)))
            except OSError as exc:
                if exc.errno != errno.ENOSPC:
                    raise
                break
            if wanted is not None:
                wanted -= written
    finally:
        os.close(fd)
    return filler
