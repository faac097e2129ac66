"""The deploy/ files: generated ones match their generators, and Prometheus' and Alertmanager's own tools pass."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import yaml

from ms_exporter.config import load_config
from ms_exporter.config.alert_thresholds import thresholds_of
from ms_exporter.core.thresholds import DEFAULTS
from ms_exporter.generate.dashboard import DASHBOARD_FILE, queries, render_dashboard, render_json
from ms_exporter.generate.rules import RULES_FILE, render_rules, render_yaml

ROOT = Path(__file__).resolve().parents[2]
PINNED_ALERTS = {
    "MindSporeTrainingLossNonFinite": "critical",
    "MindSporeTrainingLossHigh": "warning",
    "MindSporeTrainingLossRising": "warning",
    "MindSporeTrainingGradNormHigh": "warning",
    "MindSporeTrainingGradNormExploding": "critical",
    "MindSporeTrainingLayerFrozen": "warning",
    "MindSporeTrainingThroughputLow": "warning",
    "MindSporeTrainingThroughputDrop": "warning",
    "MindSporeTrainingStalled": "critical",
    "MindSporeTrainingHang": "critical",
    "MindSporeTrainingMemoryGrowth": "warning",
    "MindSporeTrainingLearningRateFlat": "warning",
    "MindSporeTrainingLossScaleCollapse": "warning",
    "MindSporeTrainingLayerNormDrift": "warning",
    "MindSporeTrainingDataQualityDrop": "warning",
    "MindSporeTrainingRankDown": "critical",
    "MindSporeTrainingRankMissing": "critical",
    "MindSporeTrainingRanksNotReporting": "warning",
    "MindSporeTrainingStraggler": "warning",
    "MindSporeTrainingFailSlow": "warning",
    "MindSporeTrainingDeviceHot": "warning",
    "MindSporeTrainingDeviceThrottling": "warning",
    "MindSporeTrainingDeviceEccErrors": "critical",
    "MindSporeTrainingDeviceLinkDown": "critical",
    "MindSporeTrainingGoodputLow": "warning",
    "MindSporeTrainingReplicaDivergence": "critical",
    "MindSporeTrainingSilentDataCorruption": "critical",
    "MindSporeTrainingRolledBack": "warning",
    "MindSporeTrainingRollbackLoop": "critical",
    "MindSporeExporterErrors": "warning",
}
# Rendered only when the user sets their threshold: (severity, monitor_config that switches it on, promtool cases).
OPTIONAL_ALERTS = {
    "MindSporeTrainingMfuLow": (
        "warning",
        {"flops": {"alert_below": 0.3, "peak_flops_per_device": 1e12}},
        "mfu_low.test.yml",
    )
}


def run(*command: str, cwd: Path = ROOT, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run(list(command), cwd=cwd, capture_output=True, text=True, check=False, timeout=timeout)


def committed_alerts() -> dict[str, dict]:
    rules = yaml.safe_load((ROOT / RULES_FILE).read_text())
    return {r["alert"]: r for group in rules["groups"] for r in group["rules"] if "alert" in r}


def test_committed_rules_are_what_the_defaults_render() -> None:
    assert (ROOT / RULES_FILE).read_text() == render_yaml(render_rules()), "run: ms-exporter rules -o " + RULES_FILE


def test_committed_dashboard_is_what_the_generator_renders() -> None:
    assert (ROOT / DASHBOARD_FILE).read_text() == render_json(render_dashboard()), (
        "run: ms-exporter dashboard -o " + DASHBOARD_FILE
    )


def test_every_pinned_alert_with_severity_annotations_and_runbook_section() -> None:
    alerts = committed_alerts()
    assert {name: rule["labels"]["severity"] for name, rule in alerts.items()} == PINNED_ALERTS
    runbook = (ROOT / "docs/alerts.md").read_text()
    for name, rule in alerts.items():
        assert set(rule["annotations"]) == {"summary", "description", "runbook_url"}
        assert rule["annotations"]["runbook_url"] == f"docs/alerts.md#{name.lower()}"
        assert f"\n## {name}\n" in runbook, f"docs/alerts.md has no section for {name}"
        assert rule["for"], f"{name} has no for:"


PROMTOOL_TESTS = sorted((ROOT / "deploy/prometheus/tests").glob("*.test.yml"))


def test_every_alert_has_a_firing_and_a_quiet_promtool_case() -> None:
    assert [path.name for path in PROMTOOL_TESTS] == [
        "alerts.test.yml",
        "data-quality.test.yml",
        "devices.test.yml",
        "goodput.test.yml",
        "throughput-drop.test.yml",
    ]
    tests = [case for path in PROMTOOL_TESTS for case in yaml.safe_load(path.read_text())["tests"]]
    firing, quiet = set(), set()
    for case in tests:
        for check in case.get("alert_rule_test", []):
            (firing if check["exp_alerts"] else quiet).add(check["alertname"])
            for expected in check["exp_alerts"]:
                assert set(expected["exp_annotations"]) == {"summary", "description", "runbook_url"}
    assert firing == set(PINNED_ALERTS) and quiet == set(PINNED_ALERTS)


def test_promtool_and_amtool_accept_the_files() -> None:
    checked = run("promtool", "check", "rules", RULES_FILE)
    assert checked.returncode == 0, checked.stdout + checked.stderr
    # One promtool a file, side by side: the hour-long files take most of the time. Pure CPU: alerts.test.yml alone
    # took over 120 s beside another test on CI's 2 cores (46 s on an idle machine); the limit only ends a hang.
    with ThreadPoolExecutor(len(PROMTOOL_TESTS)) as pool:
        for tested in pool.map(
            lambda path: run(
                "promtool", "test", "rules", f"tests/{path.name}", cwd=ROOT / "deploy/prometheus", timeout=600
            ),
            PROMTOOL_TESTS,
        ):
            assert tested.returncode == 0, tested.stdout + tested.stderr
    config = run("promtool", "check", "config", "deploy/prometheus/prometheus.yml")
    assert config.returncode == 0, config.stdout + config.stderr
    routing = run("amtool", "check-config", "deploy/alertmanager/alertmanager.yml")
    assert routing.returncode == 0, routing.stdout + routing.stderr


def test_rules_follow_the_users_thresholds(tmp_path: Path) -> None:
    config = tmp_path / "monitor.yaml"
    config.write_text(
        "monitor_config:\n  warn_on_value: {loss: 20, tokens_per_second: 500}\n"
        "  grad_norm: {threshold: 4}\n  layernorm: {drift_threshold: 0.1}\n"
        "  goodput: {alert_below: 0.3}\n  failslow: {alert_below: 0.9}\n"
    )
    out = run(sys.executable, "-m", "ms_exporter", "rules", "--config", str(config))
    assert out.returncode == 0, out.stderr
    alerts = {r["alert"]: r for g in yaml.safe_load(out.stdout)["groups"] for r in g["rules"] if "alert" in r}
    assert alerts["MindSporeTrainingLossHigh"]["expr"] == 'mindspore_train_loss{instance!=""} > 20'
    assert alerts["MindSporeTrainingThroughputLow"]["expr"] == 'mindspore_train_tokens_per_second{instance!=""} < 500'
    assert alerts["MindSporeTrainingGradNormHigh"]["expr"] == 'mindspore_train_grad_norm{instance!=""} > 4'
    assert alerts["MindSporeTrainingGradNormExploding"]["expr"] == 'mindspore_train_grad_norm{instance!=""} > 40'
    assert alerts["MindSporeTrainingLayerNormDrift"]["expr"] == (
        'abs(mindspore_train_layernorm_scale_drift_ratio{instance!=""}) > 0.1'
    )
    assert alerts["MindSporeTrainingGoodputLow"]["expr"].startswith("(project:mindspore_train_goodput:ratio1h < 0.3)")
    assert alerts["MindSporeTrainingFailSlow"]["expr"].startswith("rank:mindspore_train_slowness_relative:score < 0.9 ")
    dashboard = run(sys.executable, "-m", "ms_exporter", "dashboard", "--config", str(config))
    assert dashboard.returncode == 0, dashboard.stderr
    lines = {
        panel["title"]: [step["value"] for step in panel["fieldConfig"]["defaults"]["thresholds"]["steps"]]
        for panel in json.loads(dashboard.stdout)["panels"]
        if "thresholds" in panel.get("fieldConfig", {}).get("defaults", {})
    }
    assert lines == {
        "Loss per rank": [None, 20],
        "Smoothed loss": [None, 20],
        "Tokens per second": [None, 500],
        "Global gradient norm": [None, 4],
        "LayerNorm scale drift": [None, 0.1],
        "Growth over baseline": [None, DEFAULTS.memory_growth_ratio],
        "Goodput": [None, 0.3],
        "Replicas holding the same weights": [None, 1.0],
        "Slowness scores": [None, 0.9],
        "Device temperature": [None, DEFAULTS.device_hot_celsius],
    }
    test_timing = run(sys.executable, "-m", "ms_exporter", "rules", "--timing", "test")
    fast = {r["alert"]: r for g in yaml.safe_load(test_timing.stdout)["groups"] for r in g["rules"] if "alert" in r}
    assert fast["MindSporeTrainingLossHigh"]["for"] == "2s"


def test_dashboard_has_variables_units_and_rate_intervals() -> None:
    dashboard = json.loads((ROOT / DASHBOARD_FILE).read_text())
    assert dashboard["uid"] == "ms-exporter-training"
    variables = {v["name"]: v for v in dashboard["templating"]["list"]}
    assert variables["datasource"]["type"] == "datasource"
    assert variables["rank"]["multi"] is True and "project" in variables
    titles = {p["title"] for p in dashboard["panels"] if p["type"] == "row"}
    assert titles == {
        "Overview",
        "Loss",
        "Learning rate",
        "Actions",
        "Throughput",
        "Devices",
        "Gradients",
        "Hangs",
        "Goodput",
        "Memory",
        "Ranks",
    }
    for panel in dashboard["panels"]:
        if panel["type"] != "row":
            assert panel["fieldConfig"]["defaults"]["unit"], f"{panel['title']} has no unit"
            assert panel["datasource"]["uid"] == "${datasource}"
    for title, expr in queries(dashboard):
        # Every range in a query follows Grafana's rate interval, never a hard-coded window.
        assert all(window == "$__rate_interval" for window in re.findall(r"\[([^\]]+)\]", expr)), title


@pytest.mark.parametrize("path", sorted(str(p.relative_to(ROOT)) for p in (ROOT / "deploy").rglob("*.y*ml")))
def test_every_deploy_yaml_parses(path: str) -> None:
    assert yaml.safe_load((ROOT / path).read_text()) is not None


@pytest.mark.parametrize(
    ("severity", "receiver"), [("critical", "pager"), ("warning", "ticket-queue"), ("info", "silent")]
)
def test_alertmanager_routes_by_severity(severity: str, receiver: str) -> None:
    routed = run(
        "amtool",
        "config",
        "routes",
        "test",
        "--config.file=deploy/alertmanager/alertmanager.yml",
        f"severity={severity}",
        "project=demo",
        "alertname=MindSporeTrainingLossHigh",
    )
    assert routed.returncode == 0, routed.stderr
    assert routed.stdout.strip() == receiver


def test_alertmanager_mutes_warnings_of_a_rank_with_a_critical_alert() -> None:
    routing = yaml.safe_load((ROOT / "deploy/alertmanager/alertmanager.yml").read_text())
    assert routing["inhibit_rules"] == [
        {
            "source_matchers": ['severity="critical"'],
            "target_matchers": ['severity="warning"'],
            "equal": ["project", "rank"],
        },
        {
            "source_matchers": ['alertname="MindSporeTrainingHang"'],
            "target_matchers": ['alertname="MindSporeTrainingStalled"'],
            "equal": ["project"],
        },
        {
            "source_matchers": ['alertname="MindSporeTrainingSilentDataCorruption"'],
            "target_matchers": ['alertname="MindSporeTrainingReplicaDivergence"'],
            "equal": ["project", "rank"],
        },
    ]
    assert routing["route"]["group_by"] == ["project", "alertname"]


@pytest.mark.parametrize("config", ["prometheus-static.yml", "prometheus-job.yml"])
def test_the_other_prometheus_configs_are_valid(config: str) -> None:
    checked = run("promtool", "check", "config", f"deploy/prometheus/{config}")
    assert checked.returncode == 0, checked.stdout + checked.stderr


@pytest.mark.parametrize("name", sorted(OPTIONAL_ALERTS))
def test_an_optional_alert_appears_with_its_setting_and_its_promtool_cases_pass(name: str, tmp_path: Path) -> None:
    severity, settings, cases_file = OPTIONAL_ALERTS[name]
    assert name not in committed_alerts()  # off by default
    rules = render_rules(thresholds_of(load_config(settings)))
    alerts = {r["alert"]: r for group in rules["groups"] for r in group["rules"] if "alert" in r}
    assert alerts[name]["labels"]["severity"] == severity
    assert f"\n## {name}\n" in (ROOT / "docs/alerts.md").read_text(), f"docs/alerts.md has no section for {name}"
    cases = ROOT / "tests/integration/data" / cases_file
    tests = yaml.safe_load(cases.read_text())
    (tmp_path / tests["rule_files"][0]).write_text(render_yaml(rules))
    (tmp_path / cases.name).write_text(cases.read_text())
    checks = [check for case in tests["tests"] for check in case["alert_rule_test"] if check["alertname"] == name]
    assert any(check["exp_alerts"] for check in checks) and any(not check["exp_alerts"] for check in checks)
    tested = run("promtool", "test", "rules", cases.name, cwd=tmp_path)
    assert tested.returncode == 0, tested.stdout + tested.stderr
