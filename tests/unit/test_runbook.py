"""Runbook links an on-call can open: absolute runbook_url annotations that land on the alert's section."""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

import pytest
import yaml

from ms_exporter import cli
from ms_exporter.config import ConfigError, load_config
from ms_exporter.core.thresholds import Thresholds
from ms_exporter.generate.rules import heading_anchor, render_rules
from tests.support.pythons import DASHBOARD_SDK, needs

ROOT = Path(__file__).resolve().parents[2]
BASE = "https://github.com/example/ms_exporter/blob/main/docs/alerts.md"


def alerts(rules: dict) -> dict[str, dict]:
    return {r["alert"]: r for group in rules["groups"] for r in group["rules"] if "alert" in r}


def test_heading_anchors_follow_the_repository_hosts_slugs() -> None:
    # As GitHub, GitLab and Gitea render them (the docs' own cross-links rely on the same).
    assert heading_anchor("MindSporeTrainingHang") == "mindsporetraininghang"
    assert heading_anchor("How fast an alert arrives") == "how-fast-an-alert-arrives"
    assert heading_anchor("Who may read the endpoint: `web`") == "who-may-read-the-endpoint-web"
    assert heading_anchor("FLOPs: model FLOPs utilisation") == "flops-model-flops-utilisation"
    assert "(configuration.md#flops-model-flops-utilisation)" in (ROOT / "docs/mfu.md").read_text()


def test_with_a_base_every_runbook_url_is_absolute_and_names_a_section_of_the_runbook() -> None:
    headings = {
        heading_anchor(line[3:])
        for line in (ROOT / "docs/alerts.md").read_text().splitlines()
        if line.startswith("## ")
    }
    found = alerts(render_rules(runbook_base=BASE))
    assert len(found) >= 19
    for name, rule in found.items():
        url = rule["annotations"]["runbook_url"]
        page, anchor = url.split("#")
        assert page == BASE and anchor in headings, (name, url)


def test_rules_take_the_url_from_the_flag_or_the_config(tmp_path: Path) -> None:
    config = tmp_path / "monitor.yaml"
    config.write_text(f"monitor_config:\n  runbook_url: {BASE}\n")
    assert cli.main(["rules", "--config", str(config), "-o", str(tmp_path / "rules.yml")]) == 0
    rendered = alerts(yaml.safe_load((tmp_path / "rules.yml").read_text()))
    urls = {rule["annotations"]["runbook_url"] for rule in rendered.values()}
    assert urls and all(url.startswith(BASE + "#") for url in urls)
    other = "https://runbooks.example.org/ms_exporter/alerts.md"
    assert cli.main(["rules", "--config", str(config), "--runbook-url", other, "-o", str(tmp_path / "r2.yml")]) == 0
    assert f"runbook_url: {other}#mindsporetraininghang" in (tmp_path / "r2.yml").read_text()
    assert cli.main(["rules", "-o", str(tmp_path / "default.yml")]) == 0  # no base: the repository-relative path
    assert "runbook_url: docs/alerts.md#mindsporetraininghang" in (tmp_path / "default.yml").read_text()


@needs(DASHBOARD_SDK)  # `kubernetes` writes the dashboard's ConfigMap too
def test_kubernetes_takes_the_url_from_the_config(tmp_path: Path) -> None:
    config = tmp_path / "monitor.yaml"
    config.write_text(f"monitor_config:\n  runbook_url: {BASE}\n")
    assert cli.main(["kubernetes", "--config", str(config), "-o", str(tmp_path / "k8s")]) == 0
    manifest = (tmp_path / "k8s" / "prometheusrule.yaml").read_text()
    assert re.findall(r"runbook_url: (\S+)#", manifest) and set(re.findall(r"runbook_url: (\S+)#", manifest)) == {BASE}


@pytest.mark.parametrize("command", ["rules", "kubernetes"])
def test_the_flag_has_one_name(command: str, capsys: pytest.CaptureFixture[str]) -> None:
    # --runbook-base was an alias of --runbook-url before 0.1.0 shipped: one flag, one spelling.
    with pytest.raises(SystemExit):
        cli.main([command, "--runbook-base", BASE])
    assert "unrecognized arguments: --runbook-base" in capsys.readouterr().err


@pytest.mark.parametrize("bad", ["docs/alerts.md", "ftp://host/alerts.md", BASE + "#top", "https://"])
def test_a_runbook_url_that_cannot_be_a_page_is_a_config_error(bad: str) -> None:
    with pytest.raises(ConfigError, match="runbook_url: must be the http"):
        load_config({"runbook_url": bad})


def test_every_alert_count_the_docs_state_is_the_rules_count() -> None:
    """A number of alerts written in a page drifts as alerts are added (the README once said 19, deploy/README 17,
    with 21 in the rules): any "<n> alerts" the pages state must be the rules' own count."""
    count = len(alerts(render_rules()))
    pages = [ROOT / "README.md", ROOT / "deploy/README.md", *sorted((ROOT / "docs").glob("*.md"))]
    measured = {"detection.md", "reliability.md", "benchmarks.md"}  # alerts delivered in a measured run
    for page in pages:
        if page.name in measured:
            continue
        for stated in re.findall(r"\b(\d+) (?:alerts|alerting rules)\b", page.read_text()):
            assert int(stated) == count, f"{page.relative_to(ROOT)} says {stated} alerts; the rules have {count}"


def test_every_alert_name_the_docs_state_is_an_alert_of_the_rules() -> None:
    """A renamed or removed alert must not live on in a page: every `MindSporeTraining*` / `MindSporeExporter*` name
    in README, deploy/ and docs/ is an alert the rules render (with every optional alert switched on)."""
    optional = dataclasses.replace(Thresholds(), mfu_low=0.3)  # MindSporeTrainingMfuLow: only with flops.alert_below
    names = set(alerts(render_rules(optional)))
    pages = [
        ROOT / "README.md",
        ROOT / "CHANGELOG.md",
        *sorted(ROOT.glob("deploy/**/*.md")),
        *sorted(ROOT.glob("docs/*.md")),
    ]
    for page in pages:
        for named in sorted(set(re.findall(r"\bMindSpore(?:Training|Exporter)[A-Za-z]+\b", page.read_text()))):
            assert named in names, f"{page.relative_to(ROOT)} names {named}, which is not an alert of the rules"
