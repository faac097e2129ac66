"""Real Prometheus and Alertmanager (Debian packages) watching real training jobs with injected faults.

One Prometheus and one Alertmanager for the module; each scenario's training job has a known port (the six faults
train at once, each on its own), and a small webhook receiver in this process records what Alertmanager delivers.
The rules are rendered by the same renderer as the committed file, with thresholds and durations shrunk so that
alerts fire in seconds.
"""

from __future__ import annotations

import subprocess
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from tests.support.alert_stack import Stack
from tests.support.dashboard_queries import ADVISOR_PANELS, FAILSLOW_PANEL, without_data
from tests.support.waiting import wait_until
from tests.support.webhook import Webhook

pytestmark = pytest.mark.integration
ROOT = Path(__file__).resolve().parents[2]


def stop_job(job: subprocess.Popen[str]) -> None:
    job.kill()
    job.wait(30)


def test_healthy_run_is_quiet_and_every_dashboard_query_has_data(stack: Stack, webhook: Webhook) -> None:
    job = stack.run_job("healthy", "none")
    try:
        # Long enough for every window of the test timing, the throughput alerts' 15 s included.
        wait_until(
            lambda: stack.query('mindspore_train_global_step{project="healthy"} > 200'),
            120,
            "200 healthy steps scraped",
        )
        time.sleep(20)
        assert job.poll() is None
        assert webhook.firing() == [], webhook.firing()
        # A job of one rank has no replicas (test_divergence.py reads that panel). A CPU machine has no device power or
        # throttling and a host temperature only where the kernel has a sensor: test_dashboard_devices.py runs those
        # queries over device-shaped series; here the host's utilisation. The checkpoint advisor's panels need a restart
        # and saves (test_goodput.py), the fail-slow onset panel a slowed rank (test_failslow.py).
        elsewhere = {
            "Replicas holding the same weights",
            "Device temperature",
            "Device power",
            "Device throttled",
            *ADVISOR_PANELS,
            FAILSLOW_PANEL,
        }
        empty = without_data(stack.query, "healthy", skip=elsewhere)
        assert empty == [], "dashboard queries without data:\n" + "\n".join(empty)
    finally:
        stop_job(job)


FAULTS = [
    ("nan", "MindSporeTrainingLossNonFinite", "/pager"),
    ("loss", "MindSporeTrainingLossHigh", "/tickets"),
    # Stalled fires too; the shipped routing mutes it while MindSporeTrainingHang names the rank.
    ("stall", "MindSporeTrainingHang", "/pager"),
    ("leak", "MindSporeTrainingMemoryGrowth", "/tickets"),
    ("slow", "MindSporeTrainingThroughputLow", "/tickets"),
    ("kill", "MindSporeTrainingRankDown", "/pager"),
]
# The first port is the healthy run's and the demo's; each fault's job has its own, so that all of them train at once.
ALERT_STACK_JOB_PORTS = 1 + len(FAULTS)


@pytest.fixture(scope="module")
def fault_jobs(stack: Stack) -> Iterator[dict[str, subprocess.Popen[str]]]:
    """One training per fault, all started together (their alerts' waits overlap instead of adding up); each test
    stops its own once its page arrived."""
    ports = dict(zip((fault for fault, _, _ in FAULTS), stack.job_ports[1:], strict=True))
    with ThreadPoolExecutor(len(FAULTS)) as pool:
        starting = {fault: pool.submit(stack.run_job, f"fault-{fault}", fault, port) for fault, port in ports.items()}
    jobs = {fault: future.result() for fault, future in starting.items() if future.exception() is None}
    try:
        assert len(jobs) == len(FAULTS), {fault: f.exception() for fault, f in starting.items() if f.exception()}
        yield jobs
    finally:  # the stalled job sleeps an hour: none is left behind, even when another failed to start
        for job in jobs.values():
            if job.poll() is None:
                stop_job(job)


@pytest.mark.parametrize(("fault", "alert", "path"), FAULTS)
def test_fault_reaches_the_webhook_through_alertmanager(
    stack: Stack, webhook: Webhook, fault_jobs: dict[str, subprocess.Popen[str]], fault: str, alert: str, path: str
) -> None:
    project = f"fault-{fault}"
    job = fault_jobs[fault]
    if fault == "kill":  # a rank that was reporting dies mid-training (SIGKILL: no chance to say anything)
        wait_until(
            lambda: stack.query(f'mindspore_train_global_step{{project="{project}"}} > 30'),
            120,
            "the job reporting steps",
        )
        job.kill()
    try:
        delivered = wait_until(
            lambda: [f for f in webhook.firing(project) if f[0] == alert], 150, f"{alert} for {project} at the webhook"
        )
        assert delivered[0][2] == path  # routed by severity: critical pages, warning files a ticket
    finally:
        stop_job(job)
    notification = next(
        n
        for n in webhook.notifications
        for a in n["alerts"]
        if a["labels"].get("project") == project and a["labels"]["alertname"] == alert
    )
    firing = next(a for a in notification["alerts"] if a["labels"]["alertname"] == alert)
    assert firing["labels"]["rank"] == "0" and firing["labels"]["severity"] in ("critical", "warning")
    assert project in firing["annotations"]["description"]
    assert firing["annotations"]["runbook_url"].endswith("#" + alert.lower())


# Long (make test-long): the suite's short version is the nan fault above, the same injection through fault_job.py.
@pytest.mark.long
def test_the_demo_turns_faulty_on_request_and_the_page_arrives(stack: Stack, webhook: Webhook, tmp_path: Path) -> None:
    """README's recipe, its product half: `ms-exporter demo --inject nan` trains healthily, says when it injects,
    and the NaN loss pages through the shipped routing (the recipe itself, with the Debian servers on their fixed
    ports, is timed by hand: docs/getting-started.md)."""
    import os
    import sys

    env = {**os.environ, "PYTHONPATH": str(ROOT), "GLOG_v": "3"}
    command = [sys.executable, "-m", "ms_exporter", "demo", "--inject", "nan", "--inject-after", "5"]
    command += ["--port", str(stack.job_port), "--steps", "100000", "--seconds", "240", "--save-dir", str(tmp_path)]
    job = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, env=env)
    try:
        delivered = wait_until(
            lambda: [f for f in webhook.firing("ms-exporter-demo") if f[0] == "MindSporeTrainingLossNonFinite"],
            180,
            "the demo's NaN loss paged",
        )
        assert delivered[0][2] == "/pager"
    finally:
        job.terminate()  # SIGTERM: the demo ends as a job does, its file_sd target removed
        try:
            job.wait(60)
        except subprocess.TimeoutExpired:
            stop_job(job)
    assert job.stdout is not None
    printed = job.stdout.read()
    assert "injecting 'nan' at step" in printed, printed
