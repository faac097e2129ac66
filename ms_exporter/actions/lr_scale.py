"""Scales the optimizer's own learning rate by a factor the monitor sets, whatever form the LR has.

A fixed LR is a Parameter: its value is rewritten in place (ops.assign, which the compiled graph sees; set_data
is not seen after compilation, see docs/development.md). A schedule (LearningRateSchedule, a list) is kept and
wrapped, before the graph is compiled, in a cell that multiplies its output by a scale Parameter: the schedule
goes on as designed, only scaled. Per-group learning rates are scaled group by group.
"""

from __future__ import annotations

from typing import Any

import numpy as np


def _scaled_schedule_class() -> Any:
    from mindspore import nn

    class ScaledSchedule(nn.Cell):
        """The optimizer's schedule times a scale the monitor controls."""

        def __init__(self, schedule: Any, scale: Any) -> None:
            super().__init__(auto_prefix=False)
            self.schedule = schedule
            self.scale = scale

        def construct(self, global_step: Any) -> Any:
            return self.schedule(global_step) * self.scale

    return ScaledSchedule


class LrScaler:
    """Bound to one optimizer at train begin; `apply(scale)` sets the scale relative to the LR it started with."""

    def __init__(self, optimizer: Any) -> None:
        from mindspore import Parameter, ParameterTuple, Tensor
        from mindspore.nn import CellList

        self._fixed: list[tuple[Any, float]] = []  # (Parameter, base value)
        self._scale: Any = None  # the Parameter every wrapped schedule multiplies by
        self.base_lrs: list[float] = []
        learning_rate = getattr(optimizer, "learning_rate", None)
        if learning_rate is None:
            raise ValueError(
                "no optimizer with a learning_rate: lr_backoff needs Model(..., optimizer=...) or a "
                "train cell that holds one"
            )
        # The optimizer's forms: one Parameter, a ParameterTuple (fixed per group), one schedule cell, or a
        # CellList of schedules (per group, when any group's LR is dynamic).
        if isinstance(learning_rate, (Parameter, ParameterTuple)):
            for parameter in [learning_rate] if isinstance(learning_rate, Parameter) else list(learning_rate):
                base = float(np.asarray(parameter.asnumpy()).reshape(-1)[0])
                self._fixed.append((parameter, base))
                self.base_lrs.append(base)
            return
        self._scale = Parameter(Tensor(np.float32(1.0)), name="ms_exporter_lr_scale", requires_grad=False)
        scaled = _scaled_schedule_class()
        if isinstance(learning_rate, CellList):
            optimizer.learning_rate = CellList([scaled(cell, self._scale) for cell in learning_rate], auto_prefix=False)
        else:
            optimizer.learning_rate = scaled(learning_rate, self._scale)

    @property
    def wraps_schedule(self) -> bool:
        return self._scale is not None

    def apply(self, scale: float) -> None:
        from mindspore import Tensor, ops

        for parameter, base in self._fixed:
            ops.assign(parameter, Tensor(np.array(base * scale, dtype=parameter.asnumpy().dtype)))
        if self._scale is not None:
            ops.assign(self._scale, Tensor(np.float32(scale)))
