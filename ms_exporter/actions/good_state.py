"""The good states actions.rollback keeps: every Parameter of the train network (weights, the optimizer's moments
and step counter, a loss-scale cell's scale and counters), as host copies or as files.

Restoring writes each value into the Parameter's own memory with ops.assign, which the compiled graph reads
(set_data may hand the Parameter new memory that a graph compiled earlier does not see: docs/development.md).

Files are per run, rank and process (`good-<run>-rank<r>-pid<p>-step<s>-<n>.npz` in save_dir/good-states), written
through ms_exporter.core.safe_files (an exclusive temporary, renamed): a planted link is replaced, never followed.
A file that cannot be read back is removed and the next older state is tried. At the start, what earlier processes
of the same run and rank left there is removed (docs/reliability.md, "Round two: actions that fail alone").
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import time
import zipfile
from collections import deque
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO

import numpy as np

from ms_exporter.core.compat import zip_strict
from ms_exporter.core.safe_files import make_dir, new_temporary, open_regular

logger = logging.getLogger("ms_exporter")

STATE_DIR = "good-states"
_LEGACY_PARTIAL = re.compile(r"^good-step\d+-\d+\.npz\.partial$")  # the temporaries of ms_exporter before round two


@dataclass
class GoodState:
    step: int
    nbytes: int
    arrays: list[np.ndarray] | None  # in host memory, or
    path: Path | None  # an .npz file of arrays p0, p1, ... in parameter order
    seconds: float  # what taking it cost


def _host_copy(parameter: Any) -> np.ndarray:
    try:
        return np.array(parameter.asnumpy(), copy=True)  # asnumpy may share the Parameter's host memory
    except TypeError:  # a dtype numpy lacks (bfloat16): kept as float32, cast back when restored
        import mindspore

        return np.array(parameter.astype(mindspore.float32).asnumpy(), copy=True)


class GoodStates:
    """The newest `max_kept` good states of one train network. `storage`: memory, disk or auto (memory while a
    state is at most `memory_limit` bytes). `owner` (`<run>-rank<r>`) names this rank's files among those of the
    other ranks and runs that share the directory."""

    def __init__(
        self, storage: str, memory_limit: float, directory: Path, max_kept: int, owner: str = "run-rank0"
    ) -> None:
        self._storage = storage
        self._memory_limit = memory_limit
        self._directory = directory
        self._kept: deque[GoodState] = deque()
        self._max_kept = max_kept
        self._parameters: list[Any] = []
        self.names: list[str] = []
        self._taken = 0
        self._prefix = f"good-{owner}-pid"

    def bind(self, train_network: Any, leave_out: tuple[Any, ...] = (), optimizer: Any = None) -> None:
        """Every Parameter of the network once (a shared one is listed once), then the optimizer's that the network
        does not hold (a loop of the script's own hands both; a train cell holds its optimizer), less `leave_out`
        (the optimizer's fixed learning rate, which lr_backoff owns) and the monitor's own (named ms_exporter_*)."""
        seen: set[int] = {id(p) for p in leave_out}
        self._parameters, self.names = [], []
        holders = [train_network, *([optimizer] if optimizer is not None else [])]
        for holder in holders:
            for name, parameter in holder.parameters_and_names():
                if id(parameter) in seen or parameter.name.startswith("ms_exporter_"):
                    continue
                seen.add(id(parameter))
                self._parameters.append(parameter)
                self.names.append(name)
        self._forget()

    @property
    def nbytes(self) -> int:
        return int(sum(p.nbytes for p in self._parameters))

    @property
    def newest(self) -> GoodState | None:
        return self._kept[-1] if self._kept else None

    @property
    def kept_steps(self) -> list[int]:
        return [state.step for state in self._kept]

    @property
    def where(self) -> str:
        if self._storage == "auto":
            return "memory" if self.nbytes <= self._memory_limit else "disk"
        return self._storage

    def capture(self, step: int) -> GoodState:
        """Keep the state the Parameters hold now. On a failure (a full disk) nothing is kept, no temporary is
        left behind, and the states kept before stay."""
        began = time.perf_counter()
        arrays = [_host_copy(p) for p in self._parameters]
        nbytes = int(sum(a.nbytes for a in arrays))
        path = None
        if self.where == "disk":
            make_dir(self._directory)
            self._taken += 1  # the same step may be kept twice (a train call that starts again there)
            path = self._directory / f"{self._prefix}{os.getpid()}-step{step:012d}-{self._taken}.npz"
            fd, temporary = new_temporary(path)
            try:
                with os.fdopen(fd, "wb") as file:
                    _write_npz(file, arrays)
                os.replace(temporary, path)  # replaces a link planted at the name, never follows it
            except BaseException:
                with contextlib.suppress(OSError):
                    temporary.unlink()
                raise
        kept = arrays if path is None else None
        state = GoodState(step, nbytes, kept, path, time.perf_counter() - began)
        self._kept.append(state)
        while len(self._kept) > self._max_kept:
            _remove(self._kept.popleft())
        return state

    def restore_newest(self) -> GoodState | None:
        """Write the newest state that can be read back into the Parameters the compiled graph uses; None when
        none can. A file that cannot be read (truncated, replaced, gone) is removed, said in the log, and the
        state before it is tried."""
        while self._kept:
            state = self._kept[-1]
            try:
                arrays = self._arrays_of(state)
            except Exception as exc:  # a truncated zip raises BadZipFile, EOFError, ValueError, KeyError ...
                self._kept.pop()
                _remove(state)
                older = f"trying the one of step {self._kept[-1].step}" if self._kept else "no older one is kept"
                logger.warning(
                    "ms_exporter: rollback: the good state of step %d (%s) cannot be read back (%r); it is removed, %s",
                    state.step,
                    state.path,
                    exc,
                    older,
                )
                continue
            self._assign(arrays)
            return state
        return None

    def restore(self, state: GoodState) -> None:
        """Write `state` into the Parameters the compiled graph uses."""
        self._assign(self._arrays_of(state))

    def _arrays_of(self, state: GoodState) -> list[np.ndarray]:
        """Every array of `state`, all read before any is written (a file that fails half way changes nothing)."""
        if state.arrays is not None:
            return state.arrays
        if state.path is None:
            raise ValueError(f"the good state of step {state.step} has neither arrays nor a file")
        with os.fdopen(open_regular(state.path, os.O_RDONLY), "rb") as file, np.load(file) as saved:
            arrays = [np.asarray(saved[f"p{i}"]) for i in range(len(self._parameters))]
            if len(saved.files) != len(arrays):
                raise ValueError(f"{len(saved.files)} arrays for {len(arrays)} parameters")
        for array, parameter in zip_strict(arrays, self._parameters):
            if tuple(array.shape) != tuple(parameter.shape):
                raise ValueError(f"an array of shape {array.shape} for {parameter.name} of shape {parameter.shape}")
        return arrays

    def _assign(self, arrays: list[np.ndarray]) -> None:
        from mindspore import Tensor, ops

        for parameter, array in zip_strict(self._parameters, arrays):
            value = Tensor(array)
            if value.dtype != parameter.dtype:
                value = value.astype(parameter.dtype)
            ops.assign(parameter, value)

    def remove_leftovers(self, started: float) -> list[Path]:
        """Remove what earlier processes of this run and rank left in the directory (they were killed before
        close): their good states and temporaries, and temporaries of ms_exporter before round two older than
        this process (`started`, a time.time()). Files of other ranks and runs, and of this process, stay."""
        removed: list[Path] = []
        if self._directory.is_symlink() or not self._directory.is_dir():
            return removed
        ours = re.compile(rf"^\.?{re.escape(self._prefix)}(\d+)-step\d+-\d+\.npz(\..+\.partial)?$")
        for entry in os.scandir(self._directory):
            match = ours.match(entry.name)
            older = entry.stat(follow_symlinks=False).st_mtime < started
            # Another pid of this run and rank is an earlier process; this pid's files older than this process
            # are of an earlier one that had the same pid (a restarted container).
            earlier = (
                (match.group(1) != str(os.getpid()) or older)
                if match
                else bool(_LEGACY_PARTIAL.match(entry.name)) and older
            )
            if earlier:
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(entry.path)
                    removed.append(Path(entry.path))
        return removed

    def _forget(self) -> None:
        for state in self._kept:
            _remove(state)
        self._kept.clear()

    def close(self) -> None:
        self._forget()


def _write_npz(file: BinaryIO, arrays: list[np.ndarray]) -> None:
    """What np.savez writes (arrays p0, p1, ... uncompressed), with the archive closed on a failure too: np.savez
    leaves it open when a write fails (a full disk), to fail again when collected, after the file is closed."""
    with zipfile.ZipFile(file, mode="w", compression=zipfile.ZIP_STORED, allowZip64=True) as archive:
        for i, array in enumerate(arrays):
            with archive.open(f"p{i}.npy", mode="w", force_zip64=True) as member:
                np.lib.format.write_array(member, np.asanyarray(array), allow_pickle=False)


def _remove(state: GoodState) -> None:
    if state.path is not None:
        with contextlib.suppress(OSError):
            state.path.unlink()
