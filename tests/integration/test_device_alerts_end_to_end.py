"""Two real training jobs, each rank with a scripted Ascend NPU (the fake npu-smi on PATH), scraped by a real
Prometheus running the shipped rules: the rank whose NPU runs hot and counts uncorrected ECC errors pages, with its
rank and device named; the rank beside it, on a healthy NPU, pages nothing."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path
from typing import Any

import pytest

from tests.support.alert_stack import Stack
from tests.support.fake_npu_smi import FAKE_DIR, SCENARIO_VARIABLE, chip
from tests.support.waiting import wait_until

pytestmark = pytest.mark.integration
ALERT_STACK_JOB_PORTS = 2
DEVICE_ALERTS = 'ALERTS{alertstate="firing", alertname=~"MindSporeTrainingDevice.*"}'


def _npu_job(stack: Stack, tmp_path: Path, project: str, port: int, npu: dict[str, Any]) -> subprocess.Popen[str]:
    scenario = tmp_path / f"{project}.json"
    log = tmp_path / f"{project}-calls.jsonl"
    scenario.write_text(json.dumps({"family": "910B", "chips": [npu], "fail": {}, "log": str(log)}))
    env = {
        SCENARIO_VARIABLE: str(scenario),
        "PATH": f"{FAKE_DIR}{os.pathsep}{os.environ.get('PATH', '')}",
        "ASCEND_RT_VISIBLE_DEVICES": "0",
    }
    return stack.run_job(project, "none", port=port, env=env, args=("--hardware-interval", "1"))


def test_the_hot_npu_pages_and_the_healthy_one_beside_it_does_not(stack: Stack, tmp_path: Path) -> None:
    hot = _npu_job(stack, tmp_path, "hot-npu", stack.job_ports[0], chip(0, temperature=97, ecc_double_bit=3))
    cool = _npu_job(stack, tmp_path, "cool-npu", stack.job_ports[1], chip(0, temperature=52, ecc_double_bit=0))
    try:
        wanted = {"MindSporeTrainingDeviceHot", "MindSporeTrainingDeviceEccErrors"}

        def firing() -> list[dict[str, Any]]:
            return stack.query(DEVICE_ALERTS)

        wait_until(
            lambda: wanted <= {alert["metric"]["alertname"] for alert in firing()},
            240,
            "DeviceHot and DeviceEccErrors firing for the hot NPU",
        )
        # The healthy rank has been read as long as the hot one (every second): had it paged, it would by now.
        wait_until(
            lambda: stack.query('mindspore_train_device_temperature_celsius{project="cool-npu", device="npu0"}'),
            60,
            "the healthy NPU read",
        )
        for alert in firing():
            labels = alert["metric"]
            assert labels["project"] == "hot-npu", labels
            assert (labels["rank"], labels["device"]) == ("0", "npu0"), labels
        assert hot.poll() is None and cool.poll() is None  # both still training
    finally:
        for job in (hot, cool):
            job.kill()
            job.wait(30)
