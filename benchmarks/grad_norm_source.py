"""Where a plain Model's gradient norm could come from, and what each way costs.

python -m benchmarks.grad_norm_source [--steps 300]

A plain `Model(network, optimizer=...)` computes its gradients inside the compiled step and hands the callback only
the loss. Two ways to get the norm anyway: wrap the step in GradNormTrainOneStepCell (the norm comes out of the same
backward pass), or have the monitor run a second forward and backward pass of its own on the step's batch
(ms.value_and_grad) every `grad_norm.every_n_steps` steps. This measures, on the demo model in GRAPH mode, the median
time of a plain step, of a GradNormTrainOneStepCell step that measures, and of one extra forward-and-backward pass
with the global norm read to the host.
"""

from __future__ import annotations

import argparse
import time
from typing import Any

import numpy as np


def _median_ms(call: Any, steps: int) -> float:
    times = []
    for _ in range(steps):
        began = time.perf_counter()
        call()
        times.append(time.perf_counter() - began)
    return float(np.median(times[steps // 10 :]) * 1e3)  # the first tenth compiles and warms up


def measure(steps: int) -> dict[str, float]:
    import mindspore as ms
    from mindspore import nn, ops

    from ms_exporter.cells.train_cells import GradNormTrainOneStepCell
    from ms_exporter.demo import build_network, synthetic_dataset

    ms.set_context(mode=ms.GRAPH_MODE)
    ms.set_seed(0)
    batch = next(synthetic_dataset(size=64).create_tuple_iterator())
    network = build_network()
    optimizer = nn.AdamWeightDecay(network.trainable_params(), learning_rate=1e-4)
    plain = nn.TrainOneStepCell(network, optimizer)
    other = build_network()
    measured = GradNormTrainOneStepCell(other, nn.AdamWeightDecay(other.trainable_params(), learning_rate=1e-4))
    measured.every_n_steps = 1
    weights = network.trainable_params()
    forward_backward = ms.value_and_grad(network, None, weights)

    def second_pass() -> float:
        _, grads = forward_backward(*batch)
        return float(ops.sqrt(sum(ops.square(g).sum() for g in grads)).asnumpy())

    return {
        "plain step (TrainOneStepCell)": _median_ms(lambda: plain(*batch).asnumpy(), steps),
        "GradNormTrainOneStepCell step that measures": _median_ms(
            lambda: [out.asnumpy() for out in measured(*batch)], steps
        ),
        "a second forward and backward pass, norm to host": _median_ms(second_pass, steps),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=300)
    args = parser.parse_args()
    for case, ms_ in measure(args.steps).items():
        print(f"| {case} | {ms_:.2f} ms |")


if __name__ == "__main__":
    main()
