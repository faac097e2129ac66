"""Two real demo runs one after another, from the same directory: each keeps its own folder, JSON Lines file and run
id, and `ms-exporter report` over both files reports two runs, neither one mixed into the other."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration


def _demo(cwd: Path) -> str:
    done = subprocess.run(
        [sys.executable, "-m", "ms_exporter", "demo", "--steps", "3", "--port", "0"],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    return done.stdout


def test_two_demo_runs_from_one_directory_keep_their_files_and_run_ids_apart(tmp_path: Path) -> None:
    printed = [_demo(tmp_path), _demo(tmp_path)]
    paths = [re.search(r"^JSON Lines: (\S+) \(run (\S+)\)$", out, re.M) for out in printed]
    assert all(paths), printed
    files = [tmp_path / match.group(1) for match in paths if match]
    run_ids = [match.group(2) for match in paths if match]
    assert run_ids[0] != run_ids[1]
    assert [file.parent.name for file in files] == run_ids  # monitor_output/<run id>/metrics-rank0.jsonl
    assert sorted(p.name for p in (tmp_path / "monitor_output").iterdir()) == sorted(run_ids)
    for file, run_id in zip(files, run_ids, strict=True):
        records = [json.loads(line) for line in file.read_text().splitlines()]
        assert {record["run"] for record in records} == {run_id}
        assert [r["event"] for r in records if r["type"] == "event" and r["event"].startswith("train_")] == [
            "train_begin",
            "train_end",
        ]
    for out, file in zip(printed, files, strict=True):  # the closing tip names this run's file
        assert f" report {file.relative_to(tmp_path)} -o report.html" in out
    report = subprocess.run(
        [sys.executable, "-m", "ms_exporter", "report", *map(str, files), "-o", str(tmp_path / "report.html")],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    ).stdout.splitlines()
    lines = [line for line in report if line.startswith("project ")]
    assert len(lines) == 2 and all(": 3 steps" in line for line in lines), report
    assert not any(" holds " in line for line in report), report  # each file holds its one run
