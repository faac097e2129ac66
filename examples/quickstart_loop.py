"""MindSpore's quick start loop (`value_and_grad`, an optimizer call, a loop over the dataset) with the monitor.

    python examples/quickstart_loop.py [--jit] [--epochs 3] [--port 9100]

The network, loss, optimizer and loop are the quick start's (mindspore.cn, "Quick Start"), on synthetic 28x28 images
so that it runs without a download; the lines marked `# monitor` are all the monitor needs. `train_step` returns the
gradients as well as the loss, so that the monitor can take their norms (on the device, every
`grad_norm.every_n_steps` steps). With `--jit` the step is compiled (`@ms.jit`).

For tests and drills: `--record FILE` writes each step's loss, learning rate and (at the sampled steps) the global
gradient norm the loop computed itself, as JSON lines; `--stall-at N --stall-seconds S` holds step N for S seconds
(a hang); `--break-at N` leaves the loop early; `--data-seconds S` makes each batch S seconds slower to load;
`--no-close` leaves the monitor to close at exit, as a script that forgets to would.
"""

from __future__ import annotations

import argparse
import json
import time
from typing import Any

import mindspore as ms
import numpy as np
from mindspore import nn
from mindspore.dataset import GeneratorDataset

from ms_exporter import TrainingMonitor


class Network(nn.Cell):
    """The quick start's network: flatten, three Dense layers with ReLU."""

    def __init__(self) -> None:
        super().__init__()
        self.flatten = nn.Flatten()
        self.dense_relu_sequential = nn.SequentialCell(
            nn.Dense(28 * 28, 128), nn.ReLU(), nn.Dense(128, 128), nn.ReLU(), nn.Dense(128, 10)
        )

    def construct(self, x: Any) -> Any:
        return self.dense_relu_sequential(self.flatten(x))


class SyntheticDigits:
    """28x28 images whose label is the brightest of ten bands: learnable, as MNIST is, without a download."""

    def __init__(self, size: int, seconds: float = 0.0, seed: int = 0) -> None:
        rng = np.random.default_rng(seed)
        self.images = rng.random((size, 1, 28, 28), dtype=np.float32)
        self.labels = self.images.reshape(size, -1)[:, :780].reshape(size, 10, 78).mean(2).argmax(1).astype(np.int32)
        self._seconds = seconds

    def __getitem__(self, index: int) -> tuple[np.ndarray, np.int32]:
        if self._seconds:
            time.sleep(self._seconds)
        return self.images[index], self.labels[index]

    def __len__(self) -> int:
        return len(self.labels)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jit", action="store_true", help="compile train_step with @ms.jit")
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--samples", type=int, default=6400, help="samples per epoch (batch 64)")
    parser.add_argument("--port", type=int, default=9100)
    parser.add_argument("--project", default="quickstart")
    parser.add_argument("--config", default=None, help="a monitor_config YAML file")
    parser.add_argument("--record", default=None, help="write what the loop computed, a JSON line per step")
    parser.add_argument("--stall-at", type=int, default=None, help="hold this step ...")
    parser.add_argument("--stall-seconds", type=float, default=3600.0, help="... for this long")
    parser.add_argument("--break-at", type=int, default=None, help="leave the loop after this step")
    parser.add_argument("--data-seconds", type=float, default=0.0, help="each batch loads this much slower")
    parser.add_argument("--no-close", action="store_true", help="do not call monitor.close()")
    args = parser.parse_args()

    ms.set_context(mode=ms.PYNATIVE_MODE)
    ms.set_seed(0)
    dataset = GeneratorDataset(
        SyntheticDigits(args.samples, args.data_seconds / 64), ["image", "label"], shuffle=False
    ).batch(64)
    model = Network()
    loss_fn = nn.CrossEntropyLoss()
    optimizer = nn.SGD(model.trainable_params(), 1e-2)

    def forward_fn(data: Any, label: Any) -> Any:
        logits = model(data)
        loss = loss_fn(logits, label)
        return loss, logits

    grad_fn = ms.value_and_grad(forward_fn, None, optimizer.parameters, has_aux=True)

    def train_step(data: Any, label: Any) -> Any:
        (loss, _), grads = grad_fn(data, label)
        optimizer(grads)
        return loss, grads

    if args.jit:
        train_step = ms.jit(train_step)

    monitor = TrainingMonitor(args.config, port=args.port, project=args.project)  # monitor
    print("metrics at", monitor.url, flush=True)
    record = open(args.record, "w", encoding="utf-8") if args.record else None  # noqa: SIM115
    step = 0
    for epoch in range(args.epochs):
        model.set_train()
        for data, label in monitor.steps(
            dataset.create_tuple_iterator(), network=model, optimizer=optimizer
        ):  # monitor
            loss, grads = train_step(data, label)
            step += 1
            if step == args.stall_at:
                print(f"stalling at step {step}", flush=True)
                time.sleep(args.stall_seconds)
            monitor.step_end(loss, grads=grads)  # monitor
            if record is not None:
                record.write(json.dumps(_computed(step, loss, grads, optimizer)) + "\n")
                record.flush()
            if step % 100 == 0:
                print(f"epoch {epoch + 1} step {step}: loss {loss.asnumpy():>7f}", flush=True)
            if step == args.break_at:
                break
        if step == args.break_at:
            break
    print("trained", flush=True)
    if not args.no_close:
        monitor.close()  # monitor


def _computed(step: int, loss: Any, grads: Any, optimizer: Any) -> dict[str, Any]:
    """What the loop itself knows of this step, for a test to hold the monitor's figures against."""
    squares = sum(float(np.square(grad.asnumpy().astype(np.float64)).sum()) for grad in grads)
    return {
        "step": step,
        "loss": float(loss.asnumpy()),
        "lr": float(optimizer.get_lr().asnumpy()),
        "grad_norm": squares**0.5,
    }


if __name__ == "__main__":
    main()
