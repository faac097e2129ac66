"""A small real disk (tmpfs) that a test can fill, for what the monitor does when writes meet ENOSPC."""

from __future__ import annotations

import contextlib
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
    """Take all but about `leave` bytes of the disk into a filler file."""
    filler = disk / "filler"
    free = os.statvfs(disk).f_bavail * os.statvfs(disk).f_frsize
    with filler.open("ab") as out:
        out.write(b"\0" * max(free - leave, 0))
    return filler
