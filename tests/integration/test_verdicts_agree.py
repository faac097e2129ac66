"""`ms-exporter top`'s Python verdicts and the shipped rules' PromQL give the same answer on the same series.

The straggler and memory-growth verdicts are records (ms_exporter/core/verdicts.py) that top evaluates in Python and
the rules render as PromQL (ms_exporter/generate/alerts/verdicts.py). Each case here feeds both
the same per-rank rates: top through two scrapes of a /metrics page a minute apart, the rules through
`promtool test rules` with the alerts top's verdicts expect.
"""

from __future__ import annotations

import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml

from ms_exporter.core import catalogue as c
from ms_exporter.core.thresholds import DEFAULTS
from ms_exporter.generate.rules import render_rules, render_yaml
from ms_exporter.tools.rank_samples import parse_ranks
from ms_exporter.tools.top.rows import build_row, mark_slowest

pytestmark = pytest.mark.skipif(shutil.which("promtool") is None, reason="promtool is not installed")

_STRAGGLER = "MindSporeTrainingStraggler"
_MEMORY = "MindSporeTrainingMemoryGrowth"
_KIND = "device_allocated"
_PROJECT = "demo"


@dataclass(frozen=True)
class Rank:
    """One rank's rates: steps a second, seconds of step and of data wait per step, and its memory growth."""

    step: float
    wait: float
    growth_ratio: float = 0.0
    growth_rate: float = 0.0  # bytes a second
    steps_per_second: float = 5.0


# Rates near the thresholds on both sides (factor 1.5, wait share 0.2, growth 0.3 and 2**20 / 60 bytes/s).
CASES = {
    "synchronous ranks, one slow loader, one long but small wait": [
        Rank(0.21, 0.001, 0.5, 50_000.0),  # memory growing fast
        Rank(0.21, 0.001, 0.5, 0.0),  # grown, now flat
        Rank(0.21, 0.001, 0.2, 50_000.0),  # growing, not yet grown enough
        Rank(0.21, 0.001, 0.31, DEFAULTS.memory_growth_rate + 0.01),  # just past both
        Rank(0.06, 0.15, 0.5, DEFAULTS.memory_growth_rate - 0.01),  # the straggler; growth just too slow
        Rank(0.18, 0.03),  # a wait over 1.5 x the median, but under 0.2 of its cycle
    ],
    "ranks at their own pace, one slow": [
        Rank(0.1, 0.001, steps_per_second=1.0),
        Rank(0.1, 0.001, steps_per_second=1.0),
        Rank(0.14, 0.001, steps_per_second=1.0),  # under 1.5 x the median cycle
        Rank(0.3, 0.001, steps_per_second=1.0),
    ],
}


def _page(ranks: list[Rank], seconds: float) -> str:
    """A /metrics page of the ranks' series `seconds` into the run."""
    lines = []
    for index, rank in enumerate(ranks):
        labels = f'project="{_PROJECT}",rank="{index}"'
        steps = rank.steps_per_second * seconds
        lines += [
            f"{c.STEP_DURATION.sum}{{{labels}}} {rank.step * steps!r}",
            f"{c.STEP_DURATION.count}{{{labels}}} {steps!r}",
            f"{c.DATA_WAIT.sum}{{{labels}}} {rank.wait * steps!r}",
            f'{c.MEMORY_GROWTH_RATIO.name}{{{labels},kind="{_KIND}"}} {rank.growth_ratio!r}',
            f'{c.MEMORY_GROWTH_RATE.name}{{{labels},kind="{_KIND}"}} {rank.growth_rate!r}',
        ]
    return "\n".join(lines) + "\n"


def _top_verdicts(ranks: list[Rank]) -> dict[str, set[str]]:
    """The ranks top marks as stragglers and as growing memory, after two polls a minute apart."""
    rows, histories = {}, {}
    for now in (600.0, 660.0):
        for (project, rank), samples in parse_ranks(_page(ranks, now)).items():
            rows[rank], histories[rank] = build_row("target", project, rank, samples, histories.get(rank), now)
    marked = mark_slowest([rows[str(index)] for index in range(len(ranks))])
    return {
        _STRAGGLER: {row.rank for row in marked if "straggler" in row.alerts},
        _MEMORY: {row.rank for row in marked if any(alert.startswith("memory +") for alert in row.alerts)},
    }


def _promtool_case(ranks: list[Rank], verdicts: dict[str, set[str]]) -> dict:
    series = []
    for index, rank in enumerate(ranks):
        labels = f'job="mindspore", instance="localhost:{19420 + index}", project="{_PROJECT}", rank="{index}"'
        per_minute = rank.steps_per_second * 60
        series += [
            {"series": f"{c.STEP_DURATION.sum}{{{labels}}}", "values": f"0+{rank.step * per_minute!r}x30"},
            {"series": f"{c.STEP_DURATION.count}{{{labels}}}", "values": f"0+{per_minute!r}x30"},
            {"series": f"{c.DATA_WAIT.sum}{{{labels}}}", "values": f"0+{rank.wait * per_minute!r}x30"},
            {
                "series": f'{c.MEMORY_GROWTH_RATIO.name}{{{labels}, kind="{_KIND}"}}',
                "values": f"{rank.growth_ratio!r}x30",
            },
            {
                "series": f'{c.MEMORY_GROWTH_RATE.name}{{{labels}, kind="{_KIND}"}}',
                "values": f"{rank.growth_rate!r}x30",
            },
        ]

    def expected(alert: str, rank: str) -> dict:
        labels = {
            "job": "mindspore",
            "instance": f"localhost:{19420 + int(rank)}",
            "project": _PROJECT,
            "rank": rank,
            "severity": "warning",
        }
        return {"exp_labels": {**labels, "kind": _KIND} if alert == _MEMORY else labels}

    return {
        "interval": "1m",
        "input_series": series,
        "alert_rule_test": [
            {
                "eval_time": "20m",
                "alertname": alert,
                "exp_alerts": [expected(alert, rank) for rank in sorted(ranks_named)],
            }
            for alert, ranks_named in verdicts.items()
        ],
    }


def _rules_without_annotations() -> dict:
    """The shipped rules with their annotations left out: promtool then compares the labels of who fires, and the
    PromQL is the one `ms-exporter rules` renders."""
    rules = render_rules()
    for group in rules["groups"]:
        for rule in group["rules"]:
            rule.pop("annotations", None)
    return rules


@pytest.mark.parametrize("name", sorted(CASES))
def test_top_and_the_rules_name_the_same_stragglers_and_growing_memory(name: str, tmp_path: Path) -> None:
    ranks = CASES[name]
    verdicts = _top_verdicts(ranks)
    assert verdicts[_STRAGGLER] and len(verdicts[_STRAGGLER]) < len(ranks)  # both answers are in the case
    (tmp_path / "rules.yml").write_text(render_yaml(_rules_without_annotations()))
    cases = {
        "rule_files": ["rules.yml"],
        "evaluation_interval": "10s",
        "tests": [{"name": name, **_promtool_case(ranks, verdicts)}],
    }
    (tmp_path / "agree.test.yml").write_text(yaml.safe_dump(cases, sort_keys=False))
    tested = subprocess.run(
        ["promtool", "test", "rules", "agree.test.yml"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert tested.returncode == 0, f"top said {verdicts}; promtool:\n{tested.stdout}{tested.stderr}"


def test_the_cases_put_each_verdict_on_both_sides() -> None:
    verdicts = _top_verdicts(CASES["synchronous ranks, one slow loader, one long but small wait"])
    assert verdicts == {_STRAGGLER: {"4"}, _MEMORY: {"0", "3"}}
    assert _top_verdicts(CASES["ranks at their own pace, one slow"])[_STRAGGLER] == {"3"}
