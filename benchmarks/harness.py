"""A synthetic step: real MindSpore objects in cb_params, no training, so one hook call can be timed alone."""

from __future__ import annotations

from typing import Any

import numpy as np


class SyntheticRun:
    """cb_params with a real optimizer (decaying LR schedule), a real padded batch and a chosen output shape."""

    def __init__(self, outputs: str = "scalar", parameters: int = 40) -> None:
        import mindspore as ms
        from mindspore import Parameter, Tensor, nn
        from mindspore.train.callback import RunContext, _InternalCallbackParam

        self.params = [
            Parameter(Tensor(np.ones((4, 4), np.float32)), name=f"block.{i // 2}.dense{i % 2}.weight")
            for i in range(parameters)
        ]
        optimizer = nn.Momentum(self.params, nn.ExponentialDecayLR(0.1, 0.9, 100), 0.9)
        mask = np.zeros((16, 32), np.int32)
        mask[:, :20] = 1
        cb = _InternalCallbackParam()
        cb.cur_step_num = 0
        cb.cur_epoch_num = 1
        cb.optimizer = optimizer
        cb.train_network = None
        cb.train_dataset = None
        cb.train_dataset_element = [Tensor(np.ones((16, 32), np.int32)), Tensor(mask), Tensor(np.zeros(16, np.int32))]
        loss = 0.5
        norms = Tensor(np.linspace(0.1, 2.0, parameters).astype(np.float32))
        if outputs == "scalar":
            cb.net_outputs = loss  # a float: the loss's device read is timed separately
        else:  # MindSpore Transformers' 7-tuple with local norms, for layer series
            cb.net_outputs = (
                loss,
                Tensor(False),
                Tensor(np.float32(1024.0)),
                Tensor(np.float32(1e-3)),
                Tensor(np.float32(3.0)),
                norms,
                Tensor(np.ones(parameters, np.float32)),
            )
        self.cb_params = cb
        self.run_context = RunContext(cb)
        self.loss_tensor = Tensor(np.float32(0.5))
        self.ms = ms

    def begin(self, monitor: Any) -> None:
        monitor.on_train_begin(self.run_context)

    def step(self, monitor: Any) -> None:
        self.cb_params.cur_step_num += 1
        monitor.on_train_step_begin(self.run_context)
        monitor.on_train_step_end(self.run_context)
