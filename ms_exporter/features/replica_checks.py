"""Replica checks at every step: the bit sums of every trained weight and every optimizer state tensor, read at each
step's end, kept for a window of steps, and folded per bucket of tensors into the checksums the replicas of a group
compare (docs/sdc.md).

A bucket is a run of consecutive tensors of one kind (`weights` or `optimizer`) holding about an equal share of its
values; `divergence.buckets` of each at most. Each tensor's sums are folded step by step into an accumulator
(acc = 3 * acc + sum, modulo the prime 2^61 - 1): a sum that differs at any one step changes every later accumulator
value (the difference, under 2^32, is multiplied by powers of 3, none of them 0 modulo a prime), so a checksum
published at a comparison step covers every step since the one before, not only the last. Accumulators start again
after each publication: replicas that started a comparison window together compare equal. The window of per-step
sums (`divergence.window_steps`) names the first step and the tensor where ranks differ (`/debug/checksums`).
"""

from __future__ import annotations

import collections
import json
import zlib
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from ms_exporter.core.analysis.replicas import KINDS
from ms_exporter.core.device.bit_sum_reader import BitSumReader

_PRIME = (1 << 61) - 1
LOCAL_GRAD_NORM = "local_grad_norm"  # a page row's key: the rank's local gradient norm at that step
Row = tuple[int, dict[str, Any]]  # a step, its sums by kind and (where measured) its local gradient norm


class StepChecks:
    """`read(step)` on the training thread at each step's end; `publish()` at a comparison step: the checksums by
    (kind, bucket) since the last one."""

    def __init__(self, tensors: Mapping[str, Sequence[Any]], buckets: int, window_steps: int) -> None:
        self._readers = {kind: BitSumReader(tensors.get(kind, ())) for kind in KINDS}
        self.names = {kind: [str(getattr(t, "name", i)) for i, t in enumerate(tensors.get(kind, ()))] for kind in KINDS}
        self.buckets = {kind: split(tensors.get(kind, ()), buckets) for kind in KINDS}
        self._acc = {kind: np.zeros(len(self._readers[kind]), np.int64) for kind in KINDS}
        self._window: collections.deque[Row] = collections.deque(maxlen=window_steps)  # the last steps
        # The two comparison intervals before the current one (the last `window_steps` steps of each, which the
        # window holds when the interval closes): the interval in which a differing checksum's onset lies stays on
        # the page until two more comparisons have passed, however long ago its steps are.
        self._closed: collections.deque[tuple[Row, ...]] = collections.deque(maxlen=2)
        self._published_at = -1
        self.last_step: int | None = None
        self.accumulators: dict[str, list[int]] = {}

    def last_weight_sums(self) -> np.ndarray:
        sums: np.ndarray = self._window[-1][1]["weights"]
        return sums

    def read(self, step: int, local_grad_norm: float | None = None) -> None:
        row: dict[str, Any] = {}
        for kind, reader in self._readers.items():
            sums = row[kind] = reader.sums()
            acc = self._acc[kind]
            np.multiply(acc, 3, out=acc)  # acc < 2^61: no overflow
            acc += np.remainder(sums, _PRIME)  # a 64-bit word's sum may be negative or near 2^63
            np.remainder(acc, _PRIME, out=acc)
        if local_grad_norm is not None:
            row[LOCAL_GRAD_NORM] = local_grad_norm
        self._window.append((step, row))
        self.last_step = step

    def publish(self) -> dict[tuple[str, str], int]:
        """CRC-32 of each bucket's accumulators, by (kind, bucket number); the accumulators start again."""
        checksums = {}
        # Each tensor's accumulator, for the JSON Lines file: replicas' records of one comparison step name the
        # tensor that differs long after the per-step sums have left the window.
        self.accumulators = {kind: self._acc[kind].tolist() for kind in KINDS}
        for kind in KINDS:
            acc = self._acc[kind]
            for number, (first, last) in enumerate(self.buckets[kind]):
                checksums[(kind, str(number))] = zlib.crc32(np.ascontiguousarray(acc[first : last + 1]).data)
            acc[:] = 0
        since = self._published_at
        self._closed.append(tuple(row for row in self._window if row[0] > since))
        self._published_at = self.last_step if self.last_step is not None else since
        return checksums

    def page(self, rank: int, group: str) -> str:
        """The kept steps as JSON: the tensors' names and buckets by kind, and each kept step's sums, in order."""
        # Each read is one call in C (the training thread may append meanwhile).
        kept = dict([*(row for interval in list(self._closed) for row in interval), *list(self._window)])
        window = sorted(kept.items())
        return json.dumps(
            {
                "rank": rank,
                "replica_group": group,
                "tensors": self.names,
                "buckets": self.buckets,
                "steps": [{"step": step, **{key: _plain(value) for key, value in row.items()}} for step, row in window],
            }
        )


def _plain(value: Any) -> Any:
    return value.tolist() if isinstance(value, np.ndarray) else value


def split(tensors: Sequence[Any], buckets: int) -> list[tuple[int, int]]:
    """[first, last] tensor positions of at most `buckets` runs of consecutive tensors, each closed once it holds its
    share of the values (a tensor larger than a share is a bucket of its own)."""
    sizes = [int(getattr(t, "size", 0)) for t in tensors]
    if not sizes:
        return []
    share = max(1, -(-sum(sizes) // buckets))
    runs: list[tuple[int, int]] = []
    first, held = 0, 0
    for position, size in enumerate(sizes):
        held += size
        if held >= share and len(runs) < buckets - 1:
            runs.append((first, position))
            first, held = position + 1, 0
    if first < len(sizes):
        runs.append((first, len(sizes) - 1))
    return runs
