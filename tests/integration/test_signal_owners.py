"""Signals the monitor does not own, and processes it does not own: real trainings in child processes.

Each test plays a case of benchmarks/adversary_signals.py (the same scenario `make reliability` reports) and asserts
its verdict and the details that make it sharp.
"""

from __future__ import annotations

import signal
from pathlib import Path

import pytest

from benchmarks import adversary_signals as cases

pytestmark = pytest.mark.integration


def case(key: str) -> cases.Case:
    return next(c for c in cases.CASES if c.key == key)


def test_a_preemption_handler_keeps_its_checkpoint_listed_before_or_after_the_monitor(tmp_path: Path) -> None:
    """The script's own SIGTERM handler writes a checkpoint for 4 s and exits 0; SIGTERM comes twice, the second
    during the save. Listed after the monitor the handler owns SIGTERM (the watcher must not end the process);
    listed before it, the monitor's handler is in front and the second SIGTERM must reach the script's again."""
    facts = case("preemption_checkpoint").run(tmp_path)
    for order in ("first", "last"):
        seen = facts[order]
        assert "error" not in seen, seen
        assert seen["rc"] == 0, (order, seen)
        assert seen["checkpoint"], (order, seen)  # byte for byte, and MindSpore loads it
        assert seen["seconds"] >= cases.SAVE_SECONDS  # the save ran its whole length
        assert seen["signal_events"] >= 1, (order, seen)  # the monitor's saves were made as well
        assert seen["steps_unique"], (order, seen)
    assert case("preemption_checkpoint").holds(facts)


def test_on_request_exit_listed_after_the_monitor_owns_sigterm(tmp_path: Path) -> None:
    """MindSpore's OnRequestExit replaces the monitor's handler at train begin: SIGTERM only asks it to save at train
    end. The training runs to its end, OnRequestExit writes its checkpoint, the job exits 0."""
    facts = case("on_request_exit_after_monitor").run(tmp_path)
    assert "error" not in facts, facts
    assert facts["rc"] == 0, facts
    assert facts["trained_to_the_end"] and facts["last_step"] == 120, facts
    assert facts["checkpoints"] == ["Net_train.ckpt"], facts
    assert facts["steps_in_order"] and facts["signal_events"] >= 1, facts
    assert case("on_request_exit_after_monitor").holds(facts)


def test_sigterm_ends_a_stuck_training_after_another_monitor_closed(tmp_path: Path) -> None:
    """Two monitors; the first is closed; the training is stuck in MindSpore's native data pipeline. The process's
    one watcher makes the second monitor's saves and ends the process with SIGTERM."""
    facts = case("two_monitors_stuck").run(tmp_path)
    assert "error" not in facts, facts
    assert facts["rc"] == -signal.SIGTERM, facts
    assert facts["signal_saved"] and facts["target_left"], facts
    assert case("two_monitors_stuck").holds(facts)


def test_forked_children_that_exit_leave_the_parents_target_lock_and_records(tmp_path: Path) -> None:
    """A helper forked before training exits normally (its atexit handlers run) and a child forked at a step end,
    with records still queued, closes the monitor it inherited: the parent's file_sd target and run lock stay, and
    its JSON Lines file holds each step once."""
    facts = case("forked_children_exit").run(tmp_path)
    assert facts["rc"] == 0, facts
    assert facts["target_at_start"] and facts["lock_at_start"], facts
    assert facts["helper_rc"] == 0 and facts["closer_rc"] == 0, facts
    for child in ("helper", "closer"):
        assert facts[f"target_after_{child}"], (child, facts)
        assert facts[f"lock_after_{child}"], (child, facts)
    assert facts["one_record_per_step"] and facts["step_records"] == 60, facts
    assert case("forked_children_exit").holds(facts)
