"""The goodput ledger's buckets from phase changes, and the run state that carries it across restarts."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from ms_exporter.config import ConfigError, load_config
from ms_exporter.config.run_identity import derived_run_id
from ms_exporter.core import catalogue as c
from ms_exporter.core.analysis.ledger import INDEX, TimeLedger, process_started
from ms_exporter.core.compat import zip_strict
from ms_exporter.core.phases import PhaseClock
from ms_exporter.core.store import MetricStore
from ms_exporter.features import run_state
from ms_exporter.features.goodput import Goodput
from ms_exporter.features.run_state import RunState, RunStateTaken


def booked(ledger: TimeLedger) -> dict[str, float]:
    return {bucket: round(seconds, 9) for bucket, seconds in zip_strict(c.TIME_BUCKETS, ledger.seconds()) if seconds}


# A 3 s deadline in step and data_wait, none elsewhere (as the hang deadline is NaN before training).
step_deadline = {c.STEP_PHASE: 3.0, c.DATA_WAIT_PHASE: 3.0}


def test_each_second_goes_to_one_bucket_stalled_first_then_compile_then_redo() -> None:
    base = time.perf_counter() - 1000.0  # a process that started 1000 s ago; the moves below are in its past
    ledger = TimeLedger(MetricStore(), base, step_deadline)
    clock = PhaseClock(MetricStore())
    clock.ledger = ledger
    clock.move(c.COMPILE, base + 10)  # startup: 10 s
    ledger.redoing = True  # compile outranks redo
    clock.move(c.DATA_WAIT_PHASE, base + 15)  # compile: 5 s; this wait is redo
    clock.move(c.STEP_PHASE, base + 16)  # redo 1
    clock.move(c.CALLBACKS, base + 17)  # redo 1 more; a callback hook inside the step...
    clock.move(c.STEP_PHASE, base + 17.5)  # ...is other, 0.5 s
    ledger.redoing = False  # the step in progress was opened as redo: it stays redo
    clock.move(c.DATA_WAIT_PHASE, base + 18)  # redo 0.5
    clock.move(c.STEP_PHASE, base + 19)  # data_wait 1
    clock.move(c.CHECKPOINT, base + 26)  # productive 3, then 4 s past the step's 3 s deadline: stalled
    clock.move(c.EVAL_PHASE, base + 28)  # checkpoint 2
    clock.move(c.ENDED, base + 29)  # eval 1
    ledger.stop(base + 30)  # other 1
    assert booked(ledger) == {
        "startup": 10,
        "compile": 5,
        "redo": 2.5,
        "other": 1.5,
        "data_wait": 1,
        "productive": 3,
        "stalled": 4,
        "checkpoint": 2,
        "eval": 1,
    }
    assert sum(ledger.seconds()) == pytest.approx(30)
    clock.move(c.STEP_PHASE, base + 40)  # after stop() nothing is booked
    assert sum(ledger.seconds()) == pytest.approx(30)


def test_the_series_read_the_open_segment_and_never_go_back_while_phases_change() -> None:
    """A reader on another thread sees every bucket only grow, and their sum follow the process's age."""
    store = MetricStore()
    started = time.perf_counter()
    ledger = TimeLedger(store, started, step_deadline)
    stop = threading.Event()

    def train() -> None:
        phases = (c.STEP_PHASE, c.CALLBACKS, c.STEP_PHASE, c.DATA_WAIT_PHASE)
        turn = 0
        while not stop.is_set():
            ledger.redoing = turn % 7 < 3
            ledger.move(phases[turn % 4], time.perf_counter())
            turn += 1

    writer = threading.Thread(target=train)
    writer.start()
    try:
        last = [0.0] * len(c.TIME_BUCKETS)
        for _ in range(2000):
            before = time.perf_counter()
            now = [series.value for series in store.series_of(c.TIME_SECONDS)]
            assert all(b >= a for a, b in zip_strict(last, now)), (last, now)
            assert sum(now) >= before - started - 0.05  # each series is read at its own moment: sum ~ age
            last = now
    finally:
        stop.set()
        writer.join()
    assert last[INDEX[c.REDO]] > 0 and last[INDEX[c.PRODUCTIVE]] > 0 and last[INDEX[c.OTHER]] > 0


def test_the_process_start_is_read_from_the_kernel() -> None:
    age = time.perf_counter() - process_started()
    assert 0 < age < time.time() - 0  # a real age, not the monitor's construction (0) ...
    import psutil

    # ... and the same as psutil's, which adds the boot time in whole seconds.
    assert age == pytest.approx(time.time() - psutil.Process().create_time(), abs=1.5)


@pytest.fixture
def process(monkeypatch: pytest.MonkeyPatch) -> Callable[[int], None]:
    """Makes the run state believe it runs in the process with this pid (a restart is another process)."""
    return lambda pid: monkeypatch.setattr(run_state.os, "getpid", lambda: pid)


def test_a_restart_carries_the_earlier_process_over(tmp_path: Path, process: Callable[[int], None]) -> None:
    process(101)
    first = RunState(str(tmp_path), "run-a", 0, given=False)
    assert (first.restarts, first.redo_until, first.earlier) == (0, 0, [0.0] * len(c.TIME_BUCKETS))
    for step in range(1, 241):
        first.mark(step)
    first.save([1.0] * len(c.TIME_BUCKETS), finished=False)
    for step in range(241, 251):  # past the last save: only the memory-mapped mark has them (then a SIGKILL)
        first.mark(step)
    first.close()
    process(102)
    second = RunState(str(tmp_path), "run-a", 0, given=False)
    assert second.restarts == 1 and second.redo_until == 250
    assert second.earlier == [1.0] * len(c.TIME_BUCKETS)
    second.save([2.0] * len(c.TIME_BUCKETS), finished=False)
    second.close()
    process(103)
    third = RunState(str(tmp_path), "run-a", 0, given=False)
    assert third.restarts == 2 and third.earlier == [3.0] * len(c.TIME_BUCKETS)
    third.save([0.5] * len(c.TIME_BUCKETS), finished=False)
    state = json.loads(third.path.read_text())
    assert state["earlier_seconds"]["productive"] == 3.0 and state["process"]["seconds"]["productive"] == 0.5
    third.close()
    # A monitor made again in the same process: its ledger counts from the process's start again, so the
    # process's own seconds are not earlier ones, and it is no restart.
    again = RunState(str(tmp_path), "run-a", 0, given=False)
    assert again.restarts == 2 and again.earlier == [3.0] * len(c.TIME_BUCKETS)
    again.close()


def test_two_monitors_of_one_process_do_not_share_a_run_state(tmp_path: Path) -> None:
    kept = RunState(str(tmp_path), "run-f", 0, given=False)
    with pytest.raises(RunStateTaken, match="kept by another TrainingMonitor of this process"):
        RunState(str(tmp_path), "run-f", 0, given=False)
    kept.close()
    RunState(str(tmp_path), "run-f", 0, given=False).close()  # free again once closed


def test_after_a_normal_end_a_derived_run_starts_anew_and_a_named_one_goes_on(
    tmp_path: Path, process: Callable[[int], None]
) -> None:
    for pid, given, expected in (
        (201, False, (0, 0, 0.0)),
        (202, False, (0, 0, 0.0)),
        (203, True, (1, 100, float(len(c.TIME_BUCKETS)))),
    ):
        process(pid)
        state = RunState(str(tmp_path), "run-b", 3, given=given)
        assert (state.restarts, state.redo_until, sum(state.earlier)) == expected
        state.mark(100)
        state.save([1.0] * len(c.TIME_BUCKETS), finished=True)
        state.close()


def test_ranks_sharing_a_save_dir_keep_files_of_their_own(tmp_path: Path, process: Callable[[int], None]) -> None:
    process(301)
    ranks = [RunState(str(tmp_path), "run-c", rank, given=False) for rank in range(2)]
    ranks[0].mark(7)
    for rank in ranks:
        rank.save([0.0] * len(c.TIME_BUCKETS), finished=False)
        rank.close()
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "ms_exporter-run-run-c-rank0.json",
        "ms_exporter-run-run-c-rank0.step",
        "ms_exporter-run-run-c-rank1.json",
        "ms_exporter-run-run-c-rank1.step",
    ]
    process(302)
    again = [RunState(str(tmp_path), "run-c", rank, given=False) for rank in range(2)]
    assert [state.redo_until for state in again] == [7, 0] and [state.restarts for state in again] == [1, 1]
    for state in again:
        state.close()


def test_an_unreadable_state_is_moved_aside_and_the_run_starts_anew(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    path = tmp_path / "ms_exporter-run-run-d-rank0.json"
    path.write_text('{"format": 1, "run_id": "run-d", "restarts": "many"')
    state = RunState(str(tmp_path), "run-d", 0, given=False)
    assert state.restarts == 0 and len(list(tmp_path.glob(path.name + ".unusable-*-invalid"))) == 1
    assert "is unusable (not UTF-8 JSON" in caplog.text
    state.close()


def test_run_ids_derived_from_project_and_save_dir_are_file_name_safe_and_differ_by_directory() -> None:
    assert derived_run_id("llama 7b/pretrain", "/data/a") == derived_run_id("llama 7b/pretrain", "/data/a/")
    assert derived_run_id("llama 7b/pretrain", "/data/a").startswith("llama_7b_pretrain-")
    assert derived_run_id("p", "/data/a") != derived_run_id("p", "/data/b")
    assert derived_run_id("///", "x").startswith("run-")


def test_run_id_and_goodput_settings_are_checked(monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(ConfigError, match=r"monitor_config.run_id: must be 1 to 128 letters"):
        load_config({"run_id": "a/b"})
    with pytest.raises(ConfigError, match=r"monitor_config.goodput.alert_below: must be a number between 0 and 1"):
        load_config({"goodput": {"alert_below": 1.5}})
    monkeypatch.setenv("MS_EXPORTER_RUN_ID", "pretrain-2026-12")
    assert load_config({}).run_id == "pretrain-2026-12"


def test_the_run_totals_are_exported_only_once_saved(tmp_path: Path) -> None:
    """What Prometheus reads of the run's totals is never more than the state file holds: a restart after a kill
    starts from the file, and a counter that went back would read as a reset."""
    config = load_config({"save_dir": str(tmp_path), "run_id": "run-e", "goodput": {"save_seconds": 3600}})
    store = MetricStore()
    goodput = Goodput(config, store, PhaseClock(store), 0, None, lambda exc: pytest.fail(str(exc)))
    goodput.start()
    try:
        time.sleep(0.05)
        exported = {dict(s.labels)["bucket"]: s.value for s in store.series_of(c.RUN_TIME_SECONDS)}
        saved = json.loads(goodput.state.path.read_text())["process"]["seconds"]  # type: ignore[union-attr]
        assert exported == saved  # the save at start, not the time since
        assert store.value_of(c.TIME_SECONDS) > exported["startup"]
        goodput.save()
        assert store.value_of(c.RUN_TIME_SECONDS) > exported["startup"]
    finally:
        goodput.close()
    assert store.value_of(c.RESTARTS) == 0
    assert [dict(s.labels)["run_id"] for s in store.series_of(c.RUN_INFO)] == ["run-e"]
