"""Loaded and unloaded blocks inside one training: the method `make reliability`'s load and hostile-client
measurements share (a callback that switches a load generator on and off every few steps, and the ratio of the
loaded blocks' median step to their unloaded neighbours')."""

from __future__ import annotations

import signal
import subprocess
import time
from typing import Any

import numpy as np

SETTLE_STEPS = 5  # steps left out at the start of each block, while the load starts or drains


def block_timer(loader: subprocess.Popen[str], block_steps: int) -> Any:
    """Last in the callback list: reads the loss, records each step's interval with its block, and switches the
    load generator on (SIGCONT) for odd blocks and off (SIGSTOP) for even ones, so that loaded and unloaded
    stretches of under a second alternate inside one training and the machine's drift cancels."""
    from mindspore.train import Callback

    class BlockTimer(Callback):
        def __init__(self) -> None:
            super().__init__()
            self.steps: list[tuple[int, int, float]] = []  # (block, step within the block, interval)
            self.loaded_seconds = 0.0
            self._last: float | None = None
            self._count = 0
            self._block_began = 0.0

        def on_train_step_end(self, run_context: Any) -> None:
            outputs = run_context.original_args().net_outputs
            (outputs[0] if isinstance(outputs, tuple) else outputs).asnumpy()
            now = time.perf_counter()
            block, within = divmod(self._count, block_steps)
            if self._last is not None:
                self.steps.append((block, within, now - self._last))
            self._last = now
            self._count += 1
            if self._count % block_steps == 0:  # the next step starts a new block
                if block % 2 == 1:
                    self.loaded_seconds += now - self._block_began
                    loader.send_signal(signal.SIGSTOP)
                else:
                    loader.send_signal(signal.SIGCONT)
                self._block_began = time.perf_counter()

    return BlockTimer()


def train_in_blocks(
    model: Any, monitor: Any, loader: subprocess.Popen[str], blocks: int, block_steps: int, seed: int
) -> Any:
    """One training of `blocks` pairs of `block_steps`-step blocks, the load generator stopped for the first (it was
    started and left to reach its pace) and switched by the block timer after that; the timer, holding the steps."""
    from ms_exporter.demo import synthetic_dataset

    loader.send_signal(signal.SIGSTOP)  # the first block is unloaded
    timer = block_timer(loader, block_steps)
    model.train(
        1,
        synthetic_dataset(size=16 * (2 * blocks * block_steps + 1), seed=seed),
        callbacks=[monitor, timer],
        dataset_sink_mode=False,
    )
    return timer


def block_ratios(steps: list[tuple[int, int, float]], settle: int) -> list[float]:
    """Each loaded (odd) block's median step over each unloaded neighbour's, leaving out the first `settle`
    steps of every block (the load starting or draining)."""
    blocks: dict[int, list[float]] = {}
    for block, within, interval in steps:
        if within >= settle:
            blocks.setdefault(block, []).append(interval)
    medians = {block: float(np.median(values)) for block, values in blocks.items() if values}
    return [
        medians[block] / medians[other]
        for block in medians
        if block % 2 == 1
        for other in (block - 1, block + 1)
        if other in medians
    ]
