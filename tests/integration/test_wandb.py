"""backend: wandb, offline into save_dir, read back with the wandb library's own reader of its run files
(`wandb leet inspect --json`, one JSON object per record of the run's .wandb log)."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.support.writer_runs import STEPS, seed_shaped_config, train

pytestmark = pytest.mark.integration

WANDB = Path(sys.executable).parent / "wandb"


def history(save_dir: Path) -> tuple[dict[str, Any], dict[int, dict[str, float]]]:
    """The one run in save_dir/wandb: its run record, and its history rows by step, as wandb reads them."""
    [log] = sorted((save_dir / "wandb").glob("offline-run-*/run-*.wandb"))
    done = subprocess.run(
        [str(WANDB), "leet", "inspect", "--json", str(log)], capture_output=True, text=True, check=True, timeout=120
    )
    records = [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]
    [run] = [r["run"] for r in records if r["type"] == "run"]
    rows: dict[int, dict[str, float]] = {}
    for record in records:
        if record["type"] == "history":
            rows.setdefault(int(record["history"]["step"]["num"]), {}).update(record["history"]["item"])
    return run, rows


def test_wandb_holds_the_same_loss_lr_and_throughput_per_step_as_the_json_lines_file(tmp_path: Path) -> None:
    train(
        {
            "backend": ["wandb", "local"],
            "save_dir": str(tmp_path),
            "interval": 1,
            "port": 0,
            "project": "tiny",
            "tags": {"model": "tiny"},
        }
    )
    records = [json.loads(line) for line in (tmp_path / "metrics-rank0.jsonl").read_text().splitlines()]
    steps = {record["step"]: record for record in records if record["type"] == "step"}
    run, rows = history(tmp_path)
    assert run["display_name"] == "tiny-rank0" and run["project"] == "tiny"
    assert run["config"]["update"]["model"] == "tiny" and run["config"]["update"]["rank"] == 0
    assert len(steps) == STEPS and sorted(rows) == sorted(steps)
    for key in ("loss", "learning_rate", "tokens_per_second", "samples_per_second", "step_duration_seconds"):
        for step, record in steps.items():
            assert rows[step][key] == pytest.approx(record[key], rel=1e-12), (key, step)  # float64 on both sides
    lrs = [rows[step]["learning_rate"] for step in sorted(steps)]
    assert lrs[0] > lrs[-1]


def test_a_seed_shaped_config_with_backend_wandb_runs_unchanged(tmp_path: Path) -> None:
    train(seed_shaped_config(tmp_path, "wandb"))
    _, rows = history(tmp_path / "out")
    assert sorted(rows) == list(range(1, STEPS + 1))
    assert all(math.isfinite(row["loss"]) and row["loss"] > 0 for row in rows.values())
    assert all("samples_per_second" not in row for row in rows.values())  # switched off by `metrics`
