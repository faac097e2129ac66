"""What the train cell's outputs hold, by position: loss, overflow flag, loss scale, gradient norms, gradients.

| train cell | net_outputs |
|---|---|
| TrainOneStepCell | loss |
| TrainOneStepWithLossScaleCell, LossScaleTrainOneStepCell | (loss, overflow, scale) |
| TrainOneStepCell(return_grad=True) | (loss, {parameter name: grad}) |
| GradNormTrainOneStepCell | loss; every n-th step (loss, global_norm, parameter_norms) |
| MindSpore Transformers' train cells | (loss, overflow, scaling_sens, lr, global_norm) |
| the same with local norms | (loss, overflow, scaling_sens, lr, global_norm, local_norms, sizes) |
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ms_exporter.core.compat import SLOTS


@dataclass(frozen=True, **SLOTS)
class OutputLayout:
    """Index of each item in the outputs tuple, or None when the cell does not report it."""

    overflow: int | None = None
    scale: int | None = None
    learning_rate: int | None = None  # the LR the cell applied this step
    global_norm: int | None = None
    parameter_norms: int | None = None
    grads: int | None = None
    measured_by_cell: bool = False  # the cell returns norms only on the steps it measured: read them all


# The class attribute of a train cell whose outputs are (loss, global_norm, parameter_norms) on measured steps.
NORMS_WHEN_MEASURED = "outputs_norms_when_measured"

SCALAR = OutputLayout()
_BY_LENGTH = {
    3: OutputLayout(overflow=1, scale=2),
    5: OutputLayout(overflow=1, scale=2, learning_rate=3, global_norm=4),
    7: OutputLayout(overflow=1, scale=2, learning_rate=3, global_norm=4, parameter_norms=5),
}
_GRAD_NORM_CELL = OutputLayout(global_norm=1, parameter_norms=2, measured_by_cell=True)
_RETURN_GRAD = OutputLayout(grads=1)


class LayoutResolver:
    """Classifies outputs once per (train cell, tuple length); the hot path then costs a dict lookup."""

    def __init__(self) -> None:
        self._train_network: Any = None
        self._cache: dict[int, OutputLayout] = {}

    def bind(self, train_network: Any) -> None:
        self._train_network = train_network
        self._cache.clear()

    def resolve(self, outputs: Any) -> OutputLayout:
        if not isinstance(outputs, (tuple, list)):
            return SCALAR
        length = len(outputs)
        layout = self._cache.get(length)
        if layout is None:
            layout = self._cache[length] = self._classify(outputs)
        return layout

    def _classify(self, outputs: tuple | list) -> OutputLayout:
        # A cell that says so (ms_exporter.cells.GradNormTrainOneStepCell) returns (loss, global_norm,
        # parameter_norms) on the steps it measured: read from its class, so this base module names no cell.
        if getattr(type(self._train_network), NORMS_WHEN_MEASURED, False) and len(outputs) == 3:
            return _GRAD_NORM_CELL
        if len(outputs) == 2 and isinstance(outputs[1], dict):
            return _RETURN_GRAD
        return _BY_LENGTH.get(len(outputs), SCALAR)
