"""Device-to-host reads counted where MindSpore makes them (Tensor.asnumpy, Parameter's included): on a device every
byte read is a copy, so the bytes are what the monitor costs the host, whatever the tensors' sizes."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest


class Transfers:
    """The reads made since `count_transfers` (or the last `clear()`): one size in bytes per read."""

    def __init__(self) -> None:
        self.sizes: list[int] = []

    @property
    def calls(self) -> int:
        return len(self.sizes)

    @property
    def bytes(self) -> int:
        return sum(self.sizes)

    def clear(self) -> None:
        self.sizes.clear()


def count_transfers(monkeypatch: pytest.MonkeyPatch) -> Transfers:
    """Counts every Tensor.asnumpy call from now to the end of the test."""
    import mindspore as ms

    from ms_exporter.core.device import device_reductions

    # What a device moves: the reductions run compiled, as on an accelerator, not in place on the CPU target's memory.
    monkeypatch.setattr(device_reductions, "read_in_place", False)
    seen = Transfers()
    original = ms.Tensor.asnumpy

    def counted(self: Any) -> np.ndarray:
        values: np.ndarray = original(self)
        seen.sizes.append(int(np.asarray(values).nbytes))
        return values

    monkeypatch.setattr(ms.Tensor, "asnumpy", counted)
    return seen
