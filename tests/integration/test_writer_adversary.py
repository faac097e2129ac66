"""The file writers against an unlucky environment, each a real training in a child process
(benchmarks/adversary_writers.py, the same scenarios `make reliability` plays): a disk full for a while, an early
stop read back by triage and report, a `kill -9` of a TensorBoard-only run, writers that cannot start."""

from __future__ import annotations

from pathlib import Path

import pytest

from benchmarks import adversary_writers
from benchmarks.adversary import Case

pytestmark = pytest.mark.integration


def _case(key: str) -> Case:
    return next(case for case in adversary_writers.CASES if case.key == key)


def test_a_json_lines_writer_writes_again_after_a_disk_full_for_a_while_and_counts_every_lost_record(
    tmp_path: Path,
) -> None:
    case = _case("local_full_disk")
    facts = case.run(tmp_path)
    assert "error" not in facts, facts
    if "skipped" in facts:
        pytest.skip(facts["skipped"])
    assert facts["failures_while_full"] >= 4, facts  # more failures in a row than once switched the writer off
    assert facts["written_again_while_training"], facts  # the thread's own retry, before train end
    assert facts["disabled"] == 0, facts
    assert facts["dropped"] > 0 and facts["accounted"], facts  # in the file, or counted: nothing vanishes
    assert case.holds(facts), facts


def test_triage_and_report_read_an_early_stop_as_a_stop_on_purpose(tmp_path: Path) -> None:
    case = _case("early_stop_triage")
    facts = case.run(tmp_path)
    assert "error" not in facts, facts
    assert facts["trained_steps"] < facts["planned_steps"], facts  # it did stop short of its plan
    assert facts["early_stop_event"] and facts["events"][-1] == "train_end", facts
    assert facts["triage_failed"] is False, facts["triage_table"]
    assert facts["report_says_on_purpose"], facts["report"]
    assert case.holds(facts), facts


def test_tensorboard_points_reach_the_file_within_seconds_of_a_kill_9(tmp_path: Path) -> None:
    case = _case("tensorboard_kill9")
    facts = case.run(tmp_path)
    assert "error" not in facts, facts
    assert facts["trained_seconds"] >= adversary_writers.KILL_AFTER_SECONDS, facts
    assert facts["points"] > 0, facts  # the default interval (30 s) had not come round yet
    assert facts["lag_seconds"] <= adversary_writers.KILL_LAG_SECONDS, facts
    assert case.holds(facts), facts


def test_tensorboard_and_wandb_that_cannot_start_fall_back_to_one_json_lines_file(tmp_path: Path) -> None:
    case = _case("writers_cannot_start")
    facts = case.run(tmp_path)
    assert "error" not in facts, facts
    assert facts["jsonl_files"] == ["metrics-rank0.jsonl"], facts
    assert facts["step_records"] == list(range(1, 41)), facts
    assert facts["fallback_events"] == ["tensorboard"] and facts["told"] == 1, facts
    assert case.holds(facts), facts
