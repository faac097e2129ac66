"""backend: tensorboard, read back with TensorBoard's own event reader."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import mindspore as ms
import numpy as np
import pytest
from mindspore import nn
from mindspore.train import Callback, Model
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from ms_exporter import TrainingMonitor
from ms_exporter.demo import build_network, synthetic_dataset
from tests.support.writer_runs import STEPS, seed_shaped_config, train

pytestmark = pytest.mark.integration


def scalars(log_dir: Path) -> dict[str, dict[int, float]]:
    """Every scalar series in the event files, by tag and step, as TensorBoard reads them."""
    reader = EventAccumulator(str(log_dir), size_guidance={"scalars": 0})
    reader.Reload()
    return {tag: {event.step: event.value for event in reader.Scalars(tag)} for tag in reader.Tags()["scalars"]}


def test_a_seed_shaped_config_runs_unchanged_and_tensorboard_reads_its_series(tmp_path: Path) -> None:
    train(seed_shaped_config(tmp_path, "tensorboard"))
    found = scalars(tmp_path / "out" / "tensorboard" / "default" / "rank0")
    for tag in ("loss", "learning_rate", "tokens_per_second"):
        assert sorted(found[tag]) == list(range(1, STEPS + 1)), tag
    assert all(math.isfinite(value) and value > 0 for value in found["loss"].values())
    assert "samples_per_second" not in found  # switched off by `metrics`, as everywhere else


def test_tensorboard_holds_the_same_loss_lr_and_throughput_per_step_as_the_json_lines_file(tmp_path: Path) -> None:
    train({"backend": ["tensorboard", "local"], "save_dir": str(tmp_path), "interval": 1, "port": 0})
    records = [json.loads(line) for line in (tmp_path / "metrics-rank0.jsonl").read_text().splitlines()]
    steps = {record["step"]: record for record in records if record["type"] == "step"}
    found = scalars(tmp_path / "tensorboard" / "default" / "rank0")
    assert len(steps) == STEPS
    for key in ("loss", "learning_rate", "tokens_per_second", "samples_per_second", "step_duration_seconds"):
        assert sorted(found[key]) == sorted(steps), key
        for step, record in steps.items():
            # TensorBoard keeps float32: equal to that precision
            assert found[key][step] == pytest.approx(record[key], rel=1e-6), (key, step)
    lrs = [found["learning_rate"][step] for step in sorted(steps)]
    assert lrs[0] > lrs[-1]  # the schedule's decay is there, step by step


def test_weight_and_gradient_histograms_hold_the_values_of_their_step(tmp_path: Path) -> None:
    """A real training whose train cell returns its gradients: each histogram's min, max, count and sum are numpy's
    of the parameter (or its gradient) at the step it is drawn at, read back by TensorBoard's own reader."""
    ms.set_context(mode=ms.GRAPH_MODE)
    ms.set_seed(0)
    network = build_network(layers=1, d_model=32, heads=2)
    cell = nn.TrainOneStepCell(network, nn.Momentum(network.trainable_params(), 0.01, 0.9), return_grad=True)
    chosen = {p.name: p for p in network.trainable_params() if p.name.startswith(("head.", "encoder.layers.0.dense"))}
    every = 8
    seen: dict[str, np.ndarray] = {}  # `<tag>@<step>`: the values then, as numpy reads them

    class Keep(Callback):
        def on_train_step_end(self, run_context: Any) -> None:
            args = run_context.original_args()
            if args.cur_step_num % every and args.cur_step_num != 1:  # drawn at the first step too
                return
            _, grads = args.net_outputs
            for name, parameter in chosen.items():
                seen[f"weight/{name}@{args.cur_step_num}"] = parameter.asnumpy().copy()
                seen[f"grad/{name}@{args.cur_step_num}"] = grads[name].asnumpy().copy()

    monitor = TrainingMonitor(
        {
            "backend": "tensorboard",
            "save_dir": str(tmp_path),
            "port": 0,
            "tensorboard": {"collect_freq": every, "histogram_regular": r"head\.|encoder\.layers\.0\.dense"},
        }
    )
    try:
        Model(cell).train(
            1, synthetic_dataset(size=STEPS * 8, batch=8), callbacks=[monitor, Keep()], dataset_sink_mode=False
        )
    finally:
        monitor.close()
    reader = EventAccumulator(str(tmp_path / "tensorboard" / "default" / "rank0"), size_guidance={"histograms": 0})
    reader.Reload()
    drawn = {
        f"{tag}@{event.step}": event.histogram_value
        for tag in reader.Tags()["histograms"]
        for event in reader.Histograms(tag)
    }
    assert sorted(drawn) == sorted(seen)  # weights and gradients of each chosen parameter at steps 1, 8, 16, 24
    for key, values in seen.items():
        histogram, exact = drawn[key], values.astype(np.float64).reshape(-1)
        assert histogram.num == exact.size, key
        assert (histogram.min, histogram.max) == (exact.min(), exact.max()), key
        # summed in float32 on the device: numpy's float64 sum to a part in 1e5 of the values' magnitude
        assert histogram.sum == pytest.approx(exact.sum(), abs=1e-5 * np.abs(exact).sum()), key
        assert sum(histogram.bucket) == exact.size, key
