"""The device readers against an adversary (benchmarks/adversary_devices.py plays each scenario for real; these
tests hold the same verdicts as `make reliability`'s table, with the details that make them sharp)."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from benchmarks import adversary_devices, metrics_shape
from benchmarks.adversary import Case
from ms_exporter.core import catalogue as c

pytestmark = pytest.mark.integration


def _case(key: str) -> Case:
    return next(case for case in adversary_devices.CASES if case.key == key)


def test_a_process_whose_nvml_shutdown_hangs_still_exits_at_exit_and_after_close(tmp_path: Path) -> None:
    case = _case("nvml_shutdown_hangs")
    facts = case.run(tmp_path)
    assert case.holds(facts), facts
    for mode in ("atexit", "explicit"):
        assert facts[mode]["rc"] == 0, facts[mode]["stderr_tail"]
        assert facts[mode]["seconds"] < adversary_devices.EXIT_BOUND


def test_a_reader_switched_off_for_good_leaves_no_frozen_reading_on_the_page(tmp_path: Path) -> None:
    case = _case("stale_device_reading")
    facts = case.run(tmp_path)
    assert case.holds(facts), facts
    assert facts["before"] == {
        "mindspore_train_device_temperature_celsius": 91.0,
        "mindspore_train_device_healthy": 1.0,
        "mindspore_train_device_link_up": 1.0,
    }
    assert facts["failed_readings"] == 3
    assert facts["after"] == {}


def test_a_hung_npu_smi_is_switched_off_and_killed_with_the_setsid_child_it_leaves(tmp_path: Path) -> None:
    case = _case("npu_smi_hangs_with_setsid_child")
    facts = case.run(tmp_path)
    assert case.holds(facts), facts
    assert facts["timeouts"] == 3  # one per reading, the third switches it off
    assert facts["processes_left"] == 0
    assert facts["processes_started"] >= 2 * 3 - 1  # npu-smi and its child at each reading (the last may be cut short)


def test_an_npu_smi_planted_on_path_or_in_the_working_directory_never_runs(tmp_path: Path) -> None:
    case = _case("planted_npu_smi")
    facts = case.run(tmp_path)
    assert case.holds(facts), facts
    for where, run in facts.items():
        assert not run["ran"], where
        assert run["refusal_logged"], where
    assert not list(tmp_path.glob("ran-*"))


def test_the_demo_page_passes_promtool_check_metrics_with_snake_case_device_labels() -> None:
    promtool = shutil.which("promtool")
    if promtool is None:
        pytest.skip("promtool is not installed (the Debian prometheus package has it)")
    page = metrics_shape.page()
    assert f"{c.DEVICE_INFO.name}{{" in page  # the family whose labels promtool once refused
    checked = subprocess.run([promtool, "check", "metrics"], input=page, capture_output=True, text=True, timeout=60)
    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert all(label == label.lower() for label in c.DEVICE_INFO.labels)
