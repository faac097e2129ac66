"""deploy/prometheus/prometheus-job.yml: prometheus.yml plus a remote_write that forwards to a shared store only the
rules' aggregates, ALERTS and rank 0's page (docs/scaling.md#past-one-prometheus)."""

from __future__ import annotations

import re
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[2]
PROMETHEUS = yaml.safe_load((ROOT / "deploy/prometheus/prometheus.yml").read_text(encoding="utf-8"))
JOB = yaml.safe_load((ROOT / "deploy/prometheus/prometheus-job.yml").read_text(encoding="utf-8"))
RULES = yaml.safe_load((ROOT / "deploy/prometheus/rules/mindspore-training.rules.yml").read_text(encoding="utf-8"))
RECORDED = [rule["record"] for group in RULES["groups"] for rule in group["rules"] if "record" in rule]


def _forwarded(name: str, rank: str | None) -> bool:
    """Prometheus' keep: the source labels' values joined by ';' (an absent label is ''), the regex anchored."""
    (keep,) = JOB["remote_write"][0]["write_relabel_configs"]
    assert keep["action"] == "keep" and keep["source_labels"] == ["__name__", "rank"]
    return re.fullmatch(keep["regex"], f"{name};{rank or ''}") is not None


def test_it_is_prometheus_yml_with_a_remote_write_added() -> None:
    assert {key: value for key, value in JOB.items() if key != "remote_write"} == PROMETHEUS
    (write,) = JOB["remote_write"]
    assert write["url"].endswith("/api/v1/write")


def test_the_aggregates_the_alerts_and_rank_0_are_forwarded() -> None:
    aggregates = [name for name in RECORDED if name.split(":", 1)[0] in ("project", "rank")]
    assert len(aggregates) >= 15
    for name in aggregates:
        assert _forwarded(name, None) and _forwarded(name, "7"), name
    assert _forwarded("ALERTS", "12") and _forwarded("ALERTS", None)
    assert _forwarded("mindspore_train_loss", "0") and _forwarded("mindspore_train_layer_grad_norm", "0")


def test_every_other_rank_s_own_series_stay_in_the_job_s_prometheus() -> None:
    for rank in ("1", "10", "9999", "00"):
        assert not _forwarded("mindspore_train_loss", rank)
        assert not _forwarded("mindspore_train_steps_total", rank)
    for name in ("up", "scrape_duration_seconds", "ALERTS_FOR_STATE"):
        assert not _forwarded(name, None)
    # Device recordings (7 per device) are left to the job's server unless an operator adds them.
    assert not _forwarded("rank_device:mindspore_train_device_temperature_celsius:max", "3")
