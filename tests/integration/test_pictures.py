"""Pictures that tell the truth: the live page and the report of a run that went NaN and of a run that stalled.

Real trainings (tests/integration/fault_job.py), the pages rendered by headless Chromium; the screenshots go to
test-artifacts/ (live-nan-run.png, report-nan-run.png, live-stalled-run.png, report-stalled-run.png) for a reviewer,
and the assertions check what they show.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tests.integration.fault_job import HEALTHY_STEPS
from tests.support.browser import dom, screenshot
from tests.support.scrape import scrape
from tests.support.waiting import free_port, wait_until

pytestmark = pytest.mark.integration
ROOT = Path(__file__).resolve().parents[2]
JOB = Path(__file__).with_name("fault_job.py")
STEP_CHARTS = ("loss", "loss_smoothed", "learning_rate", "throughput", "step_time", "grad_norm")


@dataclass
class Run:
    live_page: str  # the live page's DOM while the fault was on
    jsonl: Path


def start(tmp: Path, project: str, *arguments: str) -> tuple[subprocess.Popen[str], str]:
    port = free_port()
    env = {**os.environ, "PYTHONPATH": str(ROOT), "GLOG_v": "3"}
    job = subprocess.Popen(
        [sys.executable, str(JOB), "--port", str(port), "--project", project, "--save-dir", str(tmp), *arguments],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
        env=env,
    )
    assert job.stdout is not None and job.stdout.readline().startswith("metrics: ")
    return job, f"http://127.0.0.1:{port}/"


def series(base: str) -> dict[str, Any]:
    import urllib.request

    with urllib.request.urlopen(base + "api/series?since=-1", timeout=10) as response:
        return dict(json.loads(response.read()))


def canvases(page: str) -> dict[str, dict[str, str]]:
    found = {}
    for tag in re.findall(r"<canvas [^>]*>", page):
        attributes = dict(re.findall(r'([a-z-]+)="([^"]*)"', tag))
        found[attributes["id"][2:]] = attributes
    return found


def report(jsonl: Path, output: Path, *options: str) -> tuple[str, str]:
    done = subprocess.run(
        [sys.executable, "-m", "ms_exporter", "report", str(jsonl), "-o", str(output), *options],
        capture_output=True,
        text=True,
        check=False,
        cwd=ROOT,
    )
    assert done.returncode == 0, done.stderr
    return done.stdout, dom(output.as_uri())


def steps_of(jsonl: Path) -> list[int]:
    return [r["step"] for r in map(json.loads, jsonl.read_text().splitlines()) if r["type"] == "step"]


def watch(tmp: Path, project: str, arguments: tuple[str, ...], faulted: Callable[[str], bool], what: str) -> Run:
    """Run the fault job, keep the live page (DOM and live-<project>.png) once `faulted(base URL)`, let it end."""
    job, base = start(tmp, project, *arguments)

    def seen() -> bool:
        try:
            return faulted(base)
        except OSError:  # not serving: not up yet, or ended before the fault was seen (say so now, not at timeout)
            assert job.poll() is None, f"the job ended (exit code {job.returncode}) before {what} were seen"
            raise

    try:
        wait_until(seen, 240, what)
        page = dom(base)
        screenshot(base, f"live-{project}.png", 1280, 900)
        assert job.wait(240) == 0
    finally:
        job.kill()
    return Run(page, tmp / "metrics-rank0.jsonl")


@pytest.fixture(scope="module")
def nan_run(tmp_path_factory: pytest.TempPathFactory) -> Run:
    """Healthy for HEALTHY_STEPS steps, then every loss NaN until the run ends normally."""
    return watch(
        tmp_path_factory.mktemp("nan-run"),
        "nan-run",
        ("--fault", "nan", "--seconds", "40"),
        lambda base: scrape(base + "metrics").value("mindspore_train_nonfinite_loss_total") >= 15,
        "15 NaN steps",
    )


@pytest.fixture(scope="module")
def stalled_run(tmp_path_factory: pytest.TempPathFactory) -> Run:
    """Healthy, then one step whose callback hook stands still for 20 s (hang.min_seconds 5), then healthy again."""

    def stalled(base: str) -> bool:
        now = series(base)
        return bool(now["hang_deadline"] and now["phase_seconds"] > now["hang_deadline"] + 2)

    return watch(
        tmp_path_factory.mktemp("stalled-run"),
        "stalled-run",
        ("--fault", "pause", "--pause", "20", "--seconds", "45"),
        stalled,
        "the run standing still past its hang deadline",
    )


def test_live_page_of_a_nan_run_marks_the_nan_steps_and_says_non_finite(nan_run: Run) -> None:
    charts = canvases(nan_run.live_page)
    assert int(charts["loss"]["data-markers"]) >= 15  # a red tick per NaN step on the loss chart
    assert int(charts["learning_rate"]["data-markers"]) == 0  # NaN and breach marks only where they belong
    assert re.search(r'id="v-loss"[^>]*>non-finite<', nan_run.live_page)


def test_report_of_a_nan_run_spans_the_whole_run_on_every_chart_and_ends_nan(nan_run: Run, tmp_path: Path) -> None:
    steps = steps_of(nan_run.jsonl)
    printed, page = report(nan_run.jsonl, tmp_path / "report.html")
    assert "final loss NaN" in printed
    charts = canvases(page)
    for chart in STEP_CHARTS:  # the loss is finite only until the fault: the axis still runs to the last step
        assert float(charts[chart]["data-x-max"]) == steps[-1], chart
        assert float(charts[chart]["data-x-min"]) == steps[0], chart
    assert int(charts["loss"]["data-markers"]) == len(steps) - HEALTHY_STEPS
    assert int(charts["loss_smoothed"]["data-points"]) == HEALTHY_STEPS  # a gap, not a flat line, once NaN
    (row,) = re.findall(r"<tr><td>.*?</tr>", page)
    assert '<span class="bad">NaN</span> (last finite: ' in row and f"at step {HEALTHY_STEPS})" in row
    screenshot((tmp_path / "report.html").as_uri(), "report-nan-run.png", 1280, 1100)


def test_live_page_of_a_stalled_run_says_stalled_in_which_phase(stalled_run: Run) -> None:
    # The fault job stands still inside a callback's step hook, which the monitor times as the callbacks phase.
    status = re.search(r'id="status"[^>]*>([^<]*)<', stalled_run.live_page)
    assert status is not None and status.group(1).startswith("stalled: in callbacks for "), status
    assert 'data-phase="callbacks"' in stalled_run.live_page


def test_report_of_a_stalled_run_shows_the_stall_by_wall_clock(stalled_run: Run, tmp_path: Path) -> None:
    printed, page = report(stalled_run.jsonl, tmp_path / "report.html", "--hang-min-seconds", "5")
    assert re.search(rf"stalled 2\d s at step {HEALTHY_STEPS}\b", printed), printed
    (row,) = re.findall(r"<tr><td>.*?</tr>", page)
    assert re.search(rf'<span class="bad">1</span>: 2\d\.\ds at step {HEALTHY_STEPS}<', row), row
    charts = canvases(page)
    for chart in ("wall_data_wait", "wall_step_time"):  # where the stall began and ended, on the wall-clock axis
        assert int(charts[chart]["data-markers"]) == 2, chart
        assert float(charts[chart]["data-x-max"]) > 20 / 60, chart
    screenshot((tmp_path / "report.html").as_uri(), "report-stalled-run.png", 1280, 1100)
    # With the monitor's default floor (120 s) a 20 s pause is no stall: the report follows the hang deadline.
    printed, _ = report(stalled_run.jsonl, tmp_path / "default.html")
    assert ", stalled " not in printed
