"""A measurement of your own, as the strategy-container article writes one: a strategy object run by the monitor.

python examples/own_strategy.py [--steps 200]

The strategy below subclasses nothing of ms_exporter's: any object with `on_step_end(metrics, cb_params)` that
returns a dict of numbers works. Its numbers are exported as mindspore_train_user_<name>_<key> on /metrics, in the
JSON Lines file and as TensorBoard/W&B columns (docs/strategies.md). The same class can be named in YAML by its
import path instead:

    monitor_config:
      strategies:
        - name: own_strategy.LossTrendStrategy
          config: {window: 20}
"""

from __future__ import annotations

import argparse
import urllib.request
from collections import deque
from typing import Any

import mindspore as ms

from ms_exporter import TransformersMonitorCallback
from ms_exporter.demo import build_model, synthetic_dataset


class LossTrendStrategy:
    """The loss now against its mean over the last `window` steps (above 1: rising)."""

    def __init__(self, config: dict[str, Any]) -> None:
        self.losses: deque[float] = deque(maxlen=int(config.get("window", 20)))

    def on_step_end(self, metrics: dict[str, Any], cb_params: Any) -> dict[str, float] | None:
        loss = metrics["loss"]
        if loss is None:
            return None
        self.losses.append(loss)
        return {"loss_over_mean": loss / (sum(self.losses) / len(self.losses))}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=200)
    args = parser.parse_args()
    ms.set_context(mode=ms.GRAPH_MODE)
    # The article's form: the strategies as objects, and its config dict (read as it means: log_path -> JSON Lines).
    monitor = TransformersMonitorCallback(
        [LossTrendStrategy({"window": 20})], {"log_path": "./monitor_output/own_strategy.jsonl", "port": 0}
    )
    print(f"metrics: {monitor.url}", flush=True)
    model = build_model()
    model.train(1, synthetic_dataset(size=args.steps * 16), callbacks=[monitor], dataset_sink_mode=False)
    page = urllib.request.urlopen(monitor.url).read().decode()
    print(next(line for line in page.splitlines() if line.startswith("mindspore_train_user_loss_trend_loss_over_mean")))
    monitor.close()


if __name__ == "__main__":
    main()
