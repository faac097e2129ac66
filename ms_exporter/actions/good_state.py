"""The good states actions.rollback keeps: every Parameter of the train network (weights, the optimizer's moments
and step counter, a loss-scale cell's scale and counters), as host copies or as files.

Restoring writes each value into the Parameter's own memory with ops.assign, which the compiled graph reads
(set_data may hand the Parameter new memory that a graph compiled earlier does not see: docs/development.md).
"""

from __future__ import annotations

import logging
import os
import time
from collections import deque
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

logger = logging.getLogger("ms_exporter")

STATE_DIR = "good-states"


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
    state is at most `memory_limit` bytes)."""

    def __init__(self, storage: str, memory_limit: float, directory: Path, max_kept: int) -> None:
        self._storage = storage
        self._memory_limit = memory_limit
        self._directory = directory
        self._kept: deque[GoodState] = deque()
        self._max_kept = max_kept
        self._parameters: list[Any] = []
        self.names: list[str] = []
        self._taken = 0

    def bind(self, train_network: Any, leave_out: tuple[Any, ...] = ()) -> None:
        """Every Parameter of the network once (a shared one is listed once), less `leave_out` (the optimizer's
        fixed learning rate, which lr_backoff owns) and the monitor's own (named ms_exporter_*)."""
        seen: set[int] = {id(p) for p in leave_out}
        self._parameters, self.names = [], []
        for name, parameter in train_network.parameters_and_names():
            if id(parameter) in seen or parameter.name.startswith("ms_exporter_"):
                continue
            seen.add(id(parameter))
            self._parameters.append(parameter)
            self.names.append(name)
        self._kept.clear()

    @property
    def nbytes(self) -> int:
        return int(sum(p.nbytes for p in self._parameters))

    @property
    def newest(self) -> GoodState | None:
        return self._kept[-1] if self._kept else None

    @property
    def where(self) -> str:
        if self._storage == "auto":
            return "memory" if self.nbytes <= self._memory_limit else "disk"
        return self._storage

    def capture(self, step: int) -> GoodState:
        began = time.perf_counter()
        arrays = [_host_copy(p) for p in self._parameters]
        nbytes = int(sum(a.nbytes for a in arrays))
        path = None
        if self.where == "disk":
            self._directory.mkdir(parents=True, exist_ok=True)
            self._taken += 1  # the same step may be kept twice (a train call that starts again there)
            path = self._directory / f"good-step{step:012d}-{self._taken}.npz"
            partial = path.with_suffix(".npz.partial")
            with open(partial, "wb") as file:
                np.savez(file, **{f"p{i}": a for i, a in enumerate(arrays)})
            os.replace(partial, path)
        kept = arrays if path is None else None
        state = GoodState(step, nbytes, kept, path, time.perf_counter() - began)
        self._kept.append(state)
        while len(self._kept) > self._max_kept:
            old = self._kept.popleft()
            if old.path is not None:
                old.path.unlink(missing_ok=True)
        return state

    def restore(self, state: GoodState) -> None:
        """Write `state` into the Parameters the compiled graph uses."""
        from mindspore import Tensor, ops

        if state.arrays is not None:
            arrays = state.arrays
        else:
            assert state.path is not None
            with np.load(state.path) as saved:
                arrays = [saved[f"p{i}"] for i in range(len(self._parameters))]
        for parameter, array in zip(self._parameters, arrays, strict=True):
            value = Tensor(array)
            if value.dtype != parameter.dtype:
                value = value.astype(parameter.dtype)
            ops.assign(parameter, value)

    def close(self) -> None:
        for state in self._kept:
            if state.path is not None:
                state.path.unlink(missing_ok=True)
        self._kept.clear()
