"""The TensorBoard article's frozen head, for real: the demo model trained with the head's learning rate at 0.
The head's update ratio is 0 and every other layer's is not; Prometheus's own engine (promtool), given the scraped
series, fires MindSporeTrainingLayerFrozen for the head alone; TensorBoard holds the same ratios under
`update_ratio/<layer>` and weight histograms equal to numpy's at the step."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path
from typing import Any

import mindspore as ms
import numpy as np
import pytest
import yaml
from mindspore import nn
from mindspore.train import Callback, Model
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from ms_exporter import TrainingMonitor
from ms_exporter.demo import build_network, synthetic_dataset
from tests.support.scrape import Scrape, scrape

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
RULES = ROOT / "deploy/prometheus/rules/mindspore-training.rules.yml"
STEPS = 40
EVERY = 10


class KeepWeights(Callback):
    """The head's weights at each histogram step (collect_freq), copied as the step ends, and the last scrape."""

    def __init__(self, monitor: TrainingMonitor, network: nn.Cell) -> None:
        super().__init__()
        self.monitor, self.network = monitor, network
        self.weights: dict[int, np.ndarray] = {}
        self.last: Scrape | None = None

    def on_train_step_end(self, run_context: Any) -> None:
        step = run_context.original_args().cur_step_num
        if step == 1 or step % EVERY == 0:  # as SummaryCollector: the first step, then every collect_freq
            self.weights[step] = next(p for p in self.network.trainable_params() if p.name == "head.weight").asnumpy()
            self.weights[step] = self.weights[step].copy()
        if step == STEPS:
            self.monitor.publish()
            self.last = scrape(self.monitor.url)


def train_with_a_frozen_head(tmp_path: Path) -> tuple[TrainingMonitor, KeepWeights]:
    ms.set_context(mode=ms.GRAPH_MODE)
    ms.set_seed(0)
    network = build_network(layers=1, d_model=32, heads=2)
    head = [p for p in network.trainable_params() if p.name.startswith("head.")]
    rest = [p for p in network.trainable_params() if not p.name.startswith("head.")]
    optimizer = nn.Adam([{"params": head, "lr": 0.0}, {"params": rest}], learning_rate=1e-3)
    monitor = TrainingMonitor(
        {
            "backend": ["prometheus", "tensorboard"],
            "port": 0,
            "save_dir": str(tmp_path),
            "web": {"cache_seconds": 0},
            "update_ratio": {"enable": True, "every_n_steps": EVERY, "top_k": 2},
            "tensorboard": {"collect_freq": EVERY, "histogram_regular": "head\\.weight"},
        }
    )
    keep = KeepWeights(monitor, network)
    try:
        Model(network, optimizer=optimizer).train(  # the demo network computes its own loss
            1, synthetic_dataset(size=STEPS * 8, batch=8), callbacks=[monitor, keep], dataset_sink_mode=False
        )
    finally:
        monitor.close()
    return monitor, keep


def promtool_case(found: Scrape, tmp_path: Path) -> Path:
    """A promtool test whose input series are the scraped ratios held for 10 minutes, and which expects the alert
    for the head alone (promtool fails on any other alert of that name, and on a missing one)."""
    scraped = {"job": "mindspore", "instance": "localhost:19420"}

    def selector(name: str, labels: dict[str, str]) -> str:
        inside = ", ".join(f'{key}="{value}"' for key, value in {**scraped, **labels}.items())
        return f"{name}{{{inside}}}"

    series = [
        {"series": selector(sample.name, dict(sample.labels)), "values": f"{sample.value!r}x10"}
        for sample in found.samples
        if sample.name in ("mindspore_train_layer_update_ratio", "mindspore_train_update_ratio_median")
    ]
    rank = found.labels_of("mindspore_train_update_ratio_median")[0]
    who = f"rank {rank['rank']} of project {rank['project']}"
    case = {
        "rule_files": [str(RULES)],
        "evaluation_interval": "1m",
        "tests": [
            {
                "interval": "1m",
                "input_series": series,
                "alert_rule_test": [
                    {
                        "eval_time": "8m",
                        "alertname": "MindSporeTrainingLayerFrozen",
                        "exp_alerts": [
                            {
                                "exp_labels": {**scraped, **rank, "layer": "head", "severity": "warning"},
                                "exp_annotations": {
                                    "summary": "A layer stopped learning",
                                    "description": f"Layer head of {who} moved 0 of its size between samples, under "
                                    "0.01 of the median layer's: its learning rate may be too small for it, or it "
                                    "is frozen.",
                                    "runbook_url": "docs/alerts.md#mindsporetraininglayerfrozen",
                                },
                            }
                        ],
                    }
                ],
            }
        ],
    }
    path = tmp_path / "frozen-head.test.yml"
    path.write_text(yaml.safe_dump(case, sort_keys=False))
    return path


@pytest.mark.skipif(shutil.which("promtool") is None, reason="promtool is not installed")
def test_a_frozen_head_has_a_ratio_of_zero_and_pages_alone(tmp_path: Path) -> None:
    _, keep = train_with_a_frozen_head(tmp_path)
    assert keep.last is not None
    ratios = {
        labels["layer"]: value
        for labels, value in (
            (dict(s.labels), s.value) for s in keep.last.samples if s.name == "mindspore_train_layer_update_ratio"
        )
    }
    assert ratios["head"] == 0.0
    others = {layer: value for layer, value in ratios.items() if layer != "head"}
    assert len(others) >= 2 and all(value > 1e-4 for value in others.values()), others
    assert keep.last.value("mindspore_train_update_ratio_median") > 1e-4
    tested = subprocess.run(
        ["promtool", "test", "rules", str(promtool_case(keep.last, tmp_path))],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert tested.returncode == 0, tested.stdout + tested.stderr

    # TensorBoard: the same ratios at the same step, and the head's histogram as numpy makes it.
    log_dir = next((tmp_path / "tensorboard").glob("*/rank0"))
    reader = EventAccumulator(str(log_dir), size_guidance={"scalars": 0, "histograms": 0})
    reader.Reload()
    at_last = {
        tag.removeprefix("update_ratio/"): {e.step: e.value for e in reader.Scalars(tag)}[STEPS]
        for tag in reader.Tags()["scalars"]
        if tag.startswith("update_ratio/")
    }
    assert at_last == pytest.approx(ratios, rel=1e-6)
    drawn = {event.step: event.histogram_value for event in reader.Histograms("weight/head.weight")}
    assert sorted(drawn) == sorted(keep.weights) and keep.weights
    for step, values in keep.weights.items():
        counts, _ = np.histogram(values, bins=64)
        assert [n for n in drawn[step].bucket if n] == [n for n in counts if n], step
        assert drawn[step].num == values.size
