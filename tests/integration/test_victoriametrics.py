"""The remote-write path, run as an operator would: vmagent -> VictoriaMetrics -> vmalert -> Alertmanager, beside
Prometheus -> Alertmanager, both from the shipped files (Debian's `victoria-metrics` 1.79 package).

vmagent runs deploy/victoriametrics/vmagent.yml with the flags of deploy/victoriametrics/*.flags; vmalert evaluates
deploy/prometheus/rules/*.yml unchanged. Prometheus runs the shipped prometheus.yml (benchmarks/detection.py's
stack). Both scrape the same target directory, each path has its own Alertmanager (the shipped routing, waits
shortened) and webhook, and three real trainings fail at the same time: a NaN loss, a stall, a SIGKILL. Each
fault must page through both paths with the same alert and rank.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.support.alert_stack import ShippedStack as PrometheusStack
from tests.support.servers import Servers, query
from tests.support.victoriametrics import VictoriaMetrics, routing_to
from tests.support.waiting import free_port, wait_until
from tests.support.webhook import Webhook

pytestmark = pytest.mark.integration
ROOT = Path(__file__).resolve().parents[2]
RULES = sorted((ROOT / "deploy/prometheus/rules").glob("*.yml"))
JOB = ROOT / "tests" / "integration" / "fault_job.py"
# fault -> the alert that documents it (docs/alerts.md), as tests/integration/test_alerting.py pages it.
FAULTS = {
    "nan": "MindSporeTrainingLossNonFinite",
    "stall": "MindSporeTrainingHang",
    "kill": "MindSporeTrainingRankDown",
}
HEALTHY_STEPS = 30  # fault_job.py's healthy start


@dataclass
class Paths:
    vm: VictoriaMetrics
    prometheus: PrometheusStack
    vm_webhook: Webhook
    prometheus_webhook: Webhook
    pages: dict[str, tuple[dict[str, Any], dict[str, Any]]]  # fault -> (through Prometheus, through vmalert)


def _start_job(project: str, fault: str, targets: Path) -> subprocess.Popen[str]:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "GLOG_v": "3", "MS_EXPORTER_FILE_SD_DIR": str(targets)}
    command = [sys.executable, str(JOB), "--port", str(free_port()), "--project", project, "--fault", fault]
    return subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, text=True, env=env)


def _firing(webhook: Webhook, project: str, alert: str) -> dict[str, Any] | None:
    """The first firing `alert` for `project` delivered to `webhook`, with the receiver path it came through."""
    for notification in list(webhook.notifications):
        for firing in notification["alerts"]:
            labels = firing["labels"]
            if firing["status"] == "firing" and labels["alertname"] == alert and labels.get("project") == project:
                return {**firing, "path": notification["path"]}
    return None


def _what_each_path_saw(project: str, alert: str, prometheus: PrometheusStack, vm: VictoriaMetrics) -> str:
    """For a page that did not come: what each store holds of the project's targets and alerts, and vmalert's state
    of `alert`."""
    lines = []
    for expr in (
        'up{job=~".*mindspore.*"}',
        f'ALERTS{{project="{project}"}}',
        f'mindspore_train_phase{{project="{project}"}} == 1',
    ):
        for name, ask in (
            ("prometheus", lambda e: query(prometheus.prometheus_port, e)),
            ("victoriametrics", vm.query),
        ):
            try:
                found = [(row["metric"], row["value"][1]) for row in ask(expr)]
            except OSError as exc:
                found = [({"error": str(exc)}, "")]
            lines.append(f"{name}: {expr} -> {found}")
    try:
        lines += [f"vmalert: {rule}" for rule in vm.rules() if rule["name"] == alert]
    except OSError as exc:
        lines.append(f"vmalert: {exc}")
    return "\n".join(lines)


@pytest.fixture(scope="module")
def paths() -> Iterator[Paths]:
    with tempfile.TemporaryDirectory(prefix="ms-vm-") as directory:
        scratch = Path(directory)
        prometheus_webhook, vm_webhook = Webhook(), Webhook()
        (scratch / "prometheus").mkdir()
        prometheus = PrometheusStack(scratch / "prometheus", prometheus_webhook, group_wait="1s")
        alertmanager = Servers(scratch)
        alertmanager_port = free_port()
        (scratch / "alertmanager.yml").write_text(yaml.safe_dump(routing_to(vm_webhook, group_wait="1s")))
        vm = VictoriaMetrics(scratch)
        jobs: dict[str, subprocess.Popen[str]] = {}
        try:
            prometheus.start()
            alertmanager.alertmanager(alertmanager_port, scratch / "alertmanager.yml")
            vm.store()
            # The shipped 5 s, as Prometheus scrapes here: a shorter interval is also the scrape's timeout, and on a
            # loaded machine a live rank then reads as down through one path only.
            vm.vmagent(prometheus.targets)
            vm.vmalert(f"http://127.0.0.1:{alertmanager_port}")
            for fault in FAULTS:
                jobs[fault] = _start_job(f"vm-{fault}", fault, prometheus.targets)
            # SIGKILL once both stores hold its steps: RankDown is for a rank that was reporting.
            seen = f'mindspore_train_global_step{{project="vm-kill"}} > {HEALTHY_STEPS}'
            wait_until(lambda: vm.query(seen) and query(prometheus.prometheus_port, seen), 150, "vm-kill's steps")
            jobs["kill"].kill()
            # All three pages within 300 s of here, through both paths: scrape (5 s), evaluation (10 s), `for` and
            # group_wait, the stall's learned hang deadline, and room for a loaded machine (a healthy run pages in
            # about 40 s).
            deadline = time.monotonic() + 300
            pages = {}
            for fault, alert in FAULTS.items():
                project = f"vm-{fault}"
                try:
                    pages[fault] = wait_until(
                        lambda p=project, a=alert: (
                            ((one := _firing(prometheus_webhook, p, a)) and (other := _firing(vm_webhook, p, a)))
                            and (one, other)
                        ),
                        max(deadline - time.monotonic(), 1),
                        f"{alert} for {project} through both paths",
                        every=0.5,
                    )
                except AssertionError as missed:
                    raise AssertionError(f"{missed}\n{_what_each_path_saw(project, alert, prometheus, vm)}") from None
            yield Paths(vm, prometheus, vm_webhook, prometheus_webhook, pages)
        finally:
            for job in jobs.values():
                job.kill()
                job.wait(30)
            vm.stop()
            alertmanager.stop()
            prometheus.stop()
            prometheus_webhook.close()
            vm_webhook.close()


def test_vmalert_loads_every_rule_of_the_shipped_rules_file_and_evaluates_each_without_error(paths: Paths) -> None:
    shipped = [
        rule for path in RULES for group in yaml.safe_load(path.read_text())["groups"] for rule in group["rules"]
    ]
    loaded = paths.vm.rules()
    assert len(loaded) == len(shipped) > 40, (len(loaded), len(shipped))
    assert sorted(rule["name"] for rule in loaded) == sorted(rule.get("alert", rule.get("record")) for rule in shipped)
    # By the time three faults have paged, every group has been evaluated several times.
    assert [(rule["name"], rule["lastError"]) for rule in loaded if rule.get("lastError")] == []


@pytest.mark.parametrize("fault", list(FAULTS))
def test_a_fault_pages_through_vmalert_with_the_alert_and_rank_it_pages_through_prometheus(
    paths: Paths, fault: str
) -> None:
    through_prometheus, through_vm = paths.pages[fault]
    for firing in (through_prometheus, through_vm):
        assert firing["labels"]["alertname"] == FAULTS[fault] and firing["labels"]["rank"] == "0", firing["labels"]
    for label in ("alertname", "project", "rank", "severity"):
        assert through_vm["labels"][label] == through_prometheus["labels"][label], label
    assert through_vm["path"] == through_prometheus["path"] == "/pager"
    assert through_vm["annotations"]["summary"] == through_prometheus["annotations"]["summary"]


def test_the_prometheus_agent_config_is_valid_in_agent_mode() -> None:
    checked = subprocess.run(
        ["promtool", "check", "config", "--agent", "deploy/prometheus/prometheus-agent.yml"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert checked.returncode == 0, checked.stdout + checked.stderr
