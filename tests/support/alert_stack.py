"""A real Prometheus and Alertmanager (Debian packages) running the shipped rules and routing, for tests.

The rules are rendered by the same renderer as the committed file, with thresholds and durations shrunk so that
alerts fire in seconds; Prometheus scrapes `job_ports` loopback ports every second as job `mindspore`, and the
committed Alertmanager routing delivers to a test webhook.
"""

from __future__ import annotations

import dataclasses
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import yaml

from ms_exporter.core.thresholds import Thresholds
from ms_exporter.generate.rules import TEST_TIMING, render_rules, render_yaml
from tests.support.servers import Servers, query
from tests.support.victoriametrics import routing_to
from tests.support.waiting import free_port
from tests.support.webhook import Webhook

ROOT = Path(__file__).resolve().parents[2]
JOB = ROOT / "tests" / "integration" / "fault_job.py"

# Small enough to fire within seconds on a fault, large enough to stay quiet on the healthy demo job.
THRESHOLDS = dataclasses.replace(
    Thresholds(),
    loss_high=5.0,
    grad_norm_high=1e6,
    grad_norm_exploding=1e7,
    tokens_per_second_low=3000.0,
    loss_rising_steps=1000,
)
# Throughput is low while the first graph compiles: the throughput alerts wait longer than that.
TIMING = dataclasses.replace(TEST_TIMING, slow_for="15s")


class Stack:
    def __init__(self, tmp: Path, webhook: Webhook, job_ports: int = 1) -> None:
        self.tmp = tmp
        self.job_ports = [free_port() for _ in range(job_ports)]
        self.job_port = self.job_ports[0]
        self.prometheus_port = free_port()
        self.alertmanager_port = free_port()
        self.servers = Servers(tmp)
        (tmp / "rules.yml").write_text(render_yaml(render_rules(THRESHOLDS, TIMING, job_regex="mindspore")))
        # The committed routing, with its placeholder webhooks pointed at the test receiver and waits shortened.
        routing = routing_to(webhook)
        routing["route"].update(group_wait="1s", group_interval="1s", repeat_interval="1h")
        (tmp / "alertmanager.yml").write_text(yaml.safe_dump(routing))
        (tmp / "prometheus.yml").write_text(
            yaml.safe_dump(
                {
                    "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
                    "rule_files": [str(tmp / "rules.yml")],
                    "alerting": {
                        "alertmanagers": [{"static_configs": [{"targets": [f"127.0.0.1:{self.alertmanager_port}"]}]}]
                    },
                    "scrape_configs": [
                        {
                            "job_name": "mindspore",
                            "static_configs": [{"targets": [f"127.0.0.1:{port}" for port in self.job_ports]}],
                        }
                    ],
                }
            )
        )

    def start(self) -> None:
        self.servers.alertmanager(self.alertmanager_port, self.tmp / "alertmanager.yml")
        self.servers.prometheus(self.prometheus_port, self.tmp / "prometheus.yml")

    def query(self, expr: str) -> list[dict[str, Any]]:
        return query(self.prometheus_port, expr)

    def run_job(
        self,
        project: str,
        fault: str,
        port: int | None = None,
        env: dict[str, str] | None = None,
        args: tuple[str, ...] = (),
    ) -> subprocess.Popen[str]:
        """fault_job.py on `port` (the first job port by default), with `env` added to this process's environment."""
        port = self.job_port if port is None else port
        env = {**os.environ, "PYTHONPATH": str(ROOT), "GLOG_v": "3", **(env or {})}
        job = subprocess.Popen(
            [sys.executable, str(JOB), "--port", str(port), "--project", project, "--fault", fault, *args],
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            text=True,
            env=env,
        )
        assert job.stdout is not None
        assert job.stdout.readline().startswith(f"metrics: http://127.0.0.1:{port}/")
        return job

    def stop(self) -> None:
        self.servers.stop()


class ShippedStack:
    """Prometheus and Alertmanager from the shipped files (`make detection`, the remote-write tests), their ports
    and paths moved into `scratch` (and every route's group_wait set to `group_wait` when given: tests that need not
    wait)."""

    def __init__(self, scratch: Path, webhook: Webhook, group_wait: str | None = None) -> None:
        self.scratch = scratch
        self.targets = scratch / "targets"
        self.targets.mkdir()
        self.prometheus_port, self.alertmanager_port = free_port(), free_port()
        config = yaml.safe_load((ROOT / "deploy/prometheus/prometheus.yml").read_text())
        config["rule_files"] = [str(ROOT / "deploy/prometheus/rules/mindspore-training.rules.yml")]
        config["alerting"]["alertmanagers"][0]["static_configs"][0]["targets"] = [f"127.0.0.1:{self.alertmanager_port}"]
        config["scrape_configs"] = [job for job in config["scrape_configs"] if job["job_name"] == "mindspore"]
        config["scrape_configs"][0]["file_sd_configs"][0]["files"] = [str(self.targets / "ms-exporter-*.json")]
        self.intervals = dict(config["global"])
        (scratch / "prometheus.yml").write_text(yaml.safe_dump(config))
        routing = routing_to(webhook, group_wait)
        (scratch / "alertmanager.yml").write_text(yaml.safe_dump(routing))
        self.routes = {
            route["matchers"][0]: route.get("group_wait", routing["route"]["group_wait"])
            for route in routing["route"]["routes"]
        }
        self.servers = Servers(scratch)

    def start(self) -> None:
        self.servers.alertmanager(self.alertmanager_port, self.scratch / "alertmanager.yml")
        self.servers.prometheus(self.prometheus_port, self.scratch / "prometheus.yml")

    def stop(self) -> None:
        self.servers.stop()
