"""Opening the monitor's own files so that a planted symlink, a FIFO or a huge file cannot hurt the training.

Every file the monitor writes under save_dir (or the file_sd directory) is opened through here:
- the last path component is never followed when it is a symlink (O_NOFOLLOW): a link planted at a predictable
  name makes the open fail (ELOOP), it never redirects a write to another file of the training user;
- only regular files are read or appended to: a FIFO, a device or a directory is refused at once, without blocking
  (the open itself uses O_NONBLOCK, so a FIFO with no writer cannot hang it);
- reads are bounded (`read_small`): a state file of gigabytes is refused, never read into memory;
- new files are written to a fresh, exclusively created temporary name (mkstemp: O_EXCL, random suffix, mode 0600)
  in the target's own directory, then renamed over the target (rename replaces a link, it does not follow it);
- directories the monitor creates are not world-writable (PRIVATE_DIR_MODE), except the shared file_sd directory,
  which is created sticky (SHARED_DIR_MODE, as /tmp): any user may add targets, none may remove or replace another's.
"""

from __future__ import annotations

import contextlib
import errno
import os
import stat
import tempfile
import time
from pathlib import Path

PRIVATE_DIR_MODE = 0o750
SHARED_DIR_MODE = 0o1777
FILE_MODE = 0o640
_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)
_CLOEXEC = getattr(os, "O_CLOEXEC", 0)
_NONBLOCK = getattr(os, "O_NONBLOCK", 0)


class UnsafeFile(OSError):
    """The path is there but is no regular file the monitor may use (a FIFO, a device, a directory, too large)."""


def make_dir(path: Path | str, shared: bool = False) -> Path:
    """Create `path` (and its parents) if missing; the directories created get PRIVATE_DIR_MODE (SHARED_DIR_MODE
    with `shared`) whatever the umask. An existing directory is left as it is; a symlink in its place is refused."""
    path = Path(path)
    if path.is_symlink():
        raise UnsafeFile(f"{path} is a symlink; the monitor creates its own directories")
    missing = []
    current = path
    while not current.exists() and current != current.parent:
        missing.append(current)
        current = current.parent
    for directory in reversed(missing):
        with contextlib.suppress(FileExistsError):  # another rank made it meanwhile
            directory.mkdir()
            os.chmod(directory, SHARED_DIR_MODE if shared and directory == path else PRIVATE_DIR_MODE)
    if not path.is_dir():
        raise UnsafeFile(f"{path} is not a directory")
    return path


def open_regular(path: Path | str, flags: int, mode: int = FILE_MODE) -> int:
    """os.open with O_NOFOLLOW and O_CLOEXEC that returns a descriptor only for a regular file (blocking mode)."""
    fd = os.open(path, flags | _NOFOLLOW | _CLOEXEC | _NONBLOCK, mode)
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise UnsafeFile(f"{path} is not a regular file")
        if _NONBLOCK:
            os.set_blocking(fd, True)
    except BaseException:
        os.close(fd)
        raise
    return fd


def open_append(path: Path | str) -> int:
    """A descriptor that appends to the regular file `path`, created (FILE_MODE) if missing."""
    return open_regular(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT)


def append_whole(fd: int, data: bytes, what: str, path: Path | str) -> int:
    """Write all of `data` at the end of the file or nothing: after a failed or short write (a full disk) the file
    is cut back to where it was, so no torn record is left. Returns the size the file had before (one writer)."""
    began = os.fstat(fd).st_size
    view = memoryview(data)
    try:
        while view:
            written = os.write(fd, view)
            if written <= 0:
                raise OSError(errno.ENOSPC, f"no space left for {what}", str(path))
            view = view[written:]
    except OSError:
        with contextlib.suppress(OSError):
            os.ftruncate(fd, began)
        raise
    return began


def read_small(path: Path | str, limit: int) -> bytes:
    """The bytes of the regular file `path`; UnsafeFile if it is larger than `limit` bytes or no regular file."""
    fd = open_regular(path, os.O_RDONLY)
    try:
        size = os.fstat(fd).st_size
        if size > limit:
            raise UnsafeFile(f"{path} is {size} bytes, more than the {limit} a state file may have")
        chunks = []
        remaining = limit + 1
        while remaining > 0:
            chunk = os.read(fd, min(remaining, 1 << 20))
            if not chunk:
                break
            chunks.append(chunk)
            remaining -= len(chunk)
        data = b"".join(chunks)
        if len(data) > limit:
            raise UnsafeFile(f"{path} grew past {limit} bytes while being read")
        return data
    finally:
        os.close(fd)


def new_temporary(target: Path | str) -> tuple[int, Path]:
    """An exclusively created, fresh file beside `target` (same directory, so a rename is atomic): (fd, path)."""
    target = Path(target)
    fd, name = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".partial", dir=target.parent)
    return fd, Path(name)


def replace_file(target: Path | str, data: bytes, fsync: bool = False, mode: int = FILE_MODE) -> None:
    """Write `data` to a new temporary file and rename it over `target` (a reader never sees half of it). The file
    gets `mode` (mkstemp makes it 0600): FILE_MODE, or world-readable where another user's process reads it."""
    fd, temporary = new_temporary(target)
    try:
        os.fchmod(fd, mode)
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
            if fsync:
                handle.flush()
                os.fsync(handle.fileno())
        os.replace(temporary, target)
    except BaseException:
        with contextlib.suppress(OSError):
            temporary.unlink()
        raise


def move_aside(path: Path | str, reason: str) -> Path:
    """Rename an unusable state file (or a link, a FIFO) out of the way, keeping it for a look: returns the new path.

    The name says why and when: `<name>.unusable-<unix seconds>-<reason>`."""
    path = Path(path)
    safe_reason = "".join(c if c.isalnum() else "-" for c in reason)[:40]
    aside = path.with_name(f"{path.name}.unusable-{int(time.time())}-{safe_reason}")
    os.replace(path, aside)
    return aside
