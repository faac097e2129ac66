"""Train the demo Transformer with TrainingMonitor: the integration a user adds to their own script.

python examples/train_with_monitor.py --config examples/monitor.yaml --epochs 3
"""

from __future__ import annotations

import argparse

import mindspore as ms

from ms_exporter import TrainingMonitor
from ms_exporter.demo import build_model, synthetic_dataset


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", default=None, help="monitor_config YAML (default: built-in defaults)")
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--mode", choices=("graph", "pynative"), default="graph")
    args = parser.parse_args()

    ms.set_context(mode=ms.GRAPH_MODE if args.mode == "graph" else ms.PYNATIVE_MODE)
    monitor = TrainingMonitor(args.config)  # validates the config, opens this rank's /metrics
    print(f"metrics: {monitor.url}", flush=True)
    model = build_model()
    model.train(args.epochs, synthetic_dataset(), callbacks=[monitor], dataset_sink_mode=False)


if __name__ == "__main__":
    main()
