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
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np

FILE_NAME = "skipped-batches.json"
FORMAT_VERSION = 1
MAX_HASHED_ROWS = 65_536  # a batch with more rows than this is recorded by its batch hash alone


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
        try:
            data = json.loads(self.path.read_text(encoding="utf-8"))
        except FileNotFoundError:
            return []
        batches = data.get("batches") if isinstance(data, dict) else None
        if not isinstance(batches, list):
            raise ValueError(f"{self.path}: not a skipped-batches list (expected {{\"batches\": [...]}})")
        return [b for b in batches if isinstance(b, dict)]

    def sample_hashes(self) -> frozenset[str]:
        return frozenset(h for batch in self.read() for h in batch.get("sample_hashes") or ())

    def append(self, entries: Iterable[dict[str, Any]]) -> int:
        """Add `entries`; returns how many the file holds now."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.path.with_name(self.path.name + ".lock"), "a") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            batches = self.read() + list(entries)
            partial = self.path.with_name(f"{self.path.name}.{os.getpid()}.partial")
            with open(partial, "w", encoding="utf-8") as file:
                json.dump({"version": FORMAT_VERSION, "batches": batches}, file, indent=1)
                file.write("\n")
                file.flush()
                os.fsync(file.fileno())
            os.replace(partial, self.path)
        return len(batches)


class _Listed:
    """The listed sample hashes, read again when the file changed."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self._file = SkippedBatches(path)
        self._stamp: tuple[int, int] | None = None
        self.hashes: frozenset[str] = frozenset()
        self.refresh()

    def refresh(self) -> None:
        with contextlib.suppress(FileNotFoundError):
            info = os.stat(self._file.path)
            stamp = (info.st_mtime_ns, info.st_size)
            if stamp != self._stamp:
                self._stamp = stamp
                self.hashes = self._file.sample_hashes()


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
        samples = (source[i] for i in range(len(source))) if hasattr(source, "__getitem__") and hasattr(
            source, "__len__") else iter(source() if callable(source) else source)
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
