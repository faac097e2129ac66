"""A job that ends as asked pages nobody; a SIGTERM ends a job whose main thread is stuck in native code.

Real training processes written as README's integration snippet (tests/integration/end_job.py), scraped by a real
Prometheus running the shipped rules and a real Alertmanager running the shipped routing (tests/support/alert_stack.py).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.integration.end_job import STUCK_AFTER_BATCHES
from tests.support.alert_stack import Stack
from tests.support.scrape import scrape
from tests.support.waiting import free_port, wait_until
from tests.support.webhook import Webhook

pytestmark = pytest.mark.integration
ROOT = Path(__file__).resolve().parents[2]
JOB = Path(__file__).with_name("end_job.py")
PAGES = ("MindSporeTrainingRankMissing", "MindSporeTrainingRankDown")
ALERT_STACK_JOB_PORTS = 4  # the stack fixture (tests/integration/conftest.py) scrapes four jobs


def start_job(port: int, project: str, mode: str, logs: Path, save_dir: Path | None = None) -> subprocess.Popen[str]:
    """The job, its stderr in a file under `logs` (not a pipe: a job that logs much never blocks on it)."""
    env = {**os.environ, "PYTHONPATH": str(ROOT), "GLOG_v": "3"}
    job = subprocess.Popen(
        [
            sys.executable,
            str(JOB),
            "--port",
            str(port),
            "--project",
            project,
            "--mode",
            mode,
            *(["--save-dir", str(save_dir)] if save_dir else []),
        ],
        stdout=subprocess.PIPE,
        stderr=(logs / f"{project}.stderr").open("wb"),
        text=True,
        env=env,
    )
    assert job.stdout is not None
    line = job.stdout.readline()
    assert line.startswith(f"metrics at http://127.0.0.1:{port}/"), (line, stderr_of(logs, project))
    return job


def stderr_of(logs: Path, project: str) -> str:
    return (logs / f"{project}.stderr").read_text(errors="replace")[-4000:]


def steps_served(port: int) -> float:
    return max(scrape(f"http://127.0.0.1:{port}/metrics").find("mindspore_train_global_step"), default=-1.0)


def test_a_job_that_ends_as_asked_pages_nobody(stack: Stack, webhook: Webhook, tmp_path: Path) -> None:
    """README's snippet as written (no close()), a Ctrl-C and a SIGTERM: each serves phase="ended" until Prometheus
    read it, so nothing pages. A SIGKILLed job beside them pages, so the pipeline would have paged the others."""
    finish, interrupt, term, kill = stack.job_ports
    jobs = {
        "end-finish": start_job(finish, "end-finish", "finish", tmp_path),
        "end-interrupt": start_job(interrupt, "end-interrupt", "long", tmp_path),
        "end-term": start_job(term, "end-term", "long", tmp_path),
        "end-kill": start_job(kill, "end-kill", "long", tmp_path),
    }
    try:
        for project in jobs:
            wait_until(
                lambda p=project: stack.query(f'mindspore_train_global_step{{project="{p}"}} > 10'),
                240,
                f"{project} scraped past step 10",
            )
        jobs["end-interrupt"].send_signal(signal.SIGINT)
        jobs["end-term"].send_signal(signal.SIGTERM)
        jobs["end-kill"].kill()
        returns = {project: job.wait(timeout=240) for project, job in jobs.items()}
        assert returns["end-finish"] == 0, stderr_of(tmp_path, "end-finish")
        assert returns["end-interrupt"] != 0  # the KeyboardInterrupt still ends the script
        assert returns["end-term"] == -signal.SIGTERM  # the default action, after the last scrape
        # The control pages: the same rules and routing see a rank that vanished.
        wait_until(lambda: any(a in PAGES for a, _, _ in webhook.firing("end-kill")), 120, "end-kill's page")
        for project in ("end-finish", "end-interrupt", "end-term"):
            read = stack.query(f'last_over_time(mindspore_train_phase{{project="{project}",phase="ended"}}[10m]) == 1')
            assert read, f"{project}: Prometheus never read phase=ended\n{stderr_of(tmp_path, project)}"
        # RankMissing/RankDown wait 2 s in these rules: well past that, and past end-kill's page, nothing else.
        time.sleep(10)
        pages = [alert for alert in webhook.firing() if alert[0] in PAGES and alert[1] != "end-kill"]
        assert pages == [], pages
    finally:
        for job in jobs.values():
            if job.poll() is None:
                job.kill()
                job.wait(30)


def test_sigterm_ends_a_training_stuck_in_native_code(tmp_path: Path) -> None:
    """The main thread waits in MindSpore's data pipeline for a sample that never comes: a Python signal handler
    never runs there. The relay's watcher makes the promised saves and ends the process with SIGTERM."""
    port = free_port()
    job = start_job(port, "stuck", "stuck", tmp_path, tmp_path)
    target = tmp_path / "sd" / "ms-exporter-stuck-rank0.json"
    try:
        wait_until(lambda: steps_served(port) >= 1, 240, "the first step")
        assert target.exists()
        # The source says when it blocks; the batches before it are ready, so a data wait of 3 s after that is the
        # stall (a slow source on a loaded machine is not).
        assert job.stdout is not None and job.stdout.readline().strip() == "blocked"
        wait_until(
            lambda: (
                scrape(f"http://127.0.0.1:{port}/metrics").value("mindspore_train_phase", phase="data_wait") == 1
                and scrape(f"http://127.0.0.1:{port}/metrics").value("mindspore_train_phase_seconds") > 3
            ),
            120,
            "the stall to begin",
        )
        job.send_signal(signal.SIGTERM)
        assert job.wait(timeout=90) == -signal.SIGTERM
    finally:
        if job.poll() is None:
            job.kill()
            job.wait(30)
    # The promised saves: the target left discovery, the JSON Lines file has every step and the signal, the
    # goodput ledger's run state was written.
    assert not target.exists()
    records = [json.loads(line) for line in (tmp_path / "metrics-rank0.jsonl").read_text().splitlines()]
    steps = [r["step"] for r in records if r["type"] == "step"]
    assert steps == list(range(1, STUCK_AFTER_BATCHES + 1)), steps  # the data source blocks at the 13th batch
    assert any(r["type"] == "event" and r["event"] == "signal" and r["signal"] == "SIGTERM" for r in records)
    assert list(tmp_path.glob("ms_exporter-run-*-rank0.json"))
