"""The good states actions.rollback keeps: every Parameter of the train network (weights, the optimizer's moments
and step counter, a loss-scale cell's scale and counters), kept the way a checkpoint is, at the cost of its job.

Taking one (`capture`, on the training thread) copies each Parameter on the device where it lives into memory of
its own: ops.assign into a new tensor of the same shape and dtype (Tensor.copy_ where the backend's Assign lacks the
dtype: bfloat16 on CPU). The bytes are copied as they are (bfloat16 stays bfloat16); nothing crosses to the host, and
the copy is queued behind the step that wrote the Parameters, before the next step changes them. A copy never
shares the Parameter's memory (asnumpy would on CPU), so training on changes nothing kept.

- memory: the device copies are the state. They hold device memory: (max_kept + 1) states at most (the newest is
  taken before the oldest is let go; the oldest's memory is then reused for the next one), which `auto` keeps within
  memory_limit_mb.
- disk: a background thread (`ms_exporter-good-state`) moves the copies to the host one Parameter at a time
  (asnumpy), writes them into an uncompressed .npz and lets each device copy go once written, as MindSpore's
  asynchronous checkpoint save does. One write at a time: a keep is not taken while the one before is still being
  written (`writing`; the rollback keeps at the next quiet step instead, never waiting), so disk storage holds at
  most one state's device copy. A state counts as kept once its file is complete
  (`finished` reports each write that ended); a write that fails (a full disk) keeps nothing, leaves no temporary,
  and the states kept before stay. A restore that needs the state being written waits for it (write_wait seconds
  at most, then the older state is tried).
  Each file holds p0, p1, ... in parameter order and `dtypes`, each Parameter's MindSpore dtype. numpy has no
  bfloat16 (MindSpore's numpy type for it is written by np.save as two raw bytes, `|V2`, and its dtype is lost), so
  a bfloat16 Parameter is stored as its raw bits, uint16, and read back into a bfloat16 tensor bit for bit. Where
  MindSpore's numpy bfloat16 type is missing (a numpy of another major version than MindSpore was built with), the
  device copy of a bfloat16 Parameter is widened to float32 instead and cast back when restored: every number comes
  back bit for bit, a NaN as a NaN (its payload is not kept).

Restoring writes each value into the Parameter's own memory with ops.assign (Tensor.copy_ where the backend's Assign
lacks the dtype, also in place), which the compiled graph reads: set_data may hand the Parameter new memory that a
graph compiled earlier does not see (docs/development.md).

Files are per run, rank and process (`good-<run>-rank<r>-pid<p>-step<s>-<n>.npz` in save_dir/good-states), written
through ms_exporter.core.files.safe_files (an exclusive temporary, renamed): a planted link is replaced, never followed.
A file that cannot be read back is removed and the next older state is tried. At the start, what earlier processes
of the same run and rank left there is removed (docs/reliability.md, "Actions that fail alone").
"""

from __future__ import annotations

import contextlib
import logging
import math
import os
import re
import threading
import time
import zipfile
from collections import deque
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, BinaryIO

import numpy as np

from ms_exporter.core.compat import zip_strict
from ms_exporter.core.files.safe_files import make_dir, new_temporary, open_regular

logger = logging.getLogger("ms_exporter")

STATE_DIR = "good-states"
# The longest a restore waits for a state still being written (then the state before is restored): a rollback is
# rare, and a file written since the last good step is usually a few seconds from done. A keep never waits.
WRITE_WAIT_SECONDS = 60.0
_BFLOAT16 = "BFloat16"  # str() of MindSpore's dtype
_DTYPES = "dtypes"  # the archive member that records each Parameter's dtype
_LEGACY_PARTIAL = re.compile(r"^good-step\d+-\d+\.npz\.partial$")  # older versions' temporaries: no run, rank or pid


@dataclass(eq=False)  # a state is itself, not its values (actions.rollback maps states in flight)
class GoodState:
    step: int
    nbytes: int  # device bytes of the Parameters it holds
    tensors: list[Any] | None  # device copies in parameter order (memory), or
    path: Path | None  # an .npz file (disk): p0, p1, ... in parameter order and their dtypes
    seconds: float  # the training thread's share of taking it: the device copies (and a wait for the write before)
    written: threading.Event = field(default_factory=lambda: _event(True))  # disk: set when its write ended
    error: BaseException | None = None  # disk: why the write failed (then the state is not kept)
    write_seconds: float = math.nan  # disk: the background thread's time to move it to the host and write it
    abandoned: bool = False  # disk: let go while being written; the writer removes what it wrote


def _event(is_set: bool) -> threading.Event:
    event = threading.Event()
    if is_set:
        event.set()
    return event


class _Abandoned(Exception):
    """The state being written was let go (close, another network): the write stops."""


def _numpy_bfloat16() -> Any:
    """MindSpore's numpy type for bfloat16, or None where the numpy installed is not the major version MindSpore was
    built with."""
    try:
        from mindspore.common import np_dtype
    except ImportError:
        return None
    return getattr(np_dtype, "bfloat16", None)


def _host_array(tensor: Any) -> np.ndarray:
    """The tensor's bytes on the host (asnumpy copies them from a device; on CPU it shares the tensor's memory, which
    is a copy of our own); a bfloat16 tensor's as raw uint16 bits."""
    array = np.asarray(tensor.asnumpy())
    return array.view(np.uint16) if str(tensor.dtype) == _BFLOAT16 else array


def _device_value(array: np.ndarray, dtype: str, parameter: Any) -> Any:
    """A tensor of the Parameter's dtype with the values `array` holds for it (raw bits for bfloat16)."""
    from mindspore import Tensor

    if dtype == _BFLOAT16 and array.dtype == np.uint16:  # raw bits: written where MindSpore's numpy type is there
        bfloat16 = _numpy_bfloat16()
        if bfloat16 is None:
            raise ValueError("raw bfloat16 bits, and MindSpore's numpy type for them is missing")
        return Tensor(array.view(bfloat16))
    value = Tensor(array)  # a bfloat16 widened to float32 (where the numpy type is missing) is cast back below
    return value if value.dtype == parameter.dtype else value.astype(parameter.dtype)


class GoodStates:
    """The newest `max_kept` good states of one train network. `storage`: memory (device copies), disk (files written
    by a background thread) or auto (memory while max_kept + 1 states fit in `memory_limit` bytes). `owner`
    (`<run>-rank<r>`) names this rank's files among those of the other ranks and runs that share the directory.
    `write_wait`: the longest a restore (or a capture the caller did not hold back while `writing`) waits for a file
    being written."""

    def __init__(
        self,
        storage: str,
        memory_limit: float,
        directory: Path,
        max_kept: int,
        owner: str = "run-rank0",
        write_wait: float = WRITE_WAIT_SECONDS,
    ) -> None:
        self._storage = storage
        self._memory_limit = memory_limit
        self._directory = directory
        self._kept: deque[GoodState] = deque()
        self._max_kept = max_kept
        self._parameters: list[Any] = []
        self._nbytes = 0
        self.names: list[str] = []
        self._taken = 0
        self._prefix = f"good-{owner}-pid"
        self._write_wait = write_wait
        self._writing: GoodState | None = None  # the disk state in flight
        self._ended: list[GoodState] = []  # disk states whose write ended, not yet reported by finished()
        self._spare: list[Any] | None = None  # the device memory of the memory state let go last, for the next one
        self._lacking: set[tuple[str, str]] = set()  # (operation, dtype) the backend has no kernel for
        self._lock = threading.Lock()  # a write's rename against letting it go

    def bind(self, train_network: Any, leave_out: tuple[Any, ...] = (), optimizer: Any = None) -> None:
        """Every Parameter of the network once (a shared one is listed once), then the optimizer's that the network
        does not hold (a loop of the script's own hands both; a train cell holds its optimizer), less `leave_out`
        (the optimizer's fixed learning rate, which lr_backoff owns) and the monitor's own (named ms_exporter_*)."""
        self._forget()
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
        self._nbytes = int(sum(p.nbytes for p in self._parameters))

    @property
    def nbytes(self) -> int:
        """The device bytes of one state: every Parameter bound, moments included."""
        return self._nbytes

    @property
    def newest(self) -> GoodState | None:
        """The newest state, the one being written included."""
        return self._writing or (self._kept[-1] if self._kept else None)

    @property
    def kept_steps(self) -> list[int]:
        """The steps of the states kept (a state being written is not kept yet)."""
        return [state.step for state in self._kept]

    @property
    def writing(self) -> bool:
        """Whether a state is still being written: a keep now would wait for it."""
        return self._writing is not None and not self._writing.written.is_set()

    @property
    def where(self) -> str:
        if self._storage == "auto":
            return "memory" if (self._max_kept + 1) * self._nbytes <= self._memory_limit else "disk"
        return self._storage

    def capture(self, step: int) -> GoodState:
        """Take the state the Parameters hold now: device copies, kept at once (memory) or written to a file by the
        background thread (disk). A keep that fails at once (no device memory, no directory) keeps nothing and leaves
        the states kept before; a write that fails later is reported by `finished`."""
        began = time.perf_counter()
        if self._writing is not None:  # one device copy in flight at a time
            self._wait_for(self._writing)
            if self._writing is not None:
                raise TimeoutError(
                    f"the good state of step {self._writing.step} is still being written after {self._write_wait:g} s"
                )
        disk = self.where == "disk"
        copies = self._copies(widen_bfloat16=disk and _numpy_bfloat16() is None)
        if disk:
            state = self._start_write(step, copies)
        else:
            state = GoodState(step, self._nbytes, copies, None, math.nan)
            self._keep(state)
        state.seconds = time.perf_counter() - began
        return state

    def finished(self, wait: float = 0.0) -> list[GoodState]:
        """The disk states whose write ended since the last call, oldest first: kept, or not (their `error` says
        why). `wait`: seconds to wait first for the write in flight."""
        if self._writing is not None:
            if wait > 0:
                self._writing.written.wait(wait)
            self._settle()
        ended, self._ended = self._ended, []
        return ended

    def restore_newest(self) -> GoodState | None:
        """Write the newest state that can be read back into the Parameters the compiled graph uses; None when
        none can. The state being written is waited for (write_wait at most); one whose write failed or that
        cannot be read (truncated, replaced, gone) is removed, said in the log, and the state before it is tried."""
        writing = self._writing
        if writing is not None:
            self._wait_for(writing)
            if writing.error is not None or writing is self._writing:
                why = (
                    f"could not be written ({writing.error!r})"
                    if writing.error is not None
                    else f"is still being written after {self._write_wait:g} s"
                )
                logger.warning(
                    "ms_exporter: rollback: the good state of step %d %s; %s",
                    writing.step,
                    why,
                    f"trying the one of step {self._kept[-1].step}" if self._kept else "no older one is kept",
                )
        while self._kept:
            state = self._kept[-1]
            try:
                values = self._values_of(state)
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
            self._assign(values)
            return state
        return None

    def restore(self, state: GoodState) -> None:
        """Write `state` into the Parameters the compiled graph uses (a state being written: once it is)."""
        if not state.written.is_set():
            self._wait_for(state)
            if not state.written.is_set():
                raise TimeoutError(f"the good state of step {state.step} is still being written")
        if state.error is not None:
            raise state.error
        self._assign(self._values_of(state))

    def _copies(self, widen_bfloat16: bool = False) -> list[Any]:
        """A device copy of every Parameter, each in memory of its own (the spare memory of the state let go last,
        else new)."""
        import mindspore as ms
        from mindspore import ops

        spare, self._spare = self._spare, None  # dropped if a copy fails
        copies = []
        for index, parameter in enumerate(self._parameters):
            if widen_bfloat16 and str(parameter.dtype) == _BFLOAT16:
                copies.append(parameter.astype(ms.float32))  # exact, and itself a copy
                continue
            target = spare[index] if spare is not None else self._new_like(parameter, ops)
            self._write(target, parameter)
            copies.append(target)
        return copies

    def _new_like(self, parameter: Any, ops: Any) -> Any:
        dtype = str(parameter.dtype)
        if ("zeros", dtype) not in self._lacking:
            try:
                return ops.zeros_like(parameter)
            except (TypeError, RuntimeError):  # no kernel for the dtype: bfloat16 on MindSpore 2.7's CPU
                self._lacking.add(("zeros", dtype))
        import mindspore as ms

        return parameter.astype(ms.float32).astype(parameter.dtype)  # new memory; its bits are written next

    def _write(self, target: Any, value: Any) -> None:
        """Write `value` into `target`'s own memory."""
        from mindspore import ops

        dtype = str(target.dtype)
        if ("assign", dtype) not in self._lacking:
            try:
                ops.assign(target, value)
                return
            except (TypeError, RuntimeError):  # no kernel for the dtype: bfloat16 on CPU
                self._lacking.add(("assign", dtype))
        target.copy_(value)

    def _start_write(self, step: int, copies: list[Any]) -> GoodState:
        make_dir(self._directory)
        self._taken += 1  # the same step may be kept twice (a train call that starts again there)
        path = self._directory / f"{self._prefix}{os.getpid()}-step{step:012d}-{self._taken}.npz"
        fd, temporary = new_temporary(path)
        state = GoodState(step, self._nbytes, None, path, math.nan, written=_event(False))
        dtypes = [str(p.dtype) for p in self._parameters]
        writer = threading.Thread(
            target=self._write_file,
            args=(state, copies, dtypes, fd, temporary, path),
            name="ms_exporter-good-state",
            daemon=True,  # an exit does not wait for a state nobody will restore; the next start removes its temporary
        )
        try:
            writer.start()
        except BaseException:
            os.close(fd)
            with contextlib.suppress(OSError):
                temporary.unlink()
            raise
        self._writing = state
        return state

    def _write_file(
        self, state: GoodState, copies: list[Any], dtypes: list[str], fd: int, temporary: Path, path: Path
    ) -> None:
        """The background thread: each device copy to the host and into the file, then let go; the file renamed
        into place; `written` set whatever happened."""
        began = time.perf_counter()

        def arrays() -> Iterator[np.ndarray]:
            for index in range(len(copies)):
                if state.abandoned:
                    raise _Abandoned()
                yield _host_array(copies[index])
                copies[index] = None  # its device memory goes back now, not after the whole file

        try:
            with os.fdopen(fd, "wb") as file:
                _write_npz(file, arrays(), dtypes)
            with self._lock:
                if state.abandoned:
                    raise _Abandoned()
                os.replace(temporary, path)  # replaces a link planted at the name, never follows it
        except BaseException as exc:
            with contextlib.suppress(OSError):
                temporary.unlink()
            state.error = exc
        finally:
            copies.clear()
            state.write_seconds = time.perf_counter() - began
            state.written.set()

    def _wait_for(self, state: GoodState) -> None:
        state.written.wait(self._write_wait)
        self._settle()

    def _settle(self) -> None:
        """The training thread takes in the write that ended: its state kept, or not."""
        state = self._writing
        if state is None or not state.written.is_set():
            return
        self._writing = None
        self._ended.append(state)
        if state.error is None:
            self._keep(state)

    def _keep(self, state: GoodState) -> None:
        self._kept.append(state)
        while len(self._kept) > self._max_kept:
            oldest = self._kept.popleft()
            if oldest.tensors is not None:
                self._spare = oldest.tensors
            _remove(oldest)

    def _values_of(self, state: GoodState) -> list[Any]:
        """Every value of `state`, all read before any is written (a file that fails half way changes nothing)."""
        if state.tensors is not None:
            return state.tensors
        if state.path is None:
            raise ValueError(f"the good state of step {state.step} has neither device copies nor a file")
        count = len(self._parameters)
        with os.fdopen(open_regular(state.path, os.O_RDONLY), "rb") as file, np.load(file) as saved:
            if len(saved.files) != count + 1:
                raise ValueError(f"{len(saved.files)} members for {count} parameters and their dtypes")
            dtypes = [str(d) for d in saved[_DTYPES]]
            arrays = [np.asarray(saved[f"p{i}"]) for i in range(count)]
        if dtypes != [str(p.dtype) for p in self._parameters]:
            raise ValueError(f"the dtypes recorded ({', '.join(dtypes)}) are not the parameters'")
        for array, parameter in zip_strict(arrays, self._parameters):
            if tuple(array.shape) != tuple(parameter.shape):
                raise ValueError(f"an array of shape {array.shape} for {parameter.name} of shape {parameter.shape}")
        return [_device_value(a, d, p) for a, d, p in zip_strict(arrays, dtypes, self._parameters)]

    def _assign(self, values: list[Any]) -> None:
        for parameter, value in zip_strict(self._parameters, values):
            self._write(parameter, value)

    def remove_leftovers(self, started: float) -> list[Path]:
        """Remove what earlier processes of this run and rank left in the directory (they were killed before
        close): their good states and temporaries, and the temporaries of older versions (no run or rank in their
        names) older than this process (`started`, a time.time()). Files of other ranks and runs, and of this process,
        stay."""
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
        """Let every state go, the one being written too (its writer stops and removes what it wrote)."""
        writing, self._writing = self._writing, None
        if writing is not None:
            with self._lock:
                writing.abandoned = True
                _remove(writing)  # renamed into place before it was let go
        for state in self._kept:
            _remove(state)
        self._kept.clear()
        self._ended.clear()
        self._spare = None

    def close(self) -> None:
        self._forget()


def _write_npz(file: BinaryIO, arrays: Iterable[np.ndarray], dtypes: list[str]) -> None:
    """What np.savez writes (arrays p0, p1, ... uncompressed, then `dtypes`), one array in host memory at a time, with
    the archive closed on a failure too: np.savez leaves it open when a write fails (a full disk), to fail again when
    collected, after the file is closed."""
    with zipfile.ZipFile(file, mode="w", compression=zipfile.ZIP_STORED, allowZip64=True) as archive:
        for i, array in enumerate(arrays):
            with archive.open(f"p{i}.npy", mode="w", force_zip64=True) as member:
                np.lib.format.write_array(member, np.asanyarray(array), allow_pickle=False)
        with archive.open(f"{_DTYPES}.npy", mode="w") as member:
            np.lib.format.write_array(member, np.array(dtypes, dtype=str), allow_pickle=False)


def _remove(state: GoodState) -> None:
    state.tensors = None
    if state.path is not None:
        with contextlib.suppress(OSError):
            state.path.unlink()
