"""Regenerates the exposition texts tests/unit/test_top.py builds rows from: a real monitor (rank 1 of project
"capture") on a real Model.train run, scraped after step 4 and after step 8.

    .venv/bin/python -m tests.unit.data.capture_top

Between the two scrapes the gradient norm crosses its threshold (a breach episode) and a broken probe is
switched off after 3 failures (`mindspore_exporter_component_disabled`). Gradient norms are measured every
2 steps by GradNormTrainOneStepCell.
"""

from __future__ import annotations

import os
import urllib.request
from pathlib import Path
from typing import Any

import mindspore as ms
from mindspore import nn
from mindspore.train import Callback, Model

from ms_exporter import GradNormTrainOneStepCell, TrainingMonitor
from ms_exporter.demo import build_network, synthetic_dataset

HERE = Path(__file__).parent
BATCH = 8


class Capture(Callback):
    """After the monitor: saves the page at steps 4 and 8, and breaks the throughput probe after step 4."""

    def __init__(self, monitor: TrainingMonitor) -> None:
        super().__init__()
        self.monitor = monitor

    def on_train_step_end(self, run_context: Any) -> None:
        step = run_context.original_args().cur_step_num
        if step in (4, 8):
            assert self.monitor.url is not None
            with urllib.request.urlopen(self.monitor.url, timeout=10) as response:
                (HERE / f"top_rank1_step{step}.prom").write_bytes(response.read())
        if step == 4:
            probe = next(p for p in self.monitor.core.publisher.probes if p.name == "throughput")

            def broken(sample: Any) -> None:
                raise RuntimeError("injected failure")

            probe.on_step = broken  # type: ignore[method-assign]


def main() -> None:
    os.environ["RANK_ID"] = "1"
    os.environ["RANK_SIZE"] = "2"
    ms.set_context(mode=ms.GRAPH_MODE)
    ms.set_seed(0)
    network = build_network(layers=1, d_model=32, heads=2)
    optimizer = nn.Momentum(network.trainable_params(), 0.01, 0.9)
    model = Model(GradNormTrainOneStepCell(network, optimizer))
    # The loss starts near 0.7, above its bound from the first step; the gradient norm passes 3 after step 4.
    monitor = TrainingMonitor(
        port=0,
        project="capture",
        interval=0.2,
        warmup_steps=2,
        web={"cache_seconds": 0},
        warn_on_value={"loss": 0.6},
        grad_norm={"every_n_steps": 2, "threshold": 3.0},
    )
    try:
        model.train(
            1,
            synthetic_dataset(size=8 * BATCH, batch=BATCH),
            callbacks=[monitor, Capture(monitor)],
            dataset_sink_mode=False,
        )
    finally:
        monitor.close()


if __name__ == "__main__":
    main()
