"""The device recordings and alerts, run by Prometheus' own engine (promtool) over series shaped as dcgm-exporter and
npu-exporter write them: deploy/prometheus/tests/devices.test.yml shows the join naming each rank's own device (ours
first), DeviceHot/Throttling/EccErrors/LinkDown firing for the devices in trouble only, and Straggler's description
carrying the device state. Here: that file passes, its exporter series carry the exporters' real label sets and the
names ms_exporter/generate/device_exporters.py holds, and the PromQL examples of docs/hardware.md run."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from ms_exporter.core import catalogue as c
from ms_exporter.generate.device_exporters import EXPORTERS, DeviceExporter
from ms_exporter.generate.rules import RULES_FILE

pytestmark = [
    pytest.mark.integration,
    pytest.mark.skipif(shutil.which("promtool") is None, reason="promtool is not installed"),
]

ROOT = Path(__file__).resolve().parents[2]
CASES = ROOT / "deploy/prometheus/tests/devices.test.yml"
HARDWARE_DOC = ROOT / "docs/hardware.md"
# What Prometheus adds to every scraped series.
SCRAPE_LABELS = {"job", "instance"}
DEVICE_ALERTS = (
    "MindSporeTrainingDeviceHot",
    "MindSporeTrainingDeviceThrottling",
    "MindSporeTrainingDeviceEccErrors",
    "MindSporeTrainingDeviceLinkDown",
)


def _promtool(cases: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["promtool", "test", "rules", cases], cwd=cwd, capture_output=True, text=True, timeout=120, check=False
    )


def _input_series() -> list[dict[str, str]]:
    """The first case's series: six ranks on four hosts, their own devices and the two exporters'."""
    return yaml.safe_load(CASES.read_text())["tests"][0]["input_series"]


def _name_and_labels(selector: str) -> tuple[str, set[str]]:
    name, _, inside = selector.partition("{")
    return name, set(re.findall(r'(\w+)="', inside))


def _names(exporter: DeviceExporter) -> set[str]:
    singles = (exporter.temperature, exporter.power, exporter.utilization_percent)
    return {name for name in (*singles, exporter.ecc_uncorrected, exporter.link_status) if name} | set(
        exporter.throttle_masks
    )


def test_the_device_cases_pass_and_fire_and_stay_quiet() -> None:
    tests = yaml.safe_load(CASES.read_text())["tests"]
    checks = [check for case in tests for check in case["alert_rule_test"]]
    for name in DEVICE_ALERTS:
        named = [check for check in checks if check["alertname"] == name]
        assert any(check["exp_alerts"] for check in named) and any(not check["exp_alerts"] for check in named), name
    stragglers = [
        alert["exp_annotations"]["description"]
        for check in checks
        if check["alertname"] == "MindSporeTrainingStraggler"
        for alert in check["exp_alerts"]
    ]
    assert any("Device state: device gpu0 has uncorrected ECC errors." in text for text in stragglers)
    assert any("Device state: its devices look healthy." in text for text in stragglers)
    tested = _promtool(f"tests/{CASES.name}", ROOT / "deploy/prometheus")
    assert tested.returncode == 0, tested.stdout + tested.stderr


@pytest.mark.parametrize("exporter", EXPORTERS, ids=lambda exporter: exporter.name)
def test_the_exporter_series_are_shaped_as_the_exporter_writes_them(exporter: DeviceExporter) -> None:
    names = _names(exporter)
    shapes = [_name_and_labels(entry["series"]) for entry in _input_series()]
    seen = {name for name, _ in shapes if name in names}
    # Each name the rules read is exercised: dcgm-exporter's mask under both of its names.
    assert seen == names
    for name, labels in shapes:
        if name in names:
            # The exporter's own labels and the scrape's: a label the exporter never writes would make a join pass
            # here that fails on real series.
            assert labels - SCRAPE_LABELS <= set(exporter.labels), (name, labels)
            assert labels >= SCRAPE_LABELS, name


def test_the_docs_name_every_exporter_series_the_rules_read() -> None:
    rules = (ROOT / RULES_FILE).read_text()
    doc = HARDWARE_DOC.read_text()
    for exporter in EXPORTERS:
        for name in sorted(_names(exporter)):
            assert name in rules, f"the rules do not read {name}"
            assert f"`{name}`" in doc, f"docs/hardware.md does not name {name}"
        assert f"`{exporter.key}`" in doc


def _doc_examples() -> list[str]:
    section = HARDWARE_DOC.read_text().split("## Joining the device exporters", 1)[1].split("\n## ", 1)[0]
    return re.findall(r"^```promql\n(.*?)^```", section, re.MULTILINE | re.DOTALL)


def _sample(rank: str, device: str, value: float, **labels: str) -> dict[str, object]:
    inside = ", ".join(
        f'{key}="{text}"' for key, text in {"project": "p", "rank": rank, "device": device, **labels}.items()
    )
    return {"labels": "{" + inside + "}", "value": value}


def _state(rank: str, device: str, state: str) -> dict[str, object]:
    sample = _sample(rank, device, 1, state=state)
    return {**sample, "labels": c.RANK_DEVICE_STATE + str(sample["labels"])}


# What each example of docs/hardware.md gives over the first case's series, in the page's order: dcgm-exporter's
# temperatures of ranks 0 and 1 (the same GPU index and PCI address on two hosts, told apart by UUID), npu-exporter's
# of ranks 2 and 3 (the same chip id and PCIe address on two hosts, told apart by vdie_id), the devices not healthy.
EXPECTED = [
    [_sample("0", "gpu0", 72), _sample("1", "gpu0", 88)],
    [_sample("2", "npu0", 61), _sample("3", "npu0", 91)],
    [
        _state("1", "gpu0", "ecc_errors"),
        _state("4", "gpu1", "throttled"),
        _state("5", "npu1", "hot"),
        _state("3", "npu0", "link_down"),
    ],
]


def test_the_promql_examples_of_the_hardware_page_run(tmp_path: Path) -> None:
    examples = _doc_examples()
    assert len(examples) == len(EXPECTED), "docs/hardware.md's examples and this test's expectations differ in number"
    (tmp_path / "rules.yml").write_text((ROOT / RULES_FILE).read_text())
    cases = {
        "rule_files": ["rules.yml"],
        "evaluation_interval": "10s",
        "tests": [
            {
                "interval": "1m",
                "input_series": _input_series(),
                "promql_expr_test": [
                    {"expr": expr, "eval_time": "5m", "exp_samples": samples}
                    for expr, samples in zip(examples, EXPECTED, strict=True)
                ],
            }
        ],
    }
    (tmp_path / "examples.test.yml").write_text(yaml.safe_dump(cases, sort_keys=False))
    tested = _promtool("examples.test.yml", tmp_path)
    assert tested.returncode == 0, tested.stdout + tested.stderr
