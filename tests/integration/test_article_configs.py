"""Both source articles' configuration blocks, byte for byte, pass check-config and drive a real training: the JSON
Lines file (and, for the third article's `tensorboard: true`, TensorBoard's event files read back with TensorBoard's
own EventAccumulator) hold the loss and the learning rate of every step."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from tests.support.writer_runs import STEPS, train

pytestmark = pytest.mark.integration
ARTICLES = Path(__file__).resolve().parent / "data" / "articles"


def _steps(jsonl: Path) -> dict[int, dict[str, float]]:
    records = [json.loads(line) for line in jsonl.read_text().splitlines()]
    return {record["step"]: record for record in records if record["type"] == "step"}


def _copied(name: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The article's file in a fresh directory that is the working directory (its save_dir is relative)."""
    monkeypatch.chdir(tmp_path)
    return Path(shutil.copy(ARTICLES / name, tmp_path / name))


def _check_config(path: Path) -> str:
    done = subprocess.run(
        [sys.executable, "-m", "ms_exporter", "check-config", str(path)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout


def test_the_third_articles_monitor_config_runs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = _copied("third_article_monitor_config.yaml", tmp_path, monkeypatch)
    assert "tensorboard: true -> backend += tensorboard" in _check_config(path)
    train(str(path))
    steps = _steps(tmp_path / "monitor_output" / "metrics-rank0.jsonl")
    assert sorted(steps) == list(range(1, STEPS + 1))
    assert all(record["loss"] > 0 and record["learning_rate"] > 0 for record in steps.values())
    log_dir = tmp_path / "monitor_output" / "tensorboard" / "bert-large-wwm-pretrain" / "rank0"  # its project's run
    reader = EventAccumulator(str(log_dir), size_guidance={"scalars": 0})
    reader.Reload()
    for tag in ("loss", "learning_rate"):
        assert sorted(event.step for event in reader.Scalars(tag)) == list(range(1, STEPS + 1)), tag


def test_the_first_articles_configuration_file_runs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = _copied("first_article_monitor_config.yaml", tmp_path, monkeypatch)
    assert "strategies[1] GradNormStrategy -> grad_norm.layers, grad_norm.threshold" in _check_config(path)
    train(str(path))
    steps = _steps(tmp_path / "logs" / "transformers_monitor-rank0.jsonl")  # log_path's folder and name
    # Its EarlyStoppingStrategy (patience 10 steps, min_delta 0.001) may stop this small training early.
    assert len(steps) > 10 and sorted(steps) == list(range(1, len(steps) + 1))
    lrs = [steps[step]["learning_rate"] for step in sorted(steps)]
    assert lrs[0] > lrs[-1] and all(record["loss"] > 0 for record in steps.values())
