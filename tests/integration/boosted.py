"""A demo network whose loss a test can multiply (by a huge number, by NaN) to inject a fault."""

from __future__ import annotations

from typing import Any

import mindspore as ms
from mindspore import Parameter, Tensor, nn


class Boosted(nn.Cell):
    """`body` (a demo network) with its loss multiplied by the `boost` parameter, 1.0 while healthy.

    In GRAPH mode a compiled graph keeps its own copy of `boost`: change it with set_data in PYNATIVE mode.
    """

    def __init__(self, body: nn.Cell) -> None:
        super().__init__()
        self.body = body
        self.boost = Parameter(Tensor(1.0, ms.float32), name="boost", requires_grad=False)

    def construct(self, input_ids: Any, attention_mask: Any, label: Any) -> Any:
        return self.body(input_ids, attention_mask, label) * self.boost
