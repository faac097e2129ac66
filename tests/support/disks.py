"""A small real disk (tmpfs) that a test can fill, for what the monitor does when writes meet ENOSPC."""

from __future__ import annotations

import contextlib
import errno
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

DISK_BYTES = 64 * 1024


@contextlib.contextmanager
def small_disk(where: Path, size: int = DISK_BYTES) -> Iterator[Path]:
    """A 64 KiB tmpfs mounted at `where` (needs root, which CI has: it installs Debian packages)."""
    where.mkdir()
    mounted = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(where)], capture_output=True, text=True, check=False
    )
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {mounted.stderr.strip()}")
    try:
        yield where
    finally:
        subprocess.run(["umount", "-l", str(where)], check=False)


def fill(disk: Path, leave: int) -> Path:
    """Take all but about `leave` bytes of the disk into a filler file. A thread of the process under test may
    write meanwhile (the goodput saver): the disk filling up before the filler is done is what was asked for."""
    filler = disk / "filler"
    free = os.statvfs(disk).f_bavail * os.statvfs(disk).f_frsize
    wanted = max(free - leave, 0)
    fd = os.open(filler, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    try:
        while wanted > 0:
            try:
                wanted -= os.write(fd, b"\0" * min(wanted, 4096))
            except OSError as exc:
                if exc.errno != errno.ENOSPC:
                    raise
                break
    finally:
        os.close(fd)
    return filler
