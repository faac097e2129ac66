"""backend: tensorboard, read back with TensorBoard's own event reader (issue #23)."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

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
