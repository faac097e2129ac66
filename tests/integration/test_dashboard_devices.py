"""The dashboard's Devices row, its queries run by Prometheus' own engine (promtool) over series shaped like the
recordings and like a rank's own: a device the recordings name shows once, with the recorded value; the host, which
the recordings leave out, shows from the rank's own series; a rank whose Prometheus runs no rules still shows its
devices. A CPU-only training (no sensor, no power, no throttling) cannot fill every panel of this row:
test_alerting.py's healthy run checks the utilisation panel there, this file the rest."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
import yaml

from ms_exporter.core import catalogue as c
from ms_exporter.core.thresholds import DEFAULTS
from ms_exporter.generate.dashboard import queries, render_dashboard

pytestmark = pytest.mark.integration

DEVICE_PANELS = ("Device temperature", "Device power", "Device utilisation", "Device throttled")


def _series(name: str, labels: dict[str, str], value: float) -> dict[str, str]:
    inside = ", ".join(f'{key}="{text}"' for key, text in labels.items())
    return {"series": f"{name}{{{inside}}}", "values": f"{value}x10"}


def _rank(rank: str, device: str, **scrape: str) -> dict[str, str]:
    return {"project": "p", "rank": rank, "device": device, **scrape}


# Rank 0: a GPU the recording names (its own reader's 71, and dcgm-exporter's 74 taken as the recording's max) and
# its host, which the recordings leave out. Rank 1: a Prometheus without the rules, its own series only.
_SCRAPE = {"job": "ms", "instance": "node:19420"}
INPUT = [
    _series(c.RANK_DEVICE_TEMPERATURE, _rank("0", "gpu0"), 74),
    _series(c.DEVICE_TEMPERATURE.name, _rank("0", "gpu0", **_SCRAPE), 71),
    _series(c.DEVICE_TEMPERATURE.name, _rank("0", "host", **_SCRAPE), 48),
    _series(c.DEVICE_TEMPERATURE.name, _rank("1", "npu1", job="ms", instance="node:19421"), 90),
    _series(c.RANK_DEVICE_POWER, _rank("0", "gpu0"), 300),
    _series(c.DEVICE_POWER.name, _rank("0", "gpu0", **_SCRAPE), 290),
    _series(c.DEVICE_POWER.name, _rank("1", "npu1", job="ms", instance="node:19421"), 250),
    _series(c.RANK_DEVICE_UTILIZATION, _rank("0", "gpu0"), 0.9),
    _series(c.DEVICE_UTILIZATION.name, _rank("0", "gpu0", **_SCRAPE), 0.9),
    _series(c.DEVICE_UTILIZATION.name, _rank("0", "host", **_SCRAPE), 0.25),
    _series(c.DEVICE_UTILIZATION.name, _rank("1", "host", job="ms", instance="node:19421"), 0.5),
    _series(c.RANK_DEVICE_THROTTLED, _rank("0", "gpu0"), 1),
    # A throttle reason the recording does not count (an idle GPU): not on the panel.
    _series(c.DEVICE_THROTTLED.name, {**_rank("0", "gpu0", **_SCRAPE), "reason": "gpu_idle"}, 1),
]


def _sample(name: str | None, rank: str, device: str, value: float) -> dict[str, object]:
    labels = f'project="p", rank="{rank}", device="{device}"'
    return {"labels": f"{name}{{{labels}}}" if name else f"{{{labels}}}", "value": value}


EXPECTED = {
    "Device temperature": [
        _sample(c.RANK_DEVICE_TEMPERATURE, "0", "gpu0", 74),
        _sample(None, "0", "host", 48),
        _sample(None, "1", "npu1", 90),
    ],
    "Device power": [_sample(c.RANK_DEVICE_POWER, "0", "gpu0", 300), _sample(None, "1", "npu1", 250)],
    "Device utilisation": [
        _sample(c.RANK_DEVICE_UTILIZATION, "0", "gpu0", 0.9),
        _sample(None, "0", "host", 0.25),
        _sample(None, "1", "host", 0.5),
    ],
    "Device throttled": [_sample(c.RANK_DEVICE_THROTTLED, "0", "gpu0", 1)],
}


def _device_queries() -> list[tuple[str, str]]:
    return [(title, expr) for title, expr in queries(render_dashboard()) if title in DEVICE_PANELS]


def test_the_devices_row_sits_after_throughput_and_draws_the_device_hot_line() -> None:
    panels = render_dashboard()["panels"]
    rows = [panel["title"] for panel in panels if panel["type"] == "row"]
    assert rows[rows.index("Throughput") + 1] == "Devices"
    temperature = next(panel for panel in panels if panel["title"] == "Device temperature")
    steps = temperature["fieldConfig"]["defaults"]["thresholds"]["steps"]
    assert [step["value"] for step in steps] == [None, DEFAULTS.device_hot_celsius]
    assert sorted(title for title, _ in _device_queries()) == sorted(DEVICE_PANELS)


def test_every_devices_query_shows_each_device_once_host_included(tmp_path: Path) -> None:
    (tmp_path / "none.rules.yml").write_text("groups: []\n")
    cases = [
        {
            "expr": expr.replace("$project", "p").replace("$rank", ".*"),
            "eval_time": "5m",
            "exp_samples": EXPECTED[title],
        }
        for title, expr in _device_queries()
    ]
    tests = {
        "rule_files": ["none.rules.yml"],
        "evaluation_interval": "1m",
        "tests": [{"interval": "1m", "input_series": INPUT, "promql_expr_test": cases}],
    }
    (tmp_path / "devices.test.yml").write_text(yaml.safe_dump(tests, sort_keys=False))
    tested = subprocess.run(
        ["promtool", "test", "rules", "devices.test.yml"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert tested.returncode == 0, tested.stdout + tested.stderr
