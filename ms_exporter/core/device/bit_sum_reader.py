"""Every tensor's bit sum (device_reductions.bit_sums) read at every step, at a cost a step can carry.

On an accelerator each read is the compiled reduction: one call, one transfer of 8 bytes per tensor. On MindSpore's
CPU target the tensors are host memory, and a reader keeps numpy views of them between reads: the Python work per
tensor (asnumpy, a call to numpy) is most of the cost on a model of small tensors (85 tensors of the demo model: 0.94
ms read afresh each time, a fifth of that from kept views). Small tensors are copied into one buffer and summed per
tensor by one `np.add.reduceat`; large ones are summed where they are. A view is kept only while its tensor's memory
stays where it was: `data_ptr()` is compared at every read, since `set_data`, `assign_value` and loading a checkpoint
give a Parameter new memory (the view would keep reading the old one), and a moved tensor makes the reader view
every tensor again.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from ms_exporter.core.device.device_reductions import bit_sums, reads_in_place

# A tensor of at most this many values is summed from the shared buffer: numpy's call would cost more than its copy.
SMALL_VALUES = 4096
_WORDS = {1: np.int8, 2: np.int16, 4: np.int32, 8: np.int64}


@dataclass(frozen=True)
class _Plan:
    """Views of the tensors' memory, taken while their memory sat at `addresses`."""

    addresses: list[int]
    large: list[tuple[int, np.ndarray]]  # (tensor's position, its words)
    small: list[np.ndarray]  # the small tensors' words, in the order they are copied into `buffer`
    small_positions: np.ndarray
    buffer: np.ndarray
    offsets: np.ndarray  # where each small tensor starts in `buffer`
    narrow: np.ndarray  # per tensor: words of up to 32 bits, kept modulo 2^32

    def sums(self, count: int) -> np.ndarray:
        sums = np.zeros(count, np.int64)
        for position, words in self.large:
            sums[position] = np.add.reduce(words, dtype=np.int64 if words.itemsize == 8 else np.int32)
        if self.small:
            np.concatenate(self.small, out=self.buffer)
            sums[self.small_positions] = np.add.reduceat(self.buffer, self.offsets, dtype=np.int32)
        return np.where(self.narrow, sums % (1 << 32), sums)


class BitSumReader:
    """`sums()`: the bit sums of `tensors`, equal to `bit_sums(tensors)` at every read."""

    def __init__(self, tensors: Sequence[Any]) -> None:
        self._tensors = list(tensors)
        self._plan: _Plan | None = None
        self._in_place: bool | None = None  # decided at the first read (MindSpore's target is set by then)

    def __len__(self) -> int:
        return len(self._tensors)

    def sums(self) -> np.ndarray:
        if self._in_place is None:
            self._in_place = reads_in_place() and all(_viewable(t) for t in self._tensors)
        if not self._in_place:
            return bit_sums(self._tensors)
        addresses = [t.data_ptr() for t in self._tensors]
        plan = self._plan
        if plan is None or plan.addresses != addresses:
            plan = self._plan = _plan(self._tensors, addresses)
        return plan.sums(len(self._tensors))


def _viewable(tensor: Any) -> bool:
    """Whether numpy sees the tensor's bits with no conversion (bfloat16 has no numpy dtype: it is widened)."""
    return "BFloat16" not in str(tensor.dtype) and hasattr(tensor, "data_ptr")


def _words(tensor: Any) -> np.ndarray:
    values = np.ravel(np.asarray(tensor.asnumpy()))  # a view of the tensor's memory on the CPU target
    return values.view(_WORDS[values.dtype.itemsize])


def _plan(tensors: Sequence[Any], addresses: list[int]) -> _Plan:
    large: list[tuple[int, np.ndarray]] = []
    small: list[np.ndarray] = []
    positions: list[int] = []
    for position, tensor in enumerate(tensors):
        words = _words(tensor)
        # Only words of up to 32 bits share the buffer: its int32 sums are kept modulo 2^32.
        if 0 < words.size <= SMALL_VALUES and words.itemsize <= 4:
            small.append(words)
            positions.append(position)
        elif words.size:
            large.append((position, words))
    sizes = np.asarray([w.size for w in small], np.int64)
    wide = max((w.itemsize for w in small), default=4)
    return _Plan(
        addresses=addresses,
        large=large,
        small=small,
        small_positions=np.asarray(positions, np.int64),
        buffer=np.empty(int(sizes.sum()), _WORDS[wide]),
        offsets=np.concatenate(([0], np.cumsum(sizes)[:-1])).astype(np.int64) if small else np.zeros(0, np.int64),
        narrow=np.asarray([int(t.itemsize) < 8 for t in tensors], bool),
    )
