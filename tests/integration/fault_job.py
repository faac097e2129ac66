"""A real training job with the monitor on and one fault injected after a healthy start (test helper).

    python fault_job.py --port P --project NAME --fault {none,nan,loss,stall,pause,leak,slow,kill} [--seconds S]
        [--pause P] [--save-dir D] [--hardware-interval S]

`kill` trains healthily: the test kills the process from outside. `pause` stops once for --pause seconds (a stall
that ends). With --save-dir the monitor also writes JSON Lines there.

The train cell returns MindSpore Transformers' 7-tuple (loss, overflow, scale, lr, global_norm, local_norms,
sizes) so that every dashboard panel, gradients and loss scale included, has data.
"""

from __future__ import annotations

import argparse
import time
from typing import Any

import mindspore as ms
import numpy as np
from mindspore import Tensor, nn, ops
from mindspore.train import Callback, Model

from ms_exporter import GradNormTrainOneStepCell, TrainingMonitor
from ms_exporter.demo import build_network, demo_flops_model, synthetic_dataset
from tests.integration.boosted import Boosted

HEALTHY_STEPS = 30  # the fault starts after this many steps


class SevenTuple(nn.Cell):
    """(loss, overflow, scale, lr, global_norm, local_norms, sizes) with a static loss scale of 1024."""

    def __init__(self, inner: GradNormTrainOneStepCell) -> None:
        super().__init__(auto_prefix=False)
        self.inner = inner
        self.weights = inner.weights
        self.optimizer = inner.optimizer

    def construct(self, *inputs: Any) -> Any:
        lr = self.optimizer.get_lr()  # what this step applies, read before the step advances global_step
        loss, global_norm, local_norms = self.inner(*inputs)
        return (
            loss,
            ops.zeros((), ms.bool_),
            ops.ones((), ms.float32) * 1024.0,
            lr,
            global_norm,
            local_norms,
            ops.ones_like(local_norms),
        )


class Fault(Callback):
    def __init__(self, fault: str, network: Boosted, seconds: float, pause: float = 0.0) -> None:
        super().__init__()
        self.pause = pause
        self.fault = fault
        self.network = network
        self.deadline = time.monotonic() + seconds
        self.leak: list[np.ndarray] = []

    def on_train_step_begin(self, run_context: Any) -> None:
        step = run_context.original_args().cur_step_num
        if step <= HEALTHY_STEPS:
            return
        if self.fault == "nan":
            self.network.boost.set_data(Tensor(float("nan"), ms.float32))
        elif self.fault == "loss":
            self.network.boost.set_data(Tensor(100.0, ms.float32))
        elif self.fault == "stall":
            time.sleep(3600)  # the test kills the job once the alert arrived
        elif self.fault == "pause" and step == HEALTHY_STEPS + 1:
            time.sleep(self.pause)
        elif self.fault == "leak":
            self.leak.append(np.ones(4 * 2**20, np.uint8))  # 4 MiB more every step, really touched
        elif self.fault == "slow":
            time.sleep(0.25)

    def on_train_step_end(self, run_context: Any) -> None:
        if time.monotonic() > self.deadline:
            run_context.request_stop()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--project", required=True)
    parser.add_argument(
        "--fault", choices=("none", "nan", "loss", "stall", "pause", "leak", "slow", "kill"), default="none"
    )
    parser.add_argument("--seconds", type=float, default=600)
    parser.add_argument("--pause", type=float, default=20.0)
    parser.add_argument("--save-dir", default=None)
    parser.add_argument("--hardware-interval", type=float, default=None, help="hardware.interval (10 s by default)")
    args = parser.parse_args()

    # PYNATIVE: set_data on the boost reaches the step there (a compiled graph keeps its own copy).
    ms.set_context(mode=ms.PYNATIVE_MODE if args.fault in ("nan", "loss") else ms.GRAPH_MODE)
    ms.set_seed(0)
    network = Boosted(build_network())
    optimizer = nn.AdamWeightDecay(network.trainable_params(), learning_rate=nn.CosineDecayLR(1e-5, 1e-3, 100_000))
    # every_n_steps=1: in PYNATIVE the inner cell's own call decides, and the 7-tuple needs norms on every step.
    model = Model(SevenTuple(GradNormTrainOneStepCell(network, optimizer, every_n_steps=1)))
    monitor = TrainingMonitor(
        port=args.port,
        project=args.project,
        interval=0.5,
        warmup_steps=5,
        grad_norm={"every_n_steps": 5, "layers": ["body.head"]},
        layernorm={"every_n_steps": 5},
        # On but never triggered, so that the dashboard's actions panel has series.
        actions={
            "early_stop": {"enable": True, "patience": 10**6, "unit": "epoch", "max_nonfinite": None},
            "lr_backoff": {"enable": True, "rising_steps": 10**6, "on_grad_norm": False},
            # keeps good states (the health score, the last good step), never rolls back
            "rollback": {
                "enable": True,
                "good_every": 50,
                "on_nonfinite": False,
                "spike_factor": None,
                "grad_norm_above": 1e12,
            },
        },
        # A short hang deadline only where the stall is the fault: a loaded machine's pauses
        # must not make the healthy run stall.
        hang={"min_seconds": 5 if args.fault in ("stall", "pause") else 120},
        # A peak, so that the dashboard's MFU panel has series (no MfuLow: no alert_below).
        flops={"model": demo_flops_model(), "peak_flops_per_device": 1e12},
        **({"backend": ["prometheus", "local"], "save_dir": args.save_dir} if args.save_dir else {}),
        **({"hardware": {"interval": args.hardware_interval}} if args.hardware_interval else {}),
    )
    print(f"metrics: {monitor.url}", flush=True)
    fault = Fault(args.fault, network, args.seconds, args.pause)
    model.train(10_000, synthetic_dataset(size=16 * 64), callbacks=[monitor, fault], dataset_sink_mode=False)


if __name__ == "__main__":
    main()
