"""deploy/kubernetes: generated files are current, kustomize builds, every object passes its schema offline.

Core objects are checked by kubernetes-validate (the Kubernetes OpenAPI schemas, strict: unknown fields fail);
prometheus-operator objects by the models cloudcoil generates from the operator's CRDs, plus a round trip that
fails on fields the CRD does not know (the API server would prune them silently).
"""

from __future__ import annotations

import copy
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from ms_exporter.generate.dashboard import DASHBOARD_FILE, render_dashboard, render_json
from ms_exporter.generate.kubernetes import (
    DASHBOARD_CONFIGMAP_FILE,
    DASHBOARD_KEY,
    PROMETHEUS_RULE_FILE,
    render_dashboard_configmap,
    render_manifest,
    render_prometheus_rule,
)
from ms_exporter.generate.rules import RULES_FILE, render_rules
from tests.support.kubernetes_schema import schema_problems

ROOT = Path(__file__).resolve().parents[2]
KUBERNETES = ROOT / "deploy/kubernetes"
OVERLAYS = ("base", "servicemonitor", "podmonitor", "example")
RANK_PORTS = {f"metrics-rank{r}": 19420 + r for r in range(8)}


def manifest_files() -> list[Path]:
    return sorted(p for p in KUBERNETES.rglob("*.yaml") if p.name != "kustomization.yaml")


def load_objects(path: Path) -> list[dict[str, Any]]:
    return [doc for doc in yaml.safe_load_all(path.read_text()) if doc]


def kustomize(overlay: str) -> list[dict[str, Any]]:
    built = subprocess.run(
        ["kubectl", "kustomize", str(KUBERNETES / overlay)], capture_output=True, text=True, timeout=120, check=False
    )
    assert built.returncode == 0, built.stderr
    return [doc for doc in yaml.safe_load_all(built.stdout) if doc]


def test_generated_manifests_are_current() -> None:
    generator = "ms-exporter kubernetes"
    assert (ROOT / PROMETHEUS_RULE_FILE).read_text() == render_manifest(
        render_prometheus_rule(render_rules()), generator
    ), "run: ms-exporter kubernetes"
    assert (ROOT / DASHBOARD_CONFIGMAP_FILE).read_text() == render_manifest(
        render_dashboard_configmap(render_json(render_dashboard())), generator
    ), "run: ms-exporter kubernetes"


def test_prometheus_rule_and_configmap_carry_the_same_rules_and_dashboard() -> None:
    rule = load_objects(ROOT / PROMETHEUS_RULE_FILE)[0]
    assert rule["spec"]["groups"] == yaml.safe_load((ROOT / RULES_FILE).read_text())["groups"]
    configmap = load_objects(ROOT / DASHBOARD_CONFIGMAP_FILE)[0]
    assert configmap["metadata"]["labels"]["grafana_dashboard"] == "1"
    assert configmap["data"][DASHBOARD_KEY] == (ROOT / DASHBOARD_FILE).read_text()


@pytest.mark.parametrize("path", manifest_files(), ids=lambda p: str(p.relative_to(KUBERNETES)))
def test_every_manifest_passes_its_schema(path: Path) -> None:
    objects = load_objects(path)
    assert objects
    for obj in objects:
        assert schema_problems(obj) == [], f"{path.name}: {obj['kind']}"


@pytest.mark.skipif(shutil.which("kubectl") is None, reason="kubectl (with its built-in kustomize) is not installed")
@pytest.mark.parametrize("overlay", OVERLAYS)
def test_every_overlay_builds_and_what_it_builds_passes_its_schema(overlay: str) -> None:
    objects = kustomize(overlay)
    kinds = {obj["kind"] for obj in objects}
    assert {"Service", "PrometheusRule", "ConfigMap"} <= kinds
    assert ("ServiceMonitor" in kinds) == (overlay in ("servicemonitor", "example"))
    assert ("PodMonitor" in kinds) == (overlay == "podmonitor")
    for obj in objects:
        assert schema_problems(obj) == [], f"{overlay}: {obj['kind']}"


def test_ports_selectors_and_bind_address_line_up() -> None:
    service = load_objects(KUBERNETES / "base/service.yaml")[0]
    assert service["spec"]["clusterIP"] == "None"
    assert {p["name"]: p["port"] for p in service["spec"]["ports"]} == RANK_PORTS
    selector = service["spec"]["selector"]
    job = load_objects(KUBERNETES / "example/training-job.yaml")[0]
    pod = job["spec"]["template"]
    assert selector.items() <= pod["metadata"]["labels"].items()
    container = pod["spec"]["containers"][0]
    assert {"name": "MS_EXPORTER_BIND_ADDRESS", "value": "0.0.0.0"} in container["env"]
    assert RANK_PORTS.items() <= {p["name"]: p["containerPort"] for p in container["ports"]}.items()
    assert pod["spec"]["subdomain"] == service["metadata"]["name"]
    for path, key in (
        ("servicemonitor/servicemonitor.yaml", "endpoints"),
        ("podmonitor/podmonitor.yaml", "podMetricsEndpoints"),
    ):
        monitor = load_objects(KUBERNETES / path)[0]
        assert monitor["spec"]["selector"]["matchLabels"] == selector
        assert [e["port"] for e in monitor["spec"][key]] == list(RANK_PORTS)


def test_the_validators_reject_broken_objects() -> None:
    """The checks above can fail: a typo, a wrong type and a bad duration are each caught."""
    service = load_objects(KUBERNETES / "base/service.yaml")[0]
    typo = copy.deepcopy(service)
    typo["spec"]["ports"][0]["prot"] = 19420
    assert schema_problems(typo)
    monitor = load_objects(KUBERNETES / "servicemonitor/servicemonitor.yaml")[0]
    for mutate in (
        lambda m: m["spec"]["endpoints"][0].update(intervall="15s"),
        lambda m: m["spec"]["endpoints"][0].update(interval=15),
        lambda m: m["spec"]["endpoints"][0].update(interval="15 seconds"),
    ):
        broken = copy.deepcopy(monitor)
        mutate(broken)
        assert schema_problems(broken), broken["spec"]["endpoints"][0]
    rule = load_objects(ROOT / PROMETHEUS_RULE_FILE)[0]
    rule["spec"]["groups"][0]["rules"][0]["record"] = 7
    assert schema_problems(rule)
