"""Detection: how fast each documented failure reaches Alertmanager's webhook, and whether a healthy run pages.

    python -m benchmarks.detection [--output docs/detection.md] [--healthy-minutes 10]

Starts a real Prometheus and a real Alertmanager with the shipped files (deploy/prometheus/prometheus.yml and its
rules, deploy/alertmanager/alertmanager.yml), and beside them the remote-write path from its shipped files:
vmagent (deploy/victoriametrics/vmagent.yml) -> VictoriaMetrics -> vmalert (the same rules file, unchanged) -> a
second Alertmanager (tests/support/victoriametrics.py, the flags of deploy/victoriametrics/*.flags). Only what a
user must change is changed: where the target files are, the ports, and the webhook URLs, which point at a
receiver here (one per path). Then runs one real training per failure of
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
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from benchmarks.report import host
from tests.support.alert_stack import ShippedStack as Stack
from tests.support.servers import Servers
from tests.support.victoriametrics import VMAGENT_CONFIG, VictoriaMetrics, routing_to
from tests.support.waiting import free_port
from tests.support.webhook import Webhook

ROOT = Path(__file__).resolve().parents[1]
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
        "each step cycle twice the healthy mean (tokens/s halved)",
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


class RemoteWrite:
    """vmagent -> VictoriaMetrics -> vmalert -> Alertmanager from the shipped files, scraping the target files in
    `targets`; the second Alertmanager (the shipped routing) delivers to `webhook`."""

    def __init__(self, scratch: Path, webhook: Webhook, targets: Path) -> None:
        self.scratch = scratch / "remote-write"
        self.scratch.mkdir()
        self.targets = targets
        self.alertmanager_port = free_port()
        (self.scratch / "alertmanager.yml").write_text(yaml.safe_dump(routing_to(webhook)))
        self.servers = Servers(self.scratch)
        self.vm = VictoriaMetrics(self.scratch)
        self.scrape_interval = yaml.safe_load(VMAGENT_CONFIG.read_text())["global"]["scrape_interval"]

    def start(self) -> None:
        self.servers.alertmanager(self.alertmanager_port, self.scratch / "alertmanager.yml")
        self.vm.store()
        self.vm.vmagent(self.targets)
        self.vm.vmalert(f"http://127.0.0.1:{self.alertmanager_port}")

    def stop(self) -> None:
        self.vm.stop()
        self.servers.stop()


def _package_version(package: str) -> str:
    try:
        out = subprocess.run(["dpkg-query", "-W", "-f", "${Version}", package], capture_output=True, text=True)
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    return f"{package} {out.stdout.strip()}" if out.returncode == 0 else "unknown"


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


def run(healthy_minutes: float, failures: tuple[Failure, ...] = FAILURES) -> dict[str, Any]:
    began = time.monotonic()
    webhook, vm_webhook = Webhook(), Webhook()
    with tempfile.TemporaryDirectory(prefix="ms-detection-") as directory:
        scratch = Path(directory)
        stack = Stack(scratch, webhook)
        remote = RemoteWrite(scratch, vm_webhook, stack.targets)
        stack.start()
        remote.start()
        jobs: dict[str, Job] = {}
        try:
            healthy_seconds = healthy_minutes * 60
            _start_jobs(jobs, scratch, healthy_seconds, failures)
            results = _first_deliveries(jobs, failures, webhook, vm_webhook)
            healthy = jobs[HEALTHY]
            healthy.process.wait(healthy_seconds + 600)
            ended = time.time()
            time.sleep(WATCH_AFTER_END)
            healthy_pages = alerts_for(webhook, healthy.project, None)
            healthy_vm_pages = alerts_for(vm_webhook, healthy.project, None)
        finally:
            for job in jobs.values():
                job.stop()
            remote.stop()
            stack.stop()
            webhook.close()
            vm_webhook.close()
    return {
        "results": [results[failure.fault] for failure in failures],
        "healthy": {
            "minutes": healthy_minutes,
            "exit": healthy.process.returncode,
            "pages": healthy_pages,
            "remote_write_pages": healthy_vm_pages,
            "watched_after_end": WATCH_AFTER_END,
            "ended": ended,
        },
        "intervals": stack.intervals,
        "remote_write_scrape_interval": remote.scrape_interval,
        "group_wait": stack.routes,
        "seconds": time.monotonic() - began,
        "versions": _versions(),
    }


def _start_jobs(jobs: dict[str, Job], scratch: Path, healthy_seconds: float, failures: tuple[Failure, ...]) -> None:
    """Starts the healthy run and a run per failure, into `jobs` as each starts (so that all started are stopped
    should a later one fail to start)."""
    jobs[HEALTHY] = start_job(scratch, f"detect-{HEALTHY}", "none", healthy_seconds, healthy_seconds)
    for failure in failures:
        time.sleep(1)  # staggered: a dozen MindSpore imports at once would make the first steps crawl
        jobs[failure.fault] = start_job(
            scratch, f"detect-{failure.fault}", failure.fault, failure.healthy_seconds, 3600
        )


def _first_deliveries(
    jobs: dict[str, Job], failures: tuple[Failure, ...], webhook: Webhook, vm_webhook: Webhook
) -> dict[str, dict[str, Any]]:
    """Waits for each failure's alert on both paths (or its deadline, or its job's end), stopping each job once
    settled: a result per fault."""
    results = {}
    waiting = {failure.fault: failure for failure in failures}
    while waiting:
        for fault, failure in list(waiting.items()):
            job = jobs[fault]
            delivered = webhook.first_firing(job.project, failure.alert)
            through_vm = vm_webhook.first_firing(job.project, failure.alert)
            late = job.fault_at is not None and time.time() > job.fault_at + max(3 * failure.target, 300)
            gone = job.fault_at is None and job.process.poll() is not None
            if (delivered is not None and through_vm is not None) or late or gone:
                job.stop()  # the leak must not go on; a stopped job's own alerts are not counted
                results[fault] = {
                    **_result(failure, job, delivered, webhook),
                    "remote_write": _result(failure, job, through_vm, vm_webhook),
                }
                del waiting[fault]
        time.sleep(1)
    return results


def _versions() -> dict[str, str]:
    return {
        "prometheus": _version(shutil.which("prometheus") or "prometheus"),
        "alertmanager": _version(shutil.which("prometheus-alertmanager") or "prometheus-alertmanager"),
        "victoria-metrics": _package_version("victoria-metrics"),
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
    lines = _opening(measured)
    lines += _faults_table(measured["results"])
    lines += ["", "## The healthy run", ""]
    lines += _healthy_lines(measured["healthy"])
    return "\n".join(lines)


def _opening(measured: dict[str, Any]) -> list[str]:
    """The title, how and where the run was made, and how both alert paths were set up."""
    today = datetime.date.today().isoformat()
    return [
        "# Detection",
        "",
        f"Produced by `{COMMAND}` on {today} in {measured['seconds']:.0f} s. Every figure below was measured in "
        "that run; rerun the command to refresh them.",
        "",
        f"Machine: {host()}; {measured['versions']['prometheus']}; "
        f"{measured['versions']['alertmanager']}; {measured['versions'].get('victoria-metrics', 'victoria-metrics')}.",
        "",
        "A real Prometheus and a real Alertmanager run with the shipped files: deploy/prometheus/prometheus.yml "
        f"(scrape every {measured['intervals']['scrape_interval']}, rules evaluated every 10 s as the rules file "
        "sets), its rules as committed, and deploy/alertmanager/alertmanager.yml (group_wait "
        + ", ".join(f"{wait} for {matcher}" for matcher, wait in measured["group_wait"].items())
        + "). Only the target directory, the ports and the webhook URLs are changed. Each failure is a real "
        "training (benchmarks/detection_job.py: a small classifier in PYNATIVE mode, 0.5 s per step, the "
        "monitor with its defaults), healthy first and then with its fault, all at the same time, with a healthy "
        "run beside them. The time is from the first faulty step to the first webhook POST that carries the "
        "alert; the job is stopped once both paths delivered it.",
        "",
        "The VictoriaMetrics column is the remote-write path of deploy/victoriametrics/README.md, watching the same "
        "jobs from the same target files: vmagent with deploy/victoriametrics/vmagent.yml (scrape every "
        f"{measured.get('remote_write_scrape_interval', '5s')}, target files re-read every 5 s) writing to "
        "VictoriaMetrics single node, vmalert evaluating the same rules file unchanged, a second Alertmanager with "
        "the same routing; every flag as deploy/victoriametrics/*.flags ship them, only ports and paths changed.",
        "",
    ]


def _faults_table(results: list[dict[str, Any]]) -> list[str]:
    """How many faults paged within their target on each path, and a row per fault."""
    met = sum(result["met"] for result in results)
    vm_met = sum(result.get("remote_write", {}).get("met", False) for result in results)
    lines = [
        f"## Faults: {met} of {len(results)} within their target through Prometheus, {vm_met} of "
        f"{len(results)} through VictoriaMetrics",
        "",
        "| failure | fault injected | alert | target | Prometheus: first POST after the fault | met | "
        "VictoriaMetrics: first POST after the fault | met | receiver | also delivered for this job before it was "
        "stopped |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for result in results:
        remote = result.get("remote_write")
        others = ", ".join(result["others"]) or "-"
        if remote is not None and remote["others"] != result["others"]:
            others += f" (through VictoriaMetrics: {', '.join(remote['others']) or '-'})"
        lines.append(
            f"| {result['fault']} | {result['what']} | {result['alert']} | {result['target']:.0f} s | "
            f"{_latency(result)} | {'yes' if result['met'] else 'no'} | "
            f"{_latency(remote) if remote else '-'} | {'yes' if remote and remote['met'] else 'no'} | "
            f"{result['receiver'] or '-'} | {others} |"
        )
    return lines


def _healthy_lines(healthy: dict[str, Any]) -> list[str]:
    """What each path delivered for the healthy run, during it and after its end."""
    lines: list[str] = []
    for path, pages in (("Prometheus", healthy["pages"]), ("VictoriaMetrics", healthy.get("remote_write_pages"))):
        if pages is None:
            continue
        lines += [
            f"Through {path}: {healthy['minutes']:g} minutes of training that ends normally (exit code "
            f"{healthy['exit']}), watched {healthy['watched_after_end']} s more after its end: "
            f"**{len(pages)} alerts delivered**"
            + (
                f" ({', '.join(pages)})."
                if pages
                else ": no false page, and its end paged nothing (RankDown and "
                "RankMissing stay quiet for a rank that ended normally)."
            ),
            "",
        ]
    return lines


def _latency(result: dict[str, Any]) -> str:
    if result["latency"] is not None:
        return f"{result['latency']:.0f} s"
    return "never" if result["fault_injected"] else "the fault never started"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--output", default=str(ROOT / "docs/detection.md"))
    parser.add_argument("--healthy-minutes", type=float, default=10.0)
    parser.add_argument(
        "--faults", default=None, help="comma-separated faults to run (all by default; a shorter check run)"
    )
    args = parser.parse_args()
    chosen = args.faults.split(",") if args.faults else [failure.fault for failure in FAILURES]
    measured = run(args.healthy_minutes, tuple(failure for failure in FAILURES if failure.fault in chosen))
    Path(args.output).write_text(render(measured), encoding="utf-8")
    print(render(measured))


if __name__ == "__main__":
    main()
