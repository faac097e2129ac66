"""The configuration blocks of the strategy-container and monitor_config articles, byte for byte, pass check-config
and drive a real training: the JSON Lines file (and, for the monitor_config article's `tensorboard: true`,
TensorBoard's event files read back with TensorBoard's own EventAccumulator) hold the loss and the learning rate of
every step. Their code as written trains too: the strategy-container article's container with its strategy classes,
the monitor_config article's build_monitor_callbacks (named in a warning) and its check that the monitor works (the
progress line)."""

from __future__ import annotations

import json
import logging
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import mindspore as ms
import pytest
import yaml
from mindspore import nn
from mindspore.train import Model
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from ms_exporter import (
    EarlyStoppingStrategy,
    GradNormStrategy,
    LossMonitorStrategy,
    MindSporeTransformersMonitor,
    TrainingMonitor,
    TransformersMonitorCallback,
)
from ms_exporter.demo import build_network, synthetic_dataset
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


def _train_with(monitor: TrainingMonitor) -> None:
    ms.set_context(mode=ms.GRAPH_MODE)
    ms.set_seed(0)
    network = build_network(layers=1, d_model=32, heads=2)
    model = Model(network, optimizer=nn.Momentum(network.trainable_params(), nn.ExponentialDecayLR(0.01, 0.9, 4), 0.9))
    try:
        model.train(1, synthetic_dataset(size=STEPS * 8, batch=8), callbacks=[monitor], dataset_sink_mode=False)
    finally:
        monitor.close()


def _progress_lines(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.getMessage().startswith("ms_exporter: step ")]


def test_the_first_articles_container_code_trains_with_its_strategy_classes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """Its section 4.4 as written: the file loaded, the built-in strategies built from their `config` entries."""
    caplog.set_level(logging.INFO, logger="ms_exporter")
    path = _copied("first_article_monitor_config.yaml", tmp_path, monkeypatch)
    config = yaml.safe_load(path.read_text())
    strategies = [
        LossMonitorStrategy(config["strategies"][0]["config"]),
        GradNormStrategy(config["strategies"][1]["config"]),
        EarlyStoppingStrategy(config["strategies"][2]["config"]),
    ]
    monitor_cb = TransformersMonitorCallback(strategies, config, port=0)
    _train_with(monitor_cb)
    assert monitor_cb.config.loss_window == 50 and monitor_cb.config.grad_norm.threshold == 10.0
    assert monitor_cb.config.actions.early_stop.enable and monitor_cb.config.actions.early_stop.unit == "step"
    steps = _steps(tmp_path / "logs" / "transformers_monitor-rank0.jsonl")
    assert len(steps) > 10 and sorted(steps) == list(range(1, len(steps) + 1))
    losses = [steps[step]["loss"] for step in sorted(steps)]
    # window_size 50 is longer than the run: the smoothed loss is the mean of every loss so far.
    last = steps[max(steps)]
    assert last["loss_smoothed"] == pytest.approx(sum(losses) / len(losses), rel=1e-5)
    assert _progress_lines(caplog), "the progress line, with only JSON Lines and Prometheus on"


def test_the_third_articles_progress_line_comes_in_a_real_training_without_backend_console(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """Its section 3.3's check that the monitor works, with the block as written (backend local, tensorboard)."""
    caplog.set_level(logging.INFO, logger="ms_exporter")
    path = _copied("third_article_monitor_config.yaml", tmp_path, monkeypatch)
    block = yaml.safe_load(path.read_text())["monitor_config"]
    _train_with(MindSporeTransformersMonitor(block, interval=0.05))
    lines = _progress_lines(caplog)
    assert lines and lines[0].startswith("ms_exporter: step 1 epoch 1 loss ")
    assert all(" loss " in line and " lr " in line for line in lines), lines
    assert not [r for r in caplog.records if "callback.params alone" in r.getMessage()]


def test_the_third_articles_callback_params_alone_warn_in_a_real_training(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """Its build_monitor_callbacks, as written, hands the class `callback.params` only."""
    caplog.set_level(logging.INFO, logger="ms_exporter")
    path = _copied("third_article_monitor_config.yaml", tmp_path, monkeypatch)
    cfg = yaml.safe_load(path.read_text())["monitor_config"]

    def build_monitor_callbacks(cfg: dict[str, Any]) -> list[TrainingMonitor]:
        callbacks: list[TrainingMonitor] = []
        if not cfg.get("enable", False):
            return callbacks
        monitor_cfg = cfg.get("callback", {})
        if monitor_cfg.get("type", "MindSporeTransformersMonitor") == "MindSporeTransformersMonitor":
            callbacks.append(MindSporeTransformersMonitor(monitor_cfg.get("params", {})))
        return callbacks

    monkeypatch.setenv("MS_EXPORTER_PORT", "0")  # the default port may be taken on a test machine
    (monitor,) = build_monitor_callbacks(cfg)
    _train_with(monitor)
    warned = [
        r.getMessage() for r in caplog.records if r.levelno == logging.WARNING and "params alone" in r.getMessage()
    ]
    assert len(warned) == 1 and "MindSporeTransformersMonitor(cfg)" in warned[0], warned
    assert not (tmp_path / "monitor_output" / "metrics-rank0.jsonl").exists()  # the block's backend never reached it
    assert monitor.url is not None
