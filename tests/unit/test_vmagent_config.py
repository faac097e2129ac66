"""The agent-side scrape configs (vmagent.yml, prometheus-agent.yml) scrape what prometheus.yml scrapes, and every
shipped VictoriaMetrics flag is explained in deploy/victoriametrics/README.md."""

from __future__ import annotations

import copy
import re
from pathlib import Path
from typing import Any

import yaml

from tests.support.victoriametrics import shipped_flags

ROOT = Path(__file__).resolve().parents[2]
PROMETHEUS = yaml.safe_load((ROOT / "deploy/prometheus/prometheus.yml").read_text(encoding="utf-8"))
VMAGENT = yaml.safe_load((ROOT / "deploy/victoriametrics/vmagent.yml").read_text(encoding="utf-8"))
AGENT = yaml.safe_load((ROOT / "deploy/prometheus/prometheus-agent.yml").read_text(encoding="utf-8"))
README = (ROOT / "deploy/victoriametrics/README.md").read_text(encoding="utf-8")
BINARIES = ("victoria-metrics", "vmagent", "vmalert")


def _without_refresh_interval(jobs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The jobs as vmagent takes them: file_sd has no per-job refresh_interval there (one global flag instead)."""
    jobs = copy.deepcopy(jobs)
    for job in jobs:
        for sd in job.get("file_sd_configs", []):
            sd.pop("refresh_interval", None)
    return jobs


def test_vmagent_scrapes_the_jobs_of_prometheus_yml_with_the_same_relabeling() -> None:
    assert VMAGENT["scrape_configs"] == _without_refresh_interval(PROMETHEUS["scrape_configs"])
    assert VMAGENT["global"]["scrape_interval"] == PROMETHEUS["global"]["scrape_interval"]


def test_vmagent_yml_has_only_what_vmagent_1_79_parses_strictly() -> None:
    # Found by running vmagent 1.79.5 -dryRun on prometheus.yml: these fields fail its strict parsing.
    assert set(VMAGENT) == {"global", "scrape_configs"}
    assert all(
        "refresh_interval" not in sd for job in VMAGENT["scrape_configs"] for sd in job.get("file_sd_configs", [])
    )


def test_the_prometheus_agent_scrapes_the_jobs_of_prometheus_yml_and_only_forwards() -> None:
    assert AGENT["scrape_configs"] == PROMETHEUS["scrape_configs"]
    assert AGENT["global"] == {"scrape_interval": PROMETHEUS["global"]["scrape_interval"]}
    # Agent mode refuses rule_files and alerting: the store's ruler evaluates the rules.
    assert set(AGENT) == {"global", "scrape_configs", "remote_write"}
    assert AGENT["remote_write"][0]["url"].endswith("/api/v1/write")


def test_every_shipped_flag_is_explained_in_the_readme_and_every_explained_flag_is_shipped() -> None:
    explained = set(re.findall(r"^\| `-([\w.]+)", README, flags=re.MULTILINE))
    shipped = {name for binary in BINARIES for name, _ in shipped_flags(binary)}
    assert shipped == explained, (shipped - explained, explained - shipped)


def test_vmalert_evaluates_the_shipped_rules_and_sends_recording_results_back_to_the_store() -> None:
    flags = dict(shipped_flags("vmalert"))
    assert flags["rule"] == "deploy/prometheus/rules/*.yml"
    assert sorted((ROOT / "deploy/prometheus/rules").glob("*.yml"))  # the pattern matches the shipped file
    store = dict(shipped_flags("victoria-metrics"))["httpListenAddr"].rsplit(":", 1)[1]
    for name in ("datasource.url", "remoteWrite.url", "remoteRead.url"):
        assert flags[name].endswith(f":{store}"), name
    rules = yaml.safe_load((ROOT / "deploy/prometheus/rules/mindspore-training.rules.yml").read_text(encoding="utf-8"))
    assert {group["interval"] for group in rules["groups"]} == {flags["evaluationInterval"]}
    agent = dict(shipped_flags("vmagent"))
    assert agent["remoteWrite.url"].split("/api/")[0].endswith(f":{store}")
    # A dead rank's target leaves discovery well before RankDown's `for` ends: one page, RankMissing, not two.
    rank_down = next(r for g in rules["groups"] for r in g["rules"] if r.get("alert") == "MindSporeTrainingRankDown")
    assert _seconds(agent["promscrape.fileSDCheckInterval"]) < _seconds(rank_down["for"]) / 2


def _seconds(duration: str) -> float:
    value, unit = re.fullmatch(r"(\d+)([smh])", duration).groups()  # type: ignore[union-attr]
    return float(value) * {"s": 1, "m": 60, "h": 3600}[unit]
