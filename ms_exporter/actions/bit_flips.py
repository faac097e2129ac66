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
from ms_exporter.core.cb_params import optimizer_state_of, train_network_of, trained_weights_of
from ms_exporter.core.device.bit_flip import fits, flip_in_words, flipped_copy
from ms_exporter.core.device.device_reductions import reads_in_place
from ms_exporter.core.part import Part

logger = logging.getLogger("ms_exporter")


class BitFlips(Part):
    """The flips of `flips` for this rank, each applied once at the end of its step."""

    name = "divergence.inject_flips"

    def __init__(self, flips: tuple[BitFlip, ...], rank: int) -> None:
        # Steps at which another replica flips a local gradient: this rank runs them the drill's way too.
        self._theirs = sorted({flip.step for flip in flips if flip.kind == "gradients" and flip.rank != rank})
        mine = [flip for flip in flips if flip.rank == rank]
        self._due = {flip.step: [f for f in mine if f.step == flip.step] for flip in mine}
        self._tensors: dict[str, list[Any]] = {}

    def on_train_begin(self, cb_params: Any) -> None:
        weights = trained_weights_of(cb_params)
        self._tensors = {"weights": weights, "optimizer": optimizer_state_of(cb_params, weights)}
        split = getattr(train_network_of(cb_params), "split_step", None)
        if split is not None:
            for step in self._theirs:
                split(step)
        for step in sorted(self._due):
            for flip in [f for f in self._due[step] if f.kind == "gradients"]:
                self._due[step].remove(flip)
                logger.warning(
                    "ms_exporter: divergence.inject_flips at step %d: %s", step, arm(cb_params, weights, flip)
                )

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
    if not fits(tensor, flip.element, flip.bit):
        size, width = int(tensor.size), int(tensor.itemsize) * 8
        return f"{name} has {size} elements of {width} bits: element {flip.element} bit {flip.bit} skipped"
    if reads_in_place() and "BFloat16" not in str(tensor.dtype):
        flip_in_words(np.asarray(tensor.asnumpy()), flip.element, flip.bit)  # the tensor's own memory
    else:
        _write_back(tensor, flipped_copy(tensor, flip.element, flip.bit))
    return f"bit {flip.bit} of element {flip.element} of {flip.kind} tensor {name} flipped"


def _write_back(tensor: Any, flipped: Any) -> None:
    import mindspore as ms
    from mindspore import ops

    if "BFloat16" in str(tensor.dtype) and ms.get_context("device_target") == "CPU":
        tensor.set_data(flipped)  # MindSpore's CPU has no bfloat16 Assign
    else:
        ops.assign(tensor, flipped)


def arm(cb_params: Any, weights: list[Any], flip: BitFlip) -> str:
    """Arms a flip of a local gradient in the train cell, which alone holds the gradients before the all-reduce."""
    cell = train_network_of(cb_params)
    if not hasattr(cell, "flip_local_gradient"):
        return "local gradient flips need GradNormTrainOneStepCell as the train cell: nothing armed"
    tensor = _find(weights, flip.tensor)
    if tensor is None or not fits(tensor, flip.element, flip.bit):
        cell.split_step(flip.step)  # as the other replicas do at that step, flipping nothing
        if tensor is None:
            return f"no trained weight {flip.tensor!r} (of {len(weights)}) for a gradient flip: nothing armed"
        return f"the gradient of {tensor.name} has no element {flip.element} bit {flip.bit}: nothing armed"
    position = next(i for i, weight in enumerate(weights) if weight is tensor)
    cell.flip_local_gradient(flip.step, position, flip.element, flip.bit)
    return f"bit {flip.bit} of element {flip.element} of the local gradient of {tensor.name} armed"


def _find(tensors: list[Any], key: str | int) -> Any:
    if isinstance(key, int):
        return tensors[key] if key < len(tensors) else None
    return next((t for t in tensors if getattr(t, "name", None) == key), None)
