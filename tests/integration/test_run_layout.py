"""One run, one place: two runs with different projects in the default save_dir give two TensorBoard runs and two
runs in the report (the TensorBoard article's warning: experiments that share an output directory tangle)."""

from __future__ import annotations

from pathlib import Path

import pytest
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from ms_exporter.tools.report import load_runs, write_report
from tests.support.writer_runs import STEPS, train

pytestmark = pytest.mark.integration


def _steps(log_dir: Path) -> list[int]:
    reader = EventAccumulator(str(log_dir), size_guidance={"scalars": 0})
    reader.Reload()
    return sorted(event.step for event in reader.Scalars("loss"))


def test_two_projects_in_the_default_save_dir_stay_two_runs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    for project in ("bert-base", "bert-large"):
        train({"project": project, "backend": ["local", "tensorboard"], "interval": 1})
    save_dir = tmp_path / "monitor_output"  # the default
    for project in ("bert-base", "bert-large"):
        assert _steps(save_dir / "tensorboard" / project / "rank0") == list(range(1, STEPS + 1)), project
    jsonl = save_dir / "metrics-rank0.jsonl"  # one file per rank, shared: each record names its run
    runs = load_runs([jsonl])
    assert [(run.project, run.steps["step"]) for run in runs] == [
        ("bert-base", list(range(1, STEPS + 1))),
        ("bert-large", list(range(1, STEPS + 1))),
    ]
    written = write_report([str(jsonl)], str(tmp_path / "report.html"))
    assert len(written) == 2
    page = (tmp_path / "report.html").read_text()
    assert "project bert-base rank 0" in page and "project bert-large rank 0" in page


def test_a_file_written_before_records_named_their_run_is_one_run_per_project(tmp_path: Path) -> None:
    older = tmp_path / "metrics-rank0.jsonl"
    lines = [
        '{"type": "step", "rank": 0, "project": "a", "step": 1, "loss": 2.0}',
        '{"type": "step", "rank": 0, "project": "a", "step": 2, "loss": 1.9}',
        '{"type": "step", "rank": 0, "project": "b", "step": 1, "loss": 3.0}',
    ]
    older.write_text("\n".join(lines) + "\n")
    assert [(run.project, run.run, run.steps["step"]) for run in load_runs([older])] == [
        ("a", "", [1, 2]),
        ("b", "", [1]),
    ]
