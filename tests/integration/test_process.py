"""Whole processes: the demo command, the example script, and a SIGTERM in the middle of training."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from tests.support.scrape import scrape

pytestmark = pytest.mark.integration
ROOT = Path(__file__).resolve().parents[2]


def env() -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(ROOT), "GLOG_v": "3"}


def read_jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_demo_command_trains_and_leaves_jsonl(tmp_path: Path) -> None:
    run = subprocess.run(
        [sys.executable, "-m", "ms_exporter", "demo", "--steps", "200", "--port", "0", "--save-dir", str(tmp_path)],
        capture_output=True,
        text=True,
        env=env(),
        timeout=300,
        check=False,
    )
    assert run.returncode == 0, run.stderr[-3000:]
    first = run.stdout.splitlines()[0]
    assert first.startswith("metrics: http://127.0.0.1:")  # the URL comes first
    assert "done: 200 steps" in run.stdout
    assert re.search(
        r"^time: \d+% of \d+ s productive \(startup [\d.]+ s, compile [\d.]+ s, productive", run.stdout, re.MULTILINE
    ), run.stdout
    records = read_jsonl(tmp_path / "metrics-rank0.jsonl")
    steps = [r for r in records if r["type"] == "step"]
    assert [r["step"] for r in steps] == list(range(1, 201))
    first, last = [r["loss"] for r in steps[:20]], [r["loss"] for r in steps[-20:]]
    assert sum(last) < 0.9 * sum(first)  # the demo model really learns
    assert steps[0]["tokens"] < 16 * 32  # padding excluded
    # The demo measures its peak (a matmul here) and describes its model: an MFU on every step, below 1.
    assert re.search(r"^peak: [\d,.]+ GFLOP/s", run.stdout, re.MULTILINE), run.stdout
    assert all(0 < r["mfu"] < 1 for r in steps)
    # The run is planned: the ETA's planned steps are the run's, and the LR schedule decays over exactly it.
    snapshot = [r for r in records if r["type"] == "snapshot"][-1]["metrics"]
    assert snapshot["planned_steps"] == 200
    assert steps[-1]["learning_rate"] < 1.1e-4 < 9e-4 < steps[0]["learning_rate"]
    assert "live page: http://127.0.0.1:" in run.stdout
    assert f"ms-exporter report {tmp_path / 'metrics-rank0.jsonl'}" in run.stdout


def wait_for_step(url_holder: list[str], proc: subprocess.Popen, minimum: int, deadline: float) -> float:
    while time.monotonic() < deadline:
        assert proc.poll() is None, "training ended before the signal"
        if url_holder:
            try:
                # No step series before train begin: a rank that has not started shows no step at all.
                found = scrape(url_holder[0], timeout=2).find("mindspore_train_global_step")
                if found and found[0] >= minimum:
                    return found[0]
            except OSError:
                pass
        time.sleep(0.2)
    raise AssertionError(f"no step {minimum} before the deadline")


# SIGINT takes the same path as SIGTERM (the relay); the suite keeps SIGTERM, `make test-long` runs both.
@pytest.mark.parametrize(
    "signum",
    [signal.SIGTERM, pytest.param(signal.SIGINT, marks=pytest.mark.long)],
    ids=["sigterm", "sigint"],
)
def test_signal_flushes_jsonl_up_to_the_last_step(tmp_path: Path, signum: int) -> None:
    config = tmp_path / "monitor.yaml"
    # An hour between flushes: everything in the file after the signal was written by the signal handler.
    config.write_text(
        yaml.safe_dump(
            {
                "monitor_config": {
                    "backend": ["prometheus", "local"],
                    "port": 0,
                    "interval": 3600,
                    "save_dir": str(tmp_path),
                    "file_sd_dir": str(tmp_path / "sd"),
                }
            }
        )
    )
    proc = subprocess.Popen(
        [sys.executable, str(ROOT / "examples" / "train_with_monitor.py"), "--config", str(config), "--epochs", "1000"],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
        env=env(),
    )
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        assert line.startswith("metrics: "), line
        url = [line.split(" ", 1)[1].strip()]
        seen = wait_for_step(url, proc, 30, time.monotonic() + 120)
        assert [p.name for p in (tmp_path / "sd").iterdir()] == ["ms-exporter-default-rank0.json"]
        proc.send_signal(signum)
        code = proc.wait(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert code != 0  # the previous handler still ran: the default action / KeyboardInterrupt ended the run
    records = read_jsonl(tmp_path / "metrics-rank0.jsonl")
    steps = [r["step"] for r in records if r["type"] == "step"]
    assert steps == list(range(1, len(steps) + 1))  # complete, in order
    assert steps[-1] >= seen
    events = [r for r in records if r["type"] == "event"]
    assert events[0]["event"] == "train_begin"
    # MindSpore's runtime turns Ctrl+C (SIGINT) into a SIGTERM of its own, so either may be the one recorded.
    assert events[-1]["event"] == "signal" and events[-1]["signal"] in {"SIGTERM", signal.Signals(signum).name}
    assert records[-1]["type"] == "snapshot"
    assert list((tmp_path / "sd").iterdir()) == []  # the stopped rank left service discovery


# Trains (epochs from argv), then idles; "ignore" ignores SIGTERM once the monitor is constructed, as some jobs do.
SIGNAL_JOB = """
import signal, sys, time
import mindspore as ms
from mindspore import nn
from mindspore.train import Model
from ms_exporter import TrainingMonitor
from ms_exporter.demo import build_network, synthetic_dataset

ms.set_context(mode=ms.GRAPH_MODE)
monitor = TrainingMonitor(sys.argv[1])
if sys.argv[2] == "ignore":
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
print(f"metrics: {monitor.url}", flush=True)
network = build_network(layers=1, d_model=32, heads=2)
model = Model(network, optimizer=nn.Momentum(network.trainable_params(), 0.01, 0.9))
model.train(int(sys.argv[3]), synthetic_dataset(size=64, batch=16), callbacks=[monitor], dataset_sink_mode=False)
print("trained", flush=True)
time.sleep(600)
"""


def start_signal_job(tmp_path: Path, mode: str, epochs: int) -> tuple[subprocess.Popen[str], str, Path]:
    config = tmp_path / "monitor.yaml"
    config.write_text(yaml.safe_dump({"monitor_config": {"port": 0, "file_sd_dir": str(tmp_path / "sd")}}))
    proc = subprocess.Popen(
        [sys.executable, "-c", SIGNAL_JOB, str(config), mode, str(epochs)],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
        env=env(),
    )
    assert proc.stdout is not None
    line = proc.stdout.readline()
    assert line.startswith("metrics: "), line
    return proc, line.split(" ", 1)[1].strip(), tmp_path / "sd" / "ms-exporter-default-rank0.json"


def test_a_sigterm_after_training_leaves_no_stale_target(tmp_path: Path) -> None:
    proc, _, target = start_signal_job(tmp_path, "default", 1)
    try:
        assert proc.stdout is not None and proc.stdout.readline().strip() == "trained"
        assert target.exists()
        proc.send_signal(signal.SIGTERM)  # outside Model.train: the handler is in place until close
        assert proc.wait(timeout=60) != 0
    finally:
        if proc.poll() is None:
            proc.kill()
    assert not target.exists()


def test_a_job_that_ignores_sigterm_keeps_training_and_its_target(tmp_path: Path) -> None:
    proc, url, target = start_signal_job(tmp_path, "ignore", 1000)
    try:
        seen = wait_for_step([url], proc, 10, time.monotonic() + 120)
        proc.send_signal(signal.SIGTERM)
        wait_for_step([url], proc, int(seen) + 20, time.monotonic() + 120)  # it trains on
        deadline = time.monotonic() + 30
        while not target.exists() and time.monotonic() < deadline:  # back with the next published step
            time.sleep(0.2)
        assert target.exists()
        assert proc.poll() is None
    finally:
        proc.kill()
        proc.wait(30)
