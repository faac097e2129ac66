"""Hand-made MindSpore cb_params (a RunContext) for driving the callback without a training loop."""

from __future__ import annotations

import mindspore as ms
import numpy as np
from mindspore.train.callback import RunContext, _InternalCallbackParam


class SinkDataset:
    def get_col_names(self) -> list[str]:
        return ["input_ids", "attention_mask", "label"]

    def get_batch_size(self) -> int:
        return 4

    def output_shapes(self) -> list[list[int]]:
        return [[4, 8], [4, 8], [4]]

    def output_types(self) -> list[np.dtype]:
        return [np.dtype(np.int32)] * 3


def context(step: int, loss: float, sink_size: int | None = None, element: list | None = None) -> RunContext:
    params = _InternalCallbackParam()
    params.cur_step_num = step
    params.cur_epoch_num = 1
    params.net_outputs = ms.Tensor(np.float32(loss))
    params.train_dataset = SinkDataset()
    params.optimizer = None
    params.dataset_sink_mode = sink_size is not None
    if sink_size is not None:
        params.sink_size = sink_size
    if element is not None:
        params.train_dataset_element = element
    return RunContext(params)
