"""`ms-exporter report`'s device charts: the hardware monitor's temperature, power and utilisation per device, read
from the JSON Lines snapshots as the writer keys them, only where the run has them."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from ms_exporter.core import catalogue as c
from ms_exporter.core.thresholds import DEFAULTS
from ms_exporter.tools.report import DEVICE_CHARTED, load_run, render

TEMPERATURE, POWER, UTILIZATION = (
    c.jsonl_key(f.name) for f in (c.DEVICE_TEMPERATURE, c.DEVICE_POWER, c.DEVICE_UTILIZATION)
)


def line(record: dict[str, Any]) -> str:
    return json.dumps({"project": "dev", "rank": 0, **record}) + "\n"


def step(number: int) -> str:
    return line({"type": "step", "step": number, "loss": 0.5, "time": 1000.0 + number})


def snapshot(metrics: dict[str, Any]) -> str:
    return line({"type": "snapshot", "metrics": metrics})


def device(short: str, name: str) -> str:
    return c.jsonl_key(f"mindspore_train_{short}", (("device", name),))


def payload(page: str) -> list[dict[str, Any]]:
    found = re.search(r"const RUNS = (.*);\n", page)
    assert found is not None
    return json.loads(found.group(1))


def test_the_snapshots_device_readings_become_a_line_per_device(tmp_path: Path) -> None:
    assert DEVICE_CHARTED == (TEMPERATURE, POWER, UTILIZATION)
    path = tmp_path / "metrics-rank0.jsonl"
    path.write_text(
        snapshot({device(TEMPERATURE, "gpu0"): 60.0})  # before any step: no step to put it at
        + step(1)
        + snapshot(
            {
                device(TEMPERATURE, "gpu0"): 70.0,
                device(TEMPERATURE, "host"): 45.0,
                device(POWER, "gpu0"): 250.5,
                device(UTILIZATION, "gpu0"): 0.9,
                device(UTILIZATION, "host"): 0.3,
                device("device_clock_hertz", "gpu0"): 1.4e9,  # read, not charted
                'device_throttled{device="gpu0",reason="sw_power_cap"}': 1,  # two labels: not a device chart
            }
        )
        + step(2)
        + snapshot({device(TEMPERATURE, "gpu0"): "NaN", device(UTILIZATION, "gpu0"): 0.95})
    )
    run = load_run([path])
    assert run.devices == {
        TEMPERATURE: {"gpu0": [(1, 70.0)], "host": [(1, 45.0)]},
        POWER: {"gpu0": [(1, 250.5)]},
        UTILIZATION: {"gpu0": [(1, 0.9), (2, 0.95)], "host": [(1, 0.3)]},
    }
    page = render([run])
    assert payload(page)[0]["devices"][UTILIZATION] == {"gpu0": [[1, 0.9], [2, 0.95]], "host": [[1, 0.3]]}
    # The temperature chart's dashed line is DeviceHot's threshold, from the one place thresholds live.
    assert f"bound: {{max: {json.dumps(DEFAULTS.device_hot_celsius)}}}" in page
    assert "__DEVICE_HOT_CELSIUS__" not in page


def test_a_run_without_device_readings_has_none_to_chart(tmp_path: Path) -> None:
    path = tmp_path / "metrics-rank0.jsonl"
    path.write_text(step(1) + snapshot({'memory_bytes{kind="host_rss"}': 1e8}) + step(2))
    run = load_run([path])
    assert run.devices == {}
    assert payload(render([run]))[0]["devices"] == {}
