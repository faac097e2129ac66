"""Detection: how fast each documented failure reaches Alertmanager's webhook, and whether a healthy run pages.

    python -m benchmarks.detection [--output docs/detection.md] [--healthy-minutes 10]

Starts a real Prometheus and a real Alertmanager with the shipped files (deploy/prometheus/prometheus.yml and its
rules, deploy/alertmanager/alertmanager.yml). Only what a user must change is changed: where the target files
are, the ports, and the webhook URLs, which point at a receiver here. Then runs one real training per failure of
docs/alerts.md's table at the same time (benchmarks/detection_job.py, small and paced so that they do not slow
one another), each healthy at first and then with its fault, plus a healthy run that ends normally. It records
the time from each fault to the first webhook POST of the alert that documents it, every other alert delivered
for that job, and every alert delivered for the healthy run, and writes docs/detection.md.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import urllib.parse
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from tests.support.servers import Servers
from tests.support.waiting import free_port
from tests.support.webhook import Webhook

ROOT = Path(__file__).resolve().parents[1]
PROMETHEUS_CONFIG = ROOT / "deploy/prometheus/prometheus.yml"
RULES = ROOT / "deploy/prometheus/rules/mindspore-training.rules.yml"
ALERTMANAGER_CONFIG = ROOT / "deploy/alertmanager/alertmanager.yml"
COMMAND = "make detection"
HEALTHY = "healthy"
WATCH_AFTER_END = 120  # seconds the healthy run is watched after it ended normally (RankDown, RankMissing)


@dataclass(frozen=True)
class Failure:
    fault: str  # benchmarks/detection_job.py --fault
    alert: str
    target: float  # seconds, docs/alerts.md
    what: str
    healthy_seconds: float = 150.0  # before the fault: warm-up, and a baseline for the rules that need one


FAILURES = (
    Failure("nan", "MindSporeTrainingLossNonFinite", 45, "the loss becomes NaN"),
    Failure("grad", "MindSporeTrainingGradNormExploding", 45, "the loss (and so every gradient) x 1e5"),
    Failure("loss_high", "MindSporeTrainingLossHigh", 120, "the loss + 100, gradients unchanged"),
    Failure("loss_rising", "MindSporeTrainingLossRising", 120, "the loss + 0.5 more at every step"),
    Failure("leak", "MindSporeTrainingMemoryGrowth", 120, "4 MiB of host memory more at every step (8 MiB/s)"),
    Failure(
        "scale", "MindSporeTrainingLossScaleCollapse", 120, "every step overflows and the loss scale halves (from 1024)"
    ),
    # Stalled fires as well; the shipped routing mutes it while Hang, which names the rank, fires for the project.
    Failure("stall", "MindSporeTrainingHang", 180, "a step begins and never ends (a sleep of an hour)"),
    Failure(
        "slow",
        "MindSporeTrainingThroughputDrop",
        300,
        "each step cycle twice as long as the healthy ones (tokens/s halved)",
        healthy_seconds=210.0,
    ),
    Failure("kill", "MindSporeTrainingRankDown", 60, "the process is killed (SIGKILL): its target stays"),
    Failure(
        "crash",
        "MindSporeTrainingRankMissing",
        60,
        "training raises and the process exits: its target file goes with it",
    ),
)


@dataclass
class Job:
    project: str
    fault: str
    process: subprocess.Popen[str]
    fault_at: float | None = None
    stopped_at: float | None = None
    lines: list[str] = field(default_factory=list)

    def read(self) -> None:
        assert self.process.stdout is not None
        for line in self.process.stdout:
            self.lines.append(line)
            if line.startswith('{"fault_at"'):
                self.fault_at = float(json.loads(line)["fault_at"])

    def stop(self) -> None:
        if self.stopped_at is None:
            self.stopped_at = time.time()
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGKILL)
        self.process.wait(30)


class Stack:
    """Prometheus and Alertmanager from the shipped files, their ports and paths moved into `scratch`."""

    def __init__(self, scratch: Path, webhook: Webhook) -> None:
        self.scratch = scratch
        self.targets = scratch / "targets"
        self.targets.mkdir()
        self.prometheus_port, self.alertmanager_port = free_port(), free_port()
        config = yaml.safe_load(PROMETHEUS_CONFIG.read_text())
        config["rule_files"] = [str(RULES)]
        config["alerting"]["alertmanagers"][0]["static_configs"][0]["targets"] = [f"127.0.0.1:{self.alertmanager_port}"]
        config["scrape_configs"] = [job for job in config["scrape_configs"] if job["job_name"] == "mindspore"]
        config["scrape_configs"][0]["file_sd_configs"][0]["files"] = [str(self.targets / "ms-exporter-*.json")]
        self.intervals = dict(config["global"])
        (scratch / "prometheus.yml").write_text(yaml.safe_dump(config))
        routing = yaml.safe_load(ALERTMANAGER_CONFIG.read_text())
        for receiver in routing["receivers"]:
            for hook in receiver.get("webhook_configs", []):
                hook["url"] = f"http://127.0.0.1:{webhook.port}{urllib.parse.urlparse(hook['url']).path}"
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


def _version(binary: str) -> str:
    try:
        out = subprocess.run([binary, "--version"], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    first = (out.stdout or out.stderr).splitlines()
    return first[0] if first else "unknown"


def start_job(scratch: Path, project: str, fault: str, healthy_seconds: float, seconds: float) -> Job:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "GLOG_v": "3"}
    process = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "benchmarks.detection_job",
            "--project",
            project,
            "--fault",
            fault,
            "--file-sd-dir",
            str(scratch / "targets"),
            "--save-dir",
            str(scratch / project),
            "--healthy-seconds",
            str(healthy_seconds),
            "--seconds",
            str(seconds),
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
        env=env,
        cwd=ROOT,
    )
    job = Job(project, fault, process)
    threading.Thread(target=job.read, daemon=True).start()
    return job


def alerts_for(webhook: Webhook, project: str, until: float | None) -> list[str]:
    """Each alert delivered firing for `project` (before `until`), once, with its first delivery time."""
    seen: dict[str, float] = {}
    for notification in list(webhook.notifications):
        if until is not None and notification["received_at"] > until:
            continue
        for alert in notification["alerts"]:
            if alert["status"] == "firing" and alert["labels"].get("project") == project:
                seen.setdefault(alert["labels"]["alertname"], notification["received_at"])
    return sorted(seen, key=seen.__getitem__)


def run(healthy_minutes: float) -> dict[str, Any]:
    began = time.monotonic()
    webhook = Webhook()
    with tempfile.TemporaryDirectory(prefix="ms-detection-") as directory:
        scratch = Path(directory)
        stack = Stack(scratch, webhook)
        stack.start()
        jobs: dict[str, Job] = {}
        try:
            healthy_seconds = healthy_minutes * 60
            jobs[HEALTHY] = start_job(scratch, f"detect-{HEALTHY}", "none", healthy_seconds, healthy_seconds)
            for failure in FAILURES:
                time.sleep(1)  # staggered: a dozen MindSpore imports at once would make the first steps crawl
                jobs[failure.fault] = start_job(
                    scratch, f"detect-{failure.fault}", failure.fault, failure.healthy_seconds, 3600
                )
            results = {}
            waiting = {failure.fault: failure for failure in FAILURES}
            while waiting:
                for fault, failure in list(waiting.items()):
                    job = jobs[fault]
                    delivered = webhook.first_firing(job.project, failure.alert)
                    late = job.fault_at is not None and time.time() > job.fault_at + max(3 * failure.target, 300)
                    gone = job.fault_at is None and job.process.poll() is not None
                    if delivered is not None or late or gone:
                        job.stop()  # the leak must not go on; a stopped job's own alerts are not counted
                        results[fault] = _result(failure, job, delivered, webhook)
                        del waiting[fault]
                time.sleep(1)
            healthy = jobs[HEALTHY]
            healthy.process.wait(healthy_seconds + 600)
            ended = time.time()
            time.sleep(WATCH_AFTER_END)
            healthy_pages = alerts_for(webhook, healthy.project, None)
        finally:
            for job in jobs.values():
                job.stop()
            stack.stop()
            webhook.close()
    return {
        "results": [results[failure.fault] for failure in FAILURES],
        "healthy": {
            "minutes": healthy_minutes,
            "exit": healthy.process.returncode,
            "pages": healthy_pages,
            "watched_after_end": WATCH_AFTER_END,
            "ended": ended,
        },
        "intervals": stack.intervals,
        "group_wait": stack.routes,
        "seconds": time.monotonic() - began,
        "versions": {
            "prometheus": _version(shutil.which("prometheus") or "prometheus"),
            "alertmanager": _version(shutil.which("prometheus-alertmanager") or "prometheus-alertmanager"),
        },
    }


def _result(failure: Failure, job: Job, delivered: dict[str, Any] | None, webhook: Webhook) -> dict[str, Any]:
    latency = delivered["received_at"] - job.fault_at if delivered is not None and job.fault_at else None
    others = [name for name in alerts_for(webhook, job.project, job.stopped_at) if name != failure.alert]
    return {
        "fault": failure.fault,
        "alert": failure.alert,
        "target": failure.target,
        "what": failure.what,
        "latency": latency,
        "receiver": delivered["path"] if delivered is not None else None,
        "fault_injected": job.fault_at is not None,
        "others": others,
        "met": latency is not None and latency <= failure.target,
    }


def render(measured: dict[str, Any]) -> str:
    today = datetime.date.today().isoformat()
    healthy = measured["healthy"]
    met = sum(result["met"] for result in measured["results"])
    lines = [
        "# Detection",
        "",
        f"Produced by `{COMMAND}` on {today} in {measured['seconds']:.0f} s. Every figure below was measured in "
        "that run; rerun the command to refresh them.",
        "",
        f"Machine: {platform.processor() or platform.machine()}, {os.cpu_count()} cores; {platform.platform()}; "
        f"Python {platform.python_version()}; {measured['versions']['prometheus']}; "
        f"{measured['versions']['alertmanager']}.",
        "",
        "A real Prometheus and a real Alertmanager run with the shipped files: deploy/prometheus/prometheus.yml "
        f"(scrape every {measured['intervals']['scrape_interval']}, rules evaluated every 10 s as the rules file "
        "sets), its rules as committed, and deploy/alertmanager/alertmanager.yml (group_wait "
        + ", ".join(f"{wait} for {matcher}" for matcher, wait in measured["group_wait"].items())
        + "). Only the target directory, the ports and the webhook URLs are changed. Each failure is a real "
        "training (benchmarks/detection_job.py: a small classifier in PYNATIVE mode, 0.5 s per step, the "
        "monitor with its defaults), healthy first and then with its fault, all at the same time, with a healthy "
        "run beside them. The time is from the first faulty step to the first webhook POST that carries the "
        "alert; the job is stopped then.",
        "",
        f"## Faults: {met} of {len(measured['results'])} within their target",
        "",
        "| failure | fault injected | alert | target | first POST after the fault | met | receiver | also "
        "delivered for this job before it was stopped |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for result in measured["results"]:
        latency = (
            f"{result['latency']:.0f} s"
            if result["latency"] is not None
            else ("never" if result["fault_injected"] else "the fault never started")
        )
        lines.append(
            f"| {result['fault']} | {result['what']} | {result['alert']} | {result['target']:.0f} s | "
            f"{latency} | {'yes' if result['met'] else 'no'} | {result['receiver'] or '-'} | "
            f"{', '.join(result['others']) or '-'} |"
        )
    pages = healthy["pages"]
    lines += [
        "",
        "## The healthy run",
        "",
        f"{healthy['minutes']:g} minutes of training that ends normally (exit code {healthy['exit']}), watched "
        f"{healthy['watched_after_end']} s more after its end: **{len(pages)} alerts delivered**"
        + (
            f" ({', '.join(pages)})."
            if pages
            else ": no false page, and its end paged nothing (RankDown and "
            "RankMissing stay quiet for a rank that ended normally)."
        ),
        "",
    ]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--output", default=str(ROOT / "docs/detection.md"))
    parser.add_argument("--healthy-minutes", type=float, default=10.0)
    args = parser.parse_args()
    measured = run(args.healthy_minutes)
    Path(args.output).write_text(render(measured), encoding="utf-8")
    print(render(measured))


if __name__ == "__main__":
    main()
