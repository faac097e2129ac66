"""docs/detection.md (written by `make detection`) covers every failure of docs/alerts.md's table and meets it."""

from __future__ import annotations

import re
from pathlib import Path

from benchmarks.detection import FAILURES, HEALTHY, render
from ms_exporter.generate.rules import render_rules

ROOT = Path(__file__).resolve().parents[2]
DOC = (ROOT / "docs/detection.md").read_text(encoding="utf-8")


# Failures the committed run missed, each said in docs/detection.md's "Known misses" with what is known of it: a
# miss is a finding to fix, not to hide; listing one here keeps it visible while it is open, and the test fails
# once the doc shows it met (remove it from here then).
KNOWN_MISSES: set[str] = set()


def test_every_failure_has_a_row_that_met_its_target() -> None:
    rows = {match.group(1): match.group(0) for match in re.finditer(r"^\| (\w+) \|.*$", DOC, flags=re.MULTILINE)}
    for failure in FAILURES:
        assert failure.fault in rows, failure.fault
        cells = [cell.strip() for cell in rows[failure.fault].strip("|").split("|")]
        assert cells[2] == failure.alert and cells[3] == f"{failure.target:.0f} s"
        if failure.fault in KNOWN_MISSES:
            assert cells[5] == "no" and f"`{failure.fault}`" in DOC.split("## Known misses", 1)[-1], cells
            continue
        seconds = re.fullmatch(r"(\d+) s", cells[4])
        assert seconds is not None and int(seconds.group(1)) <= failure.target and cells[5] == "yes", cells


def test_the_remote_write_path_meets_every_target_prometheus_meets() -> None:
    """The VictoriaMetrics column (vmagent, VictoriaMetrics, vmalert from deploy/victoriametrics/): a NaN loss pages
    within 45 s, and no failure that Prometheus pages within its target misses it through the remote-write path."""
    rows = {match.group(1): match.group(0) for match in re.finditer(r"^\| (\w+) \|.*$", DOC, flags=re.MULTILINE)}
    for failure in FAILURES:
        cells = [cell.strip() for cell in rows[failure.fault].strip("|").split("|")]
        seconds = re.fullmatch(r"(\d+) s", cells[6])
        if failure.fault == "nan" or cells[5] == "yes":
            assert seconds is not None and int(seconds.group(1)) <= failure.target and cells[7] == "yes", cells
    assert DOC.count("**0 alerts delivered**") == 2, "docs/detection.md: the healthy run paged through one path"


def test_the_healthy_run_paged_nothing() -> None:
    assert "**0 alerts delivered**" in DOC, "docs/detection.md: the healthy run paged"


def test_every_failure_is_an_alert_the_rules_have() -> None:
    alerts = {rule["alert"] for group in render_rules()["groups"] for rule in group["rules"] if "alert" in rule}
    assert {failure.alert for failure in FAILURES} <= alerts
    assert HEALTHY not in {failure.fault for failure in FAILURES}


def test_render_says_when_a_target_was_missed_and_names_false_pages() -> None:
    result = {
        "fault": "nan",
        "alert": "MindSporeTrainingLossNonFinite",
        "target": 45,
        "what": "x",
        "latency": 80.0,
        "receiver": "/pager",
        "fault_injected": True,
        "others": ["MindSporeTrainingRankDown"],
        "met": False,
    }
    result["remote_write"] = {**result, "latency": 30.0, "met": True, "others": []}
    text = render(
        {
            "results": [result],
            "healthy": {
                "minutes": 10,
                "exit": 0,
                "pages": ["MindSporeTrainingStalled"],
                "watched_after_end": 120,
                "ended": 0,
            },
            "intervals": {"scrape_interval": "5s"},
            "group_wait": {'severity="critical"': "10s"},
            "seconds": 900,
            "versions": {"prometheus": "p", "alertmanager": "a"},
        }
    )
    row = (
        "| nan | x | MindSporeTrainingLossNonFinite | 45 s | 80 s | no | 30 s | yes | /pager | "
        "MindSporeTrainingRankDown (through VictoriaMetrics: -) |"
    )
    assert row in text
    assert (
        "0 of 1 within their target through Prometheus, 1 of 1 through VictoriaMetrics" in text
        and "**1 alerts delivered** (MindSporeTrainingStalled)" in text
    )
