"""Drills: bits flipped on purpose in this rank's weights or optimizer state (`divergence.inject_flips`, refused
unless `divergence.allow_injection`), to show that the replica checks catch them (docs/sdc.md#drills).

A flip lands at the end of its step, before the replica checks read that step: it is the corruption a bit flip in
memory during the step would leave. On MindSpore's CPU target the bit is flipped in the tensor's own memory (the
compiled graph reads the same memory); elsewhere the tensor is copied to the host, flipped and written back with
`ops.assign` (a drill's cost, not training's; a bfloat16 tensor on MindSpore's CPU, which has no bfloat16 Assign,
with `set_data`, which a GRAPH-mode graph compiled before it may not see). A flip that names no tensor, an element
past the tensor's end or a bit past its width is logged and skipped: a drill never takes the training down.
"""

from __future__ import annotations

import logging
from typing import Any

import numpy as np

from ms_exporter.config.sections import BitFlip
from ms_exporter.core.cb_params import optimizer_state_of, trained_weights_of
from ms_exporter.core.device_reductions import reads_in_place
from ms_exporter.core.part import Part

logger = logging.getLogger("ms_exporter")
_UNSIGNED = {1: np.uint8, 2: np.uint16, 4: np.uint32, 8: np.uint64}


class BitFlips(Part):
    """The flips of `flips` for this rank, each applied once at the end of its step."""

    name = "divergence.inject_flips"

    def __init__(self, flips: tuple[BitFlip, ...], rank: int) -> None:
        mine = [flip for flip in flips if flip.rank == rank]
        self._due = {flip.step: [f for f in mine if f.step == flip.step] for flip in mine}
        self._tensors: dict[str, list[Any]] = {}

    def on_train_begin(self, cb_params: Any) -> None:
        weights = trained_weights_of(cb_params)
        self._tensors = {"weights": weights, "optimizer": optimizer_state_of(cb_params, weights)}

    def on_step_end(self, step: int, outputs: Any) -> None:
        for flip in self._due.pop(step, ()):
            said = flip_bit(self._tensors.get(flip.kind, []), flip)
            logger.warning("ms_exporter: divergence.inject_flips at step %d: %s", step, said)


def flip_bit(tensors: list[Any], flip: BitFlip) -> str:
    """Flips the bit `flip` names; says what it did, or why it did nothing."""
    tensor = _find(tensors, flip.tensor)
    if tensor is None:
        return f"no {flip.kind} tensor {flip.tensor!r} (of {len(tensors)}): nothing flipped"
    name = getattr(tensor, "name", flip.tensor)
    size, width = int(tensor.size), int(tensor.itemsize) * 8
    if flip.element >= size or flip.bit >= width:
        return f"{name} has {size} elements of {width} bits: element {flip.element} bit {flip.bit} skipped"
    bfloat16 = "BFloat16" in str(tensor.dtype)
    if reads_in_place() and not bfloat16:
        words = np.asarray(tensor.asnumpy()).reshape(-1).view(_UNSIGNED[width // 8])  # the tensor's own memory
        words[flip.element] ^= words.dtype.type(1 << flip.bit)
    else:
        _flip_by_copy(tensor, flip, bfloat16)
    return f"bit {flip.bit} of element {flip.element} of {flip.kind} tensor {name} flipped"


def _flip_by_copy(tensor: Any, flip: BitFlip, bfloat16: bool) -> None:
    import mindspore as ms
    from mindspore import ops

    if bfloat16:  # numpy has no bfloat16: its bits are the upper half of a float32's, which converts back exactly
        values = np.array(tensor.astype(ms.float32).asnumpy(), np.float32).reshape(-1)
        values.view(np.uint32)[flip.element] ^= np.uint32(1 << (flip.bit + 16))
        flipped = ms.Tensor(values.reshape(tensor.shape)).astype(ms.bfloat16)
        if ms.get_context("device_target") == "CPU":  # MindSpore's CPU has no bfloat16 Assign
            tensor.set_data(flipped)
        else:
            ops.assign(tensor, flipped)
        return
    values = np.array(tensor.asnumpy()).reshape(-1)
    words = values.view(_UNSIGNED[values.itemsize])
    words[flip.element] ^= words.dtype.type(1 << flip.bit)
    ops.assign(tensor, ms.Tensor(values.reshape(tensor.shape)))


def _find(tensors: list[Any], key: str | int) -> Any:
    if isinstance(key, int):
        return tensors[key] if key < len(tensors) else None
    return next((t for t in tensors if getattr(t, "name", None) == key), None)
