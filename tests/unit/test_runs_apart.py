"""Runs kept apart: each demo run has its own run id and folder, and `ms-exporter report` shows a file that holds
several runs as several, saying so; the test suite leaves nothing in the checkout."""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path
from typing import Any

import pytest

from ms_exporter import cli
from ms_exporter.demo import demo_run
from ms_exporter.tools.report import holds, load_runs
from tests.conftest import ROOT, leftovers, snapshot

RUN = "ms-exporter-demo-7c77c0e2"  # a run id derived from the project and save_dir, as the demo's used to be


def _records(*trainings: tuple[int, int, bool], run: str = RUN) -> list[dict[str, Any]]:
    """JSON Lines records of trainings one after another in one file: (first step, last step, ended normally)."""
    identity = {"rank": 0, "project": "ms-exporter-demo", "run": run}
    records: list[dict[str, Any]] = []
    clock = 1_796_325_000.0
    for first, last, ended in trainings:
        records.append({"type": "event", **identity, "event": "train_begin", "time": clock, "step": first})
        for step in range(first + 1, last + 1):
            clock += 1.0
            records.append({"type": "step", **identity, "step": step, "loss": 1.0 / step, "time": clock})
        if ended:
            records.append({"type": "event", **identity, "event": "train_end", "time": clock, "step": last})
        clock += 30.0
    return records


def _write(path: Path, records: list[dict[str, Any]]) -> Path:
    path.write_text("".join(json.dumps(record) + "\n" for record in records), encoding="utf-8")
    return path


def test_a_file_with_two_runs_under_one_run_id_is_reported_as_two_runs_and_says_so(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # Two demo runs that appended to one file under one derived run id: the second began at step 0 again.
    path = _write(tmp_path / "metrics-rank0.jsonl", _records((0, 40, True), (0, 25, True)))
    runs = load_runs([path])
    assert [(run.attempt, run.steps["step"][-1], len(run.steps["step"])) for run in runs] == [(1, 40, 40), (2, 25, 25)]
    (said,) = holds(runs)
    assert said.startswith(f"{path} holds 2 runs") and RUN in said
    assert cli.main(["report", str(path), "-o", str(tmp_path / "report.html")]) == 0
    printed = capsys.readouterr().out.splitlines()
    assert printed[0] == said
    assert "(training 1 under this run id, began" in printed[1] and ": 40 steps" in printed[1]
    assert "(training 2 under this run id, began" in printed[2] and ": 25 steps" in printed[2]


@pytest.mark.parametrize(
    "trainings",
    [
        ((0, 40, False), (30, 60, True)),  # killed, then resumed from a checkpoint: one run with a restart
        ((0, 40, True), (40, 60, True)),  # ended, then continued (run_id given) from where it stopped
    ],
    ids=["resumed-after-a-kill", "continued-after-an-end"],
)
def test_a_run_resumed_or_continued_under_its_run_id_stays_one_run(
    tmp_path: Path, trainings: tuple[tuple[int, int, bool], ...]
) -> None:
    path = _write(tmp_path / "metrics-rank0.jsonl", _records(*trainings))
    (run,) = load_runs([path])
    assert run.attempt == 1 and run.steps["step"][-1] == 60
    assert holds([run]) == []


def test_two_run_ids_in_one_file_are_counted_without_calling_either_a_reuse(tmp_path: Path) -> None:
    path = _write(tmp_path / "metrics-rank0.jsonl", _records((0, 5, True), run="a") + _records((0, 5, True), run="b"))
    (said,) = holds(load_runs([path]))
    assert said == f"{path} holds 2 runs, each summarised on its own line below"


def test_each_demo_run_gets_a_run_id_and_a_folder_of_its_own() -> None:
    first, second = demo_run(1_796_325_000.0), demo_run(1_796_325_001.0)
    assert first["run_id"] != second["run_id"]
    assert first["run_id"].endswith(f"-{os.getpid()}")  # two demos started in the same second differ too
    for run in (first, second):
        assert Path(run["save_dir"]) == Path("monitor_output") / run["run_id"]


@pytest.fixture(scope="module")
def started_a_job_in() -> Path:
    """Where a module-scoped fixture (one that starts the jobs of a module, say) runs: set up before any test's own
    working directory is."""
    return Path.cwd().resolve()


def test_a_module_scoped_fixture_runs_outside_the_checkout(started_a_job_in: Path) -> None:
    assert started_a_job_in != ROOT and ROOT not in started_a_job_in.parents


def test_a_test_runs_in_a_working_directory_of_its_own_outside_the_checkout() -> None:
    here = Path.cwd().resolve()
    assert here != ROOT and ROOT not in here.parents
    from hypothesis.configuration import storage_directory

    home = storage_directory(intent_to_write=False)
    # Hypothesis's releases for Python 3.9 return the Path itself; later ones an object that holds it in .path.
    assert ROOT not in Path(getattr(home, "path", home)).resolve().parents


def test_the_suite_names_what_a_test_leaves_in_the_checkout_or_in_tmp() -> None:
    before = snapshot()
    assert leftovers(before)[0] == []
    probe = ROOT / f"ms_exporter_leftover_probe_{os.getpid()}"
    scratch = Path(tempfile.gettempdir()) / f"ms_exporter_leftover_probe_{os.getpid()}"
    try:
        (probe / "monitor_output").mkdir(parents=True)
        (probe / "monitor_output" / "hang-rank0.txt").write_text("left behind")
        scratch.mkdir()
        assert leftovers(before) == ([probe.name], [str(scratch)])
    finally:
        (probe / "monitor_output" / "hang-rank0.txt").unlink(missing_ok=True)
        for folder in (probe / "monitor_output", probe, scratch):
            if folder.exists():
                folder.rmdir()
    assert leftovers(before)[0] == []
