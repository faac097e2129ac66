"""`ms-exporter report` on the JSON Lines of real training runs, rendered by real headless Chromium."""

from __future__ import annotations

import json
import math
import re
import subprocess
import sys
from pathlib import Path

import mindspore as ms
import pytest
from mindspore import nn
from mindspore.train import Model

from ms_exporter import GradNormTrainOneStepCell, TrainingMonitor
from ms_exporter.core import catalogue as c
from ms_exporter.demo import build_network, demo_flops_model, synthetic_dataset
from ms_exporter.tools.report import ReportError, group_files, load_run, summary
from tests.support.browser import dom, screenshot

pytestmark = pytest.mark.integration


def train_run(save_dir: Path, project: str, steps: int, learning_rate: float, peak: float | None = None) -> Path:
    ms.set_context(mode=ms.GRAPH_MODE)
    ms.set_seed(0)
    network = build_network(layers=1, d_model=32, heads=2)
    model = Model(GradNormTrainOneStepCell(network, nn.Momentum(network.trainable_params(), learning_rate, 0.9)))
    monitor = TrainingMonitor(
        port=0,
        backend=["local"],
        save_dir=str(save_dir),
        project=project,
        interval=0.2,
        grad_norm={"every_n_steps": 2},
        warn_on_value={"loss": 0.6},
        warn_warmup_steps=0,  # 20 and 30 steps: watched from the first
        # with a peak, MFU; without, model FLOPs per second from the parameters (6N)
        flops={"model": demo_flops_model(1, 32, 2), "peak_flops_per_device": peak} if peak else {},
    )
    try:
        model.train(1, synthetic_dataset(size=steps * 8, batch=8), callbacks=[monitor], dataset_sink_mode=False)
    finally:
        monitor.close()
    return save_dir / "metrics-rank0.jsonl"


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> list[Path]:
    base = tmp_path_factory.mktemp("runs")
    return [train_run(base / "a", "report-a", 30, 0.01, peak=1e12), train_run(base / "b", "report-b", 20, 0.05)]


def step_records(path: Path) -> list[dict]:
    return [r for r in map(json.loads, path.read_text().splitlines()) if r["type"] == "step"]


def test_summary_is_what_the_files_say(runs: list[Path]) -> None:
    for path, steps in zip(runs, (30, 20), strict=True):
        run = load_run([path])
        facts = summary(run)
        records = step_records(path)
        losses = [r["loss"] for r in records if isinstance(r["loss"], float) and math.isfinite(r["loss"])]
        assert facts["steps"] == steps == records[-1]["step"]
        assert facts["final_loss"] == losses[-1] and facts["min_loss"] == min(losses)
        snapshots = [r for r in map(json.loads, path.read_text().splitlines()) if r["type"] == "snapshot"]
        episodes = snapshots[-1]["metrics"]['threshold_breaches_total{metric="loss"}']
        assert episodes >= 1 and facts["breaches"] == {"loss": episodes}  # the 0.6 bound was crossed
        assert facts["throughput_p50"] is not None and facts["throughput_unit"] == "tokens/s"
        assert {"train_begin", "train_end"} <= set(facts["events"])
        # The goodput ledger: the run's totals of the last snapshot, written at close.
        assert list(facts["time"]) == list(c.TIME_BUCKETS) and facts["restarts"] == 0
        assert facts["time"] == {
            bucket: snapshots[-1]["metrics"][f'run_time_seconds_total{{bucket="{bucket}"}}']
            for bucket in c.TIME_BUCKETS
        }
        assert facts["time"]["productive"] > 0 and facts["time"]["compile"] > 0
        mfus = sorted(r["mfu"] for r in records if "mfu" in r)
        if path.parent.name == "a":  # with a peak: MFU on every step record, its median in the summary
            assert len(mfus) == steps and facts["mfu_p50"] == mfus[math.ceil(len(mfus) / 2) - 1] and 0 < mfus[-1] < 1
        else:  # without: no MFU, but model FLOPs per second
            assert mfus == [] and facts["mfu_p50"] is None
            assert all(r["model_flops_per_second"] > 0 for r in records)


def test_the_report_draws_both_runs_on_shared_charts(runs: list[Path], tmp_path: Path) -> None:
    output = tmp_path / "report.html"
    done = subprocess.run(
        [sys.executable, "-m", "ms_exporter", "report", *map(str, runs), "-o", str(output)],
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert "project report-a rank 0: 30 steps" in done.stdout
    assert re.search(
        r"rank 0: 30 steps, .*, MFU p50 \d+\.\d%, \d+\.\d% of \d+ s productive \(0 restarts\)", done.stdout
    ), done.stdout
    page = dom(output.as_uri())
    assert 'data-drawn="1"' in page
    points = {}
    for tag in re.findall(r"<canvas [^>]*>", page):
        attributes = dict(re.findall(r'([a-z-]+)="([^"]*)"', tag))
        points[attributes["id"][2:]] = int(attributes["data-points"])
    assert points["loss"] == 30 + 20  # both runs on one chart
    assert points["learning_rate"] == 50 and points["step_time"] == 50
    assert points["grad_norm"] >= 40 and points["memory"] >= 2
    assert points["mfu"] == 50  # run a's MFU, run b's model FLOPs per second (it has no peak)
    # The hardware monitor on a CPU machine: the host's utilisation in each run's snapshots; no device power here,
    # so no power chart (a temperature chart only where the kernel has a sensor).
    assert points["device_utilization"] >= 2 and "device_power" not in points
    assert "report-a rank 0 host" in page
    rows = re.findall(r"<tr><td>.*?</tr>", page)
    assert len(rows) == 2 and "project report-a rank 0" in rows[0] and "<td>30</td>" in rows[0]
    assert re.search(r"<td>loss \d+</td>", rows[0])  # the breach episodes
    bars = re.findall(r'<div class="bar" data-buckets="(\d+)">(.*?)</div>', page)
    assert [int(count) for count, _ in bars] == [len(c.TIME_BUCKETS)] * 2 and all("productive:" in b for _, b in bars)
    screenshot(output.as_uri(), "report.png", 1280, 1000)


def test_rotated_pieces_are_one_run_and_bad_input_is_named(tmp_path: Path, runs: list[Path]) -> None:
    lines = runs[0].read_text().splitlines(keepends=True)
    live, older = tmp_path / "metrics-rank0.jsonl", tmp_path / "metrics-rank0.jsonl.1"
    older.write_text("".join(lines[: len(lines) // 2]))
    live.write_text("".join(lines[len(lines) // 2 :]) + '{"type": "step", "step": 9')  # cut off mid-write
    (group,) = group_files([str(live), str(older)])
    assert group == [older, live]
    assert summary(load_run(group))["steps"] == 30
    garbage = tmp_path / "garbage.jsonl"
    garbage.write_text("not json\n{}\n")
    with pytest.raises(ReportError, match=r"garbage.jsonl:1: not JSON"):
        load_run([garbage])
    done = subprocess.run(
        [sys.executable, "-m", "ms_exporter", "report", str(tmp_path / "missing.jsonl")],
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 1 and "no such file" in done.stderr


def test_a_run_that_ended_nan_shows_nan_as_its_final_loss(tmp_path: Path) -> None:
    path = tmp_path / "metrics-rank0.jsonl"
    lines = [
        {"type": "step", "rank": 0, "project": "nan-run", "step": step, "loss": loss}
        for step, loss in ((1, 0.9), (2, 0.7), (3, 0.52), (4, "NaN"), (5, "NaN"))
    ]
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))
    facts = summary(load_run([path]))
    assert facts["final_loss"] == "NaN" and facts["nonfinite_losses"] == 2
    assert (facts["last_finite_loss"], facts["last_finite_step"]) == (0.52, 3)
    output = tmp_path / "report.html"
    done = subprocess.run(
        [sys.executable, "-m", "ms_exporter", "report", str(path), "-o", str(output)],
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    (row,) = re.findall(r"<tr><td>.*?</tr>", dom(output.as_uri()))
    assert '<span class="bad">NaN</span> (last finite: 0.52 at step 3)' in row
