"""A tiny real training with a config shaped like the monitor_config article's block, for the file-writing backends."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import mindspore as ms
import yaml
from mindspore import nn
from mindspore.train import Model

from ms_exporter import TrainingMonitor
from ms_exporter.demo import build_network, synthetic_dataset

STEPS = 24


def train(config: Any) -> TrainingMonitor:
    ms.set_context(mode=ms.GRAPH_MODE)
    ms.set_seed(0)
    network = build_network(layers=1, d_model=32, heads=2)
    model = Model(network, optimizer=nn.Momentum(network.trainable_params(), nn.ExponentialDecayLR(0.01, 0.9, 4), 0.9))
    monitor = TrainingMonitor(config)
    try:
        model.train(1, synthetic_dataset(size=STEPS * 8, batch=8), callbacks=[monitor], dataset_sink_mode=False)
    finally:
        monitor.close()
    return monitor


def seed_shaped_config(tmp_path: Path, backend: str) -> str:
    """A monitor.yaml shaped like the monitor_config article's block (its `metrics` list, a `warn_on_value`), with
    `backend` and save_dir tmp_path/out."""
    config = tmp_path / "monitor.yaml"
    config.write_text(
        yaml.safe_dump(
            {
                "monitor_config": {
                    "backend": backend,
                    "metrics": ["loss", "lr", "tokens_per_second", "memory_usage", "global_rank"],
                    "warn_on_value": {"loss": 50.0},
                    "tags": {"model": "tiny"},
                    "interval": 1,
                    "save_dir": str(tmp_path / "out"),
                }
            }
        )
    )
    return str(config)
