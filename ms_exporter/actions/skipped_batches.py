"""Poisoned batches: the list actions.rollback writes, and two ways to keep its batches out of training.

When actions.rollback undoes steps, the batches trained since the good state it restores go to
`save_dir/skipped-batches.json` with their step, epoch, position in the epoch and content hashes: the whole batch's
and each sample's (a row of every column). Samples are recognised by content, so a restart, another shuffle or
another batch size does not matter:

- `SkipListedSamples(source, path)`: a GeneratorDataset source that leaves listed samples out;
- `KeepUnlisted(path)`: a `Dataset.filter` predicate for any other source (MindRecord, TFRecord, ...), placed
  after the last `map` and before `batch`.

Both read the list again at every pass (epoch), so what a rollback lists during a run is skipped when the data
comes round again. docs/rollback.md has the recipes and what must hold for the hashes to match.

A file that holds no list (not JSON, another shape, a link, too large): the monitor moves it aside
(`skipped-batches.json.unusable-<time>-corrupt`) with a warning and starts a new one, so that a rollback is still
listed; the two helpers raise a ValueError that names the file and what is wrong when they are made (in the data
pipeline's setup), and keep the list they have, with a warning, when a later pass finds the file so.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import hashlib
import json
import logging
import os
import re
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from ms_exporter.core.files.safe_files import UnsafeFile, make_dir, move_aside, open_append, read_small, replace_file

logger = logging.getLogger("ms_exporter")

FILE_NAME = "skipped-batches.json"
FORMAT_VERSION = 1
MAX_HASHED_ROWS = 65_536  # a batch with more rows than this is recorded by its batch hash alone
MAX_FILE_BYTES = 1 << 30  # a larger file is not read into memory: it is no list this module wrote


class CorruptList(ValueError):
    """The file is there but holds no skipped-batches list; the message names the file and what is wrong."""


def sample_hash(columns: Sequence[Any]) -> str:
    """The content hash of one sample: each column's dtype, shape and bytes (a batch row hashes the same as the
    sample it was stacked from)."""
    digest = hashlib.blake2b(digest_size=16)
    for column in columns:
        array = np.ascontiguousarray(np.asarray(column))
        digest.update(f"{array.dtype.str}{array.shape}".encode())
        digest.update(array.tobytes())
    return digest.hexdigest()


def batch_identity(step: int, epoch: int, position: int | None, columns: Sequence[np.ndarray] | None) -> dict[str, Any]:
    """One batch as the list records it; without its columns (sink mode) only where it was."""
    identity: dict[str, Any] = {"step": step, "epoch": epoch, "position": position}
    if columns:
        identity["batch_hash"] = sample_hash(columns)
        rows = len(columns[0]) if np.ndim(columns[0]) else 0
        if 0 < rows <= MAX_HASHED_ROWS and all(np.ndim(c) and len(c) == rows for c in columns):
            identity["sample_hashes"] = [sample_hash([c[i] for c in columns]) for i in range(rows)]
    return identity


class SkippedBatches:
    """The list file. Appends are atomic (a new file renamed over the old) and serialised between the ranks that
    share a save_dir by a lock file beside it."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        """`path`: the file (a name ending in .json), or the save_dir that holds skipped-batches.json."""
        path = Path(path)
        self.path = path if path.suffix == ".json" else path / FILE_NAME

    def read(self) -> list[dict[str, Any]]:
        """The listed batches ([] without a file); CorruptList (a ValueError) for a file that holds no list."""
        try:
            raw = read_small(self.path, MAX_FILE_BYTES)  # never through a link, never a FIFO
        except FileNotFoundError:
            return []
        except UnsafeFile as exc:
            raise self._corrupt(str(exc)) from exc
        except OSError as exc:
            if exc.errno == errno.ELOOP:
                raise self._corrupt("a symbolic link, not the file ms_exporter writes") from exc
            raise
        try:
            data = json.loads(raw)
        except (UnicodeDecodeError, json.JSONDecodeError) as exc:
            raise self._corrupt(f"not valid JSON: {exc}") from exc
        batches = data.get("batches") if isinstance(data, dict) else None
        if not isinstance(batches, list):
            raise self._corrupt('expected {"batches": [...]}')
        return [b for b in batches if isinstance(b, dict)]

    def _corrupt(self, what: str) -> CorruptList:
        return CorruptList(
            f"{self.path}: not a skipped-batches list ({what}); move it away or delete it to start a new list"
        )

    def sample_hashes(self) -> frozenset[str]:
        return frozenset(h for batch in self.read() for h in batch.get("sample_hashes") or ())

    def append(self, entries: Iterable[dict[str, Any]]) -> int:
        """Add `entries`; returns how many the file holds now. A file that holds no list is moved aside (said in
        the log) and a new list started: what a rollback undid is listed whatever came before."""
        make_dir(self.path.parent)
        lock = self._lock()
        try:
            fcntl.flock(lock, fcntl.LOCK_EX)
            try:
                batches = self.read()
            except CorruptList as exc:
                aside = move_aside(self.path, "corrupt")
                logger.warning("ms_exporter: %s; moved aside to %s, a new list starts", exc, aside.name)
                batches = []
            batches += list(entries)
            data = json.dumps({"version": FORMAT_VERSION, "batches": batches}, indent=1) + "\n"
            replace_file(self.path, data.encode("utf-8"), fsync=True)  # a fresh temporary, renamed over the list
        finally:
            os.close(lock)
        return len(batches)

    def _lock(self) -> int:
        path = self.path.with_name(self.path.name + ".lock")
        try:
            return open_append(path)
        except OSError as exc:  # a link or a FIFO planted at the lock's name: out of the way, then ours
            if exc.errno != errno.ELOOP and not isinstance(exc, UnsafeFile):
                raise
            logger.warning(
                "ms_exporter: %s is no lock file (%s); moved aside to %s",
                path,
                exc,
                move_aside(path, "not-a-file").name,
            )
            return open_append(path)

    def remove_leftovers(self, started: float) -> list[Path]:
        """Remove the temporaries of appends that never finished (their process was killed): those older than
        this process (`started`, a time.time()), of any rank, since a live rank's temporary lives a moment."""
        removed: list[Path] = []
        directory = self.path.parent
        if directory.is_symlink() or not directory.is_dir():
            return removed
        name = re.escape(self.path.name)
        # new_temporary's names, and the <name>.<n>.partial that older versions wrote
        leftover = re.compile(rf"^(\.{name}\..+|{name}\.\d+)\.partial$")
        for entry in os.scandir(directory):
            if leftover.match(entry.name) and entry.stat(follow_symlinks=False).st_mtime < started:
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(entry.path)
                    removed.append(Path(entry.path))
        return removed


class _Listed:
    """The listed sample hashes, read again when the file changed. Made with a file that holds no list: a
    ValueError naming it; a later read that finds it so keeps the hashes read before, with a warning."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self._file = SkippedBatches(path)
        self._stamp: tuple[int, int] | None = None
        self.hashes: frozenset[str] = frozenset()
        self.refresh(strict=True)

    def refresh(self, strict: bool = False) -> None:
        with contextlib.suppress(FileNotFoundError):
            info = os.stat(self._file.path)
            stamp = (info.st_mtime_ns, info.st_size)
            if stamp != self._stamp:
                self._stamp = stamp
                try:
                    self.hashes = self._file.sample_hashes()
                except (CorruptList, OSError) as exc:
                    if strict:  # made in the data pipeline's setup: say what is wrong there and then
                        raise
                    logger.warning(
                        "ms_exporter: %s; the %d samples listed before are still left out", exc, len(self.hashes)
                    )


class SkipListedSamples:
    """A GeneratorDataset source that yields `source`'s samples except the listed ones:
    `GeneratorDataset(SkipListedSamples(source, save_dir), column_names=[...])`. `source` is what GeneratorDataset
    would take (an iterable of samples, or an object with __getitem__ and __len__); each sample is a tuple of
    columns (or one column)."""

    def __init__(self, source: Any, listed: str | os.PathLike[str]) -> None:
        self._source = source
        self._listed = _Listed(listed)
        self.skipped = 0  # samples left out in the latest pass

    def __iter__(self) -> Iterator[Any]:
        # MindSpore reads an iterable source once more to count it (it has no __len__: what is left out is only
        # known by reading); each pass sees the list as it is then.
        self._listed.refresh()
        self.skipped = 0
        hashes = self._listed.hashes
        source = self._source
        samples = (
            (source[i] for i in range(len(source)))
            if hasattr(source, "__getitem__") and hasattr(source, "__len__")
            else iter(source() if callable(source) else source)
        )
        for sample in samples:
            columns = sample if isinstance(sample, tuple) else (sample,)
            if hashes and sample_hash(columns) in hashes:
                self.skipped += 1
                continue
            yield sample


class KeepUnlisted:
    """A `Dataset.filter` predicate that drops listed samples:
    `dataset.filter(KeepUnlisted(save_dir), input_columns=[...every column, in order...])` before `batch`."""

    def __init__(self, listed: str | os.PathLike[str]) -> None:
        self._listed = _Listed(listed)
        self._calls = 0

    def __call__(self, *columns: Any) -> bool:
        self._calls += 1
        if self._calls % 1024 == 1:  # a stat per 1,024 samples: a new list is seen within a few batches
            self._listed.refresh()
        return not self._listed.hashes or sample_hash(columns) not in self._listed.hashes
