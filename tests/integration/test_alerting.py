"""Real Prometheus and Alertmanager (Debian packages) watching real training jobs with injected faults.

One Prometheus and one Alertmanager for the module; each scenario starts a training job on a known port, and a
small webhook receiver in this process records what Alertmanager delivers. The rules are rendered by the same
renderer as the committed file, with thresholds and durations shrunk so that alerts fire in seconds.
"""

from __future__ import annotations

import dataclasses
import os
import subprocess
import sys
import time
import urllib.parse
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from ms_exporter.generate.dashboard import queries, render_dashboard
from ms_exporter.generate.rules import TEST_TIMING, render_rules, render_yaml
from ms_exporter.thresholds import Thresholds
from tests.servers import Servers, query
from tests.waiting import free_port, wait_until
from tests.webhook import Webhook

pytestmark = pytest.mark.integration
ROOT = Path(__file__).resolve().parents[2]
JOB = Path(__file__).with_name("fault_job.py")

# Small enough to fire within seconds on a fault, large enough to stay quiet on the healthy demo job.
THRESHOLDS = dataclasses.replace(Thresholds(), loss_high=5.0, grad_norm_high=1e6, grad_norm_exploding=1e7,
                                 tokens_per_second_low=3000.0, loss_rising_steps=1000)
# Throughput is low while the first graph compiles: the throughput alerts wait longer than that.
TIMING = dataclasses.replace(TEST_TIMING, slow_for="15s")


class Stack:
    def __init__(self, tmp: Path, webhook: Webhook) -> None:
        self.tmp = tmp
        self.job_port = free_port()
        self.prometheus_port = free_port()
        self.alertmanager_port = free_port()
        self.servers = Servers(tmp)
        (tmp / "rules.yml").write_text(render_yaml(render_rules(THRESHOLDS, TIMING, job_regex="mindspore")))
        # The committed routing, with its placeholder webhooks pointed at the test receiver and waits shortened.
        routing = yaml.safe_load((ROOT / "deploy/alertmanager/alertmanager.yml").read_text())
        routing["route"].update(group_wait="1s", group_interval="1s", repeat_interval="1h")
        for receiver in routing["receivers"]:
            for hook in receiver.get("webhook_configs", []):
                path = urllib.parse.urlparse(hook["url"]).path
                hook["url"] = f"http://127.0.0.1:{webhook.port}{path}"
        (tmp / "alertmanager.yml").write_text(yaml.safe_dump(routing))
        (tmp / "prometheus.yml").write_text(yaml.safe_dump({
            "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
            "rule_files": [str(tmp / "rules.yml")],
            "alerting": {"alertmanagers": [{"static_configs": [{"targets": [f"127.0.0.1:{self.alertmanager_port}"]}]}]},
            "scrape_configs": [{"job_name": "mindspore",
                                "static_configs": [{"targets": [f"127.0.0.1:{self.job_port}"]}]}],
        }))

    def start(self) -> None:
        self.servers.alertmanager(self.alertmanager_port, self.tmp / "alertmanager.yml")
        self.servers.prometheus(self.prometheus_port, self.tmp / "prometheus.yml")

    def query(self, expr: str) -> list[dict[str, Any]]:
        return query(self.prometheus_port, expr)

    def run_job(self, project: str, fault: str) -> subprocess.Popen[str]:
        env = {**os.environ, "PYTHONPATH": str(ROOT), "GLOG_v": "3"}
        job = subprocess.Popen([sys.executable, str(JOB), "--port", str(self.job_port), "--project", project,
                                "--fault", fault], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
                               env=env)
        assert job.stdout is not None
        assert job.stdout.readline().startswith(f"metrics: http://127.0.0.1:{self.job_port}/")
        return job

    def stop(self) -> None:
        self.servers.stop()


@pytest.fixture(scope="module")
def webhook() -> Iterator[Webhook]:
    hook = Webhook()
    yield hook
    hook.close()


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory, webhook: Webhook) -> Iterator[Stack]:
    stack = Stack(tmp_path_factory.mktemp("stack"), webhook)
    stack.start()
    yield stack
    stack.stop()


def stop_job(job: subprocess.Popen[str]) -> None:
    job.kill()
    job.wait(30)


def test_healthy_run_is_quiet_and_every_dashboard_query_has_data(stack: Stack, webhook: Webhook) -> None:
    job = stack.run_job("healthy", "none")
    try:
        # Long enough for every window of the test timing, the throughput alerts' 15 s included.
        wait_until(lambda: stack.query('mindspore_train_global_step{project="healthy"} > 200'), 120,
                   "200 healthy steps scraped")
        time.sleep(20)
        assert job.poll() is None
        assert webhook.firing() == [], webhook.firing()
        empty = []
        # A job of one rank has no replicas: test_divergence.py reads that panel's query from a 3-rank job.
        for title, expr in (q for q in queries(render_dashboard()) if q[0] != "Replicas holding the same weights"):
            concrete = (expr.replace("$project", "healthy").replace("$rank", ".*")
                        .replace("$__rate_interval", "10s"))
            if not stack.query(concrete):
                empty.append(f"{title}: {concrete}")
        assert empty == [], "dashboard queries without data:\n" + "\n".join(empty)
    finally:
        stop_job(job)


@pytest.mark.parametrize(
    ("fault", "alert", "path"),
    [
        ("nan", "MindSporeTrainingLossNonFinite", "/pager"),
        ("loss", "MindSporeTrainingLossHigh", "/tickets"),
        # Stalled fires too; the shipped routing mutes it while MindSporeTrainingHang names the rank.
        ("stall", "MindSporeTrainingHang", "/pager"),
        ("leak", "MindSporeTrainingMemoryGrowth", "/tickets"),
        ("slow", "MindSporeTrainingThroughputLow", "/tickets"),
        ("kill", "MindSporeTrainingRankDown", "/pager"),
    ],
)
def test_fault_reaches_the_webhook_through_alertmanager(stack: Stack, webhook: Webhook, fault: str, alert: str,
                                                        path: str) -> None:
    project = f"fault-{fault}"
    job = stack.run_job(project, fault)
    if fault == "kill":  # a rank that was reporting dies mid-training (SIGKILL: no chance to say anything)
        wait_until(lambda: stack.query(f'mindspore_train_global_step{{project="{project}"}} > 30'), 120,
                   "the job reporting steps")
        job.kill()
    try:
        delivered = wait_until(lambda: [f for f in webhook.firing(project) if f[0] == alert], 150,
                               f"{alert} for {project} at the webhook")
        assert delivered[0][2] == path  # routed by severity: critical pages, warning files a ticket
    finally:
        stop_job(job)
    notification = next(n for n in webhook.notifications
                        for a in n["alerts"] if a["labels"].get("project") == project and
                        a["labels"]["alertname"] == alert)
    firing = next(a for a in notification["alerts"] if a["labels"]["alertname"] == alert)
    assert firing["labels"]["rank"] == "0" and firing["labels"]["severity"] in ("critical", "warning")
    assert project in firing["annotations"]["description"]
    assert firing["annotations"]["runbook_url"].endswith("#" + alert.lower())
