"""One training of the detection benchmark: healthy for --healthy-seconds, then one fault (or none).

    python -m benchmarks.detection_job --project P --fault F --file-sd-dir D --save-dir S [--healthy-seconds N]

The monitor runs with its defaults (only the project, the save_dir, file_sd_dir and port 0 are set), so the
times measured are the shipped ones. The network is small and each step is paced to CYCLE seconds, so that a
dozen of these jobs share two cores without slowing one another down. Prints one JSON line when the fault starts:
{"fault_at": unix time}. PYNATIVE mode: a fault changes parameters with set_data, which a compiled graph would not
see.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import time
from typing import Any

import mindspore as ms
import numpy as np
from mindspore import Parameter, Tensor, nn, ops
from mindspore.train import Callback, Model

from ms_exporter import GradNormTrainOneStepCell, TrainingMonitor
from ms_exporter.demo import VOCAB, synthetic_dataset

CYCLE = 0.5  # seconds per step, data wait included
BATCH = 64  # about 1,300 real tokens a step: ~2,600 tokens/s, well above ThroughputLow's default 1,000
FAULTS = ("none", "nan", "grad", "loss_high", "loss_rising", "leak", "scale", "stall", "slow", "kill", "crash")


class TinyClassifier(nn.Cell):
    """Embedding, masked mean, dense head; the loss is `loss * boost + offset`, both set by the fault."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(VOCAB, 16)
        self.head = nn.Dense(16, 2)
        self.loss = nn.SoftmaxCrossEntropyWithLogits(sparse=True, reduction="mean")
        self.boost = Parameter(Tensor(1.0, ms.float32), name="boost", requires_grad=False)
        self.offset = Parameter(Tensor(0.0, ms.float32), name="offset", requires_grad=False)

    def construct(self, input_ids: Any, attention_mask: Any, label: Any) -> Any:
        weights = ops.expand_dims(attention_mask.astype(ms.float32), -1)
        pooled = (self.embed(input_ids) * weights).sum(1) / weights.sum(1)
        return self.loss(self.head(pooled), label) * self.boost + self.offset


class ScaledOutputs(nn.Cell):
    """MindSpore Transformers' 7-tuple (loss, overflow, scale, lr, global_norm, local_norms, sizes), with the
    overflow flag and the loss scale held in parameters the `scale` fault changes."""

    def __init__(self, inner: GradNormTrainOneStepCell) -> None:
        super().__init__(auto_prefix=False)
        self.inner = inner
        self.weights = inner.weights
        self.optimizer = inner.optimizer
        self.overflow = Parameter(Tensor(False, ms.bool_), name="overflow", requires_grad=False)
        self.scale = Parameter(Tensor(1024.0, ms.float32), name="scale", requires_grad=False)

    def construct(self, *inputs: Any) -> Any:
        lr = self.optimizer.get_lr()  # what this step applies, read before the step advances global_step
        loss, global_norm, local_norms = self.inner(*inputs)
        return (loss, self.overflow, self.scale, lr, global_norm, local_norms, ops.ones_like(local_norms))


class Fault(Callback):
    """Paces steps to CYCLE seconds and, after the healthy period, injects the fault at each step begin."""

    def __init__(
        self, fault: str, network: TinyClassifier, cell: ScaledOutputs, healthy_seconds: float, seconds: float
    ) -> None:
        super().__init__()
        self.fault, self.network, self.cell = fault, network, cell
        self.started = time.monotonic()
        self.healthy_seconds, self.seconds = healthy_seconds, seconds
        self.fault_at: float | None = None
        self.previous_end = time.monotonic()
        # Every healthy cycle (more than CYCLE when the host is busy): their mean paces the slow fault.
        self.healthy_time, self.healthy_steps = 0.0, 0
        self.leak: list[np.ndarray] = []
        self.rising = 0.0

    def on_train_step_begin(self, run_context: Any) -> None:
        if self.fault == "none" or time.monotonic() - self.started < self.healthy_seconds:
            return
        if self.fault_at is None:
            self.fault_at = time.time()
            print(json.dumps({"fault_at": self.fault_at}), flush=True)
        fault = self.fault
        if fault == "nan":
            self.network.boost.set_data(Tensor(float("nan"), ms.float32))
        elif fault == "grad":
            self.network.boost.set_data(Tensor(1e5, ms.float32))
        elif fault == "loss_high":
            self.network.offset.set_data(Tensor(100.0, ms.float32))  # the gradients stay as they were
        elif fault == "loss_rising":
            self.rising += 0.5
            self.network.offset.set_data(Tensor(self.rising, ms.float32))
        elif fault == "leak":
            self.leak.append(np.ones(4 * 2**20, np.uint8))  # 4 MiB more every step (8 MiB/s), really touched
        elif fault == "scale":
            self.cell.overflow.set_data(Tensor(True, ms.bool_))
            self.cell.scale.set_data(Tensor(max(float(self.cell.scale.asnumpy()) / 2, 2.0**-20), ms.float32))
        elif fault == "stall":
            time.sleep(3600)
        elif fault == "kill":
            os.kill(os.getpid(), signal.SIGKILL)
        elif fault == "crash":
            raise RuntimeError("detection benchmark: a rank fails")

    def on_train_step_end(self, run_context: Any) -> None:
        pace = CYCLE
        if self.fault == "slow" and self.fault_at is not None:
            # Every cycle twice the healthy period's mean: tokens/s half of the healthy average, so at most half of
            # the best 5-minute average ThroughputDrop compares with, however the host's load moves. (Adding one
            # healthy cycle's sleep, as before, is less than a halving once the load falls: a healthy cycle of 1 s
            # on a busy host plus a paced 0.5 s is 0.67 of the healthy rate, over the rule's 0.6.)
            pace = 2 * (self.healthy_time / self.healthy_steps if self.healthy_steps else CYCLE)
        rest = pace - (time.monotonic() - self.previous_end)
        if rest > 0:
            time.sleep(rest)
        if self.fault_at is None:
            self.healthy_time += time.monotonic() - self.previous_end
            self.healthy_steps += 1
        self.previous_end = time.monotonic()
        if time.monotonic() - self.started > self.seconds:
            run_context.request_stop()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--project", required=True)
    parser.add_argument("--fault", choices=FAULTS, default="none")
    parser.add_argument("--file-sd-dir", required=True)
    parser.add_argument("--save-dir", required=True)
    parser.add_argument("--healthy-seconds", type=float, default=150)
    parser.add_argument("--seconds", type=float, default=3600, help="train this long at most, then end normally")
    args = parser.parse_args()

    ms.set_context(mode=ms.PYNATIVE_MODE)
    ms.set_seed(0)
    network = TinyClassifier()
    optimizer = nn.AdamWeightDecay(network.trainable_params(), learning_rate=nn.CosineDecayLR(1e-5, 1e-3, 100_000))
    cell = ScaledOutputs(GradNormTrainOneStepCell(network, optimizer, every_n_steps=1))
    monitor = TrainingMonitor(project=args.project, port=0, file_sd_dir=args.file_sd_dir, save_dir=args.save_dir)
    print(json.dumps({"metrics": monitor.url}), flush=True)
    fault = Fault(args.fault, network, cell, args.healthy_seconds, args.seconds)
    Model(cell).train(
        1000, synthetic_dataset(size=BATCH * 32, batch=BATCH), callbacks=[monitor, fault], dataset_sink_mode=False
    )
    monitor.close()


if __name__ == "__main__":
    main()
