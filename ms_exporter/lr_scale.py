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
        import mindspore as ms
        from mindspore import Parameter, Tensor

        self._fixed: list[tuple[Any, float]] = []  # (Parameter, base value)
        self._scale: Any = None  # the Parameter every wrapped schedule multiplies by
        self.base_lrs: list[float] = []
        if optimizer is None or not hasattr(optimizer, "learning_rate"):
            raise ValueError("no optimizer with a learning_rate: lr_backoff needs Model(..., optimizer=...) or a "
                             "train cell that holds one")
        learning_rates = optimizer.learning_rate
        groups = list(learning_rates) if isinstance(learning_rates, (list, tuple)) or hasattr(
            learning_rates, "__iter__") and not isinstance(learning_rates, (Parameter, Tensor)) else [learning_rates]
        wrapped = []
        for lr in groups:
            if isinstance(lr, Parameter):
                base = float(np.asarray(lr.asnumpy()).reshape(-1)[0])
                self._fixed.append((lr, base))
                self.base_lrs.append(base)
                wrapped.append(lr)
            else:  # a schedule cell: wrap it, keep it
                if self._scale is None:
                    self._scale = Parameter(Tensor(np.float32(1.0)), name="ms_exporter_lr_scale", requires_grad=False)
                wrapped.append(_scaled_schedule_class()(lr, self._scale))
        if self._scale is not None:
            if len(groups) == 1:
                optimizer.learning_rate = wrapped[0]
            else:
                optimizer.learning_rate = type(learning_rates)(wrapped)
        self._dtype = ms.float32

    @property
    def wraps_schedule(self) -> bool:
        return self._scale is not None

    def apply(self, scale: float) -> None:
        from mindspore import Tensor, ops

        for parameter, base in self._fixed:
            ops.assign(parameter, Tensor(np.array(base * scale, dtype=parameter.asnumpy().dtype)))
        if self._scale is not None:
            ops.assign(self._scale, Tensor(np.float32(scale)))
