"""A fake npu-smi for tests: FakeNpuSmi puts this folder's `npu-smi` (and `hccn_tool`, the same script) first on PATH
and writes the scenario it prints (the script's docstring has the format)."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest

FAKE_DIR = Path(__file__).resolve().parent
SCENARIO_VARIABLE = "FAKE_NPU_SMI_SCENARIO"
# The variables that choose a rank's NPUs: cleared, so that a test chooses them itself.
CHOICE_VARIABLES = ("ASCEND_RT_VISIBLE_DEVICES", "ASCEND_VISIBLE_DEVICES", "DEVICE_ID")


def chip(npu_id: int, chip_id: int = 0, logic_id: int | None = None, **values: Any) -> dict[str, Any]:
    """One chip of an Atlas 800T A2 (910B3) as the fake prints it; `values` overrides (None: a field left out)."""
    logic = npu_id if logic_id is None else logic_id
    return {
        "npu_id": npu_id,
        "chip_id": chip_id,
        "logic_id": logic,
        "phy_id": None,
        "name": "910B3",
        "chip_type": "Ascend",
        "chip_version": "V1",
        "health": "OK",
        "temperature": 45 + logic,
        "power": 98.5 + logic,
        "aicore": 37,
        "aicore_freq": 1800,
        "aicore_cur_freq": 1650,
        "aicore_count": 20,
        "hbm_total_mb": 65536,
        "hbm_used_mb": 3378,
        "hbm_usage": 5,
        "hbm_bandwidth": 12,
        "ecc_single_bit": 3,
        "ecc_double_bit": 1,
        "link": "UP",
        "vdie_id": f"42C711D4 20B03704 4A10C8D4 14CC040A D210200{logic}",
        "pcie_bus_info": f"0000:C{logic}:00.0",
        **values,
    }


class FakeNpuSmi:
    """The scenario file of one test, rewritten on every change (atomically: a fake may be reading it)."""

    def __init__(
        self, directory: Path, monkeypatch: pytest.MonkeyPatch, chips: list[dict[str, Any]] | None = None
    ) -> None:
        self.path = directory / "npu_smi_scenario.json"
        self.log = directory / "npu_smi_calls.jsonl"
        self.chips = chips if chips is not None else [chip(0)]
        self.family = "910B"
        self.failures: dict[str, dict[str, Any]] = {}
        monkeypatch.setenv(SCENARIO_VARIABLE, str(self.path))
        monkeypatch.setenv("PATH", f"{FAKE_DIR}{os.pathsep}{os.environ.get('PATH', '')}")
        for name in CHOICE_VARIABLES:
            monkeypatch.delenv(name, raising=False)
        self.write()

    def write(self) -> None:
        scenario = {"family": self.family, "chips": self.chips, "fail": self.failures, "log": str(self.log)}
        draft = self.path.with_suffix(".draft")
        draft.write_text(json.dumps(scenario), encoding="utf-8")
        draft.replace(self.path)

    def set(self, index: int, **values: Any) -> None:
        self.chips[index].update(values)
        self.write()

    def fail(self, command: str, mode: str, **options: Any) -> None:
        """Make `command` (`info`, `info -t common`, `hccn_tool -link`, `*` ...) fail in `mode` from now on."""
        self.failures[command] = {"mode": mode, **options}
        self.write()

    def heal(self) -> None:
        self.failures.clear()
        self.write()

    def calls(self) -> list[dict[str, Any]]:
        """Every call so far: {"tool", "args", "pid"}."""
        if not self.log.exists():
            return []
        return [json.loads(line) for line in self.log.read_text(encoding="utf-8").splitlines()]
