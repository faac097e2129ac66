"""`ms-exporter triage` on JSON Lines and TensorBoard files written here: each flag and its reason, no flag on
healthy siblings, old-format files, an empty directory, damaged lines and files, links not followed."""

from __future__ import annotations

import json
import math
import os
import random
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, Union

import pytest

from ms_exporter import cli
from ms_exporter.core import catalogue
from ms_exporter.tools import triage as t

STEPS = 200
Loss = Callable[[int], Union[float, str]]  # typing.Union: evaluated at import, on Python 3.9 too


def falling(seed: int, noise: float = 0.03) -> Loss:
    """A loss that falls and levels off, with a little noise (a healthy run)."""
    rng = random.Random(seed)
    return lambda step: 0.7 + 1.5 * math.exp(-step / 40) + noise * (rng.random() - 0.5)


def write_run(
    save_dir: Path,
    run: str | None,
    *,
    steps: int = STEPS,
    loss: Loss | None = None,
    tokens_per_second: float | None = 1000.0,
    samples_per_second: float = 40.0,
    planned: int | None = STEPS,
    end: str | None = "train_end",
    start: float | None = None,
    cycle: float = 0.1,
    project: str = "sweep",
    rank: int = 0,
    after_last: float = 0.0,
    name: str = "metrics",
) -> Path:
    """A metrics-rank<r>.jsonl as backend: local writes it: step records, a snapshot with the planned total at the
    start and after the last step (`after_last` seconds later), and an end event. Times end about now."""
    loss = loss or falling(hash(run) % 1000)
    start = time.time() - steps * cycle - after_last if start is None else start
    identity: dict[str, Any] = {"rank": rank, "project": project, **({"run": run} if run is not None else {})}
    lines: list[dict[str, Any]] = [{"type": "event", **identity, "event": "train_begin", "time": start, "step": 0}]
    metrics = {catalogue.jsonl_key(catalogue.PLANNED_STEPS.name): planned} if planned is not None else {}
    lines.append({"type": "snapshot", "time": start, **identity, "metrics": metrics})
    for step in range(1, steps + 1):
        record: dict[str, Any] = {
            "type": "step",
            **identity,
            "step": step,
            "epoch": 1,
            "steps": 1,
            "loss": loss(step),
            "step_duration_seconds": cycle * 0.9,
            "data_wait_seconds": cycle * 0.1,
            "time": start + step * cycle,
            "samples_per_second": samples_per_second,
        }
        if tokens_per_second is not None:
            record["tokens_per_second"] = tokens_per_second
        lines.append(record)
    last = start + steps * cycle + after_last
    lines.append({"type": "snapshot", "time": last, **identity, "metrics": metrics})
    if end == "train_end":
        lines.append({"type": "event", **identity, "event": "train_end", "time": last, "step": steps})
    elif end is not None:
        lines.append({"type": "event", **identity, "event": "signal", "signal": end, "time": last, "step": steps})
    save_dir.mkdir(parents=True, exist_ok=True)
    path = save_dir / f"{name}-rank{rank}.jsonl"
    with path.open("a", encoding="utf-8") as out:
        out.writelines(json.dumps(line) + "\n" for line in lines)
    return path


def healthy_sweep(parent: Path, count: int = 6) -> None:
    for index in range(count):
        write_run(parent / f"h{index}", f"h{index}", tokens_per_second=1000.0 * (0.85 + 0.06 * index))


def flags(parent: Path, **rules: Any) -> dict[str, dict[str, list[str]]]:
    verdicts, _ = t.triage([parent], t.Rules(**rules))
    return {v.label: v.flags for v in verdicts}


def flagged(parent: Path, **rules: Any) -> dict[str, set[str]]:
    return {label: set(found) for label, found in flags(parent, **rules).items() if found}


def test_healthy_siblings_are_not_flagged(tmp_path: Path) -> None:
    healthy_sweep(tmp_path)
    verdicts, notes = t.triage([tmp_path])
    assert [v.label for v in verdicts] == [f"h{i}" for i in range(6)]
    assert all(not v.flags for v in verdicts) and notes == []
    first = verdicts[0]
    assert first.steps == STEPS and first.unit == "tokens/s" and first.throughput == pytest.approx(850.0)
    assert first.final_loss == pytest.approx(0.7, abs=0.03) and first.window_steps == t.DEFAULT_WINDOW


def test_a_non_finite_loss_fails_the_run_and_names_the_first_step(tmp_path: Path) -> None:
    healthy_sweep(tmp_path, 5)
    base = falling(7)
    write_run(tmp_path / "nan", "nan", loss=lambda step: "NaN" if step >= 81 else base(step))
    found = flags(tmp_path)
    assert {label for label, f in found.items() if f} == {"nan"}
    [reason] = found["nan"]["failed"]
    assert "non-finite loss at 120 of 200 steps, first at step 81; the last loss is NaN" in reason
    verdict = next(v for v in t.triage([tmp_path])[0] if v.label == "nan")
    assert verdict.final_loss == "NaN" and verdict.swing is None  # no swing from a NaN window


def test_one_inf_that_recovered_still_fails_the_run(tmp_path: Path) -> None:
    healthy_sweep(tmp_path, 3)
    base = falling(8)
    write_run(tmp_path / "inf", "inf", loss=lambda step: "Inf" if step == 50 else base(step))
    found = flags(tmp_path)
    assert "first at step 50" in found["inf"]["failed"][0] and "last loss" not in found["inf"]["failed"][0]


def test_stopped_before_the_planned_total(tmp_path: Path) -> None:
    healthy_sweep(tmp_path, 5)
    write_run(tmp_path / "crashed", "crashed", steps=120, planned=STEPS)
    write_run(tmp_path / "sigterm", "sigterm", steps=150, planned=STEPS, end="SIGTERM")
    write_run(tmp_path / "shorter-plan", "shorter-plan", steps=100, planned=100)  # as planned: not flagged
    found = flags(tmp_path)
    assert found["crashed"] == {"failed": ["stopped at step 120 of the 200 planned"]}
    assert found["sigterm"] == {"failed": ["stopped at step 150 of the 200 planned (signal SIGTERM)"]}
    assert found["shorter-plan"] == {}


def test_stopped_early_without_a_plan_is_judged_against_the_siblings_median(tmp_path: Path) -> None:
    for index in range(5):
        write_run(tmp_path / f"h{index}", f"h{index}", planned=None)
    write_run(tmp_path / "short", "short", steps=150, planned=None)  # 75% of 200
    write_run(tmp_path / "nearly", "nearly", steps=170, planned=None)  # 85%: within the rule
    found = flags(tmp_path)
    assert {label for label, f in found.items() if f} == {"short"}
    assert "stopped at step 150, under 80% of the other runs' median last step (200" in found["short"]["failed"][0]


def test_a_run_still_going_is_not_stopped_early(tmp_path: Path) -> None:
    healthy_sweep(tmp_path, 4)
    write_run(tmp_path / "live", "live", steps=60, planned=STEPS, end=None)  # its last step a moment ago
    assert flags(tmp_path)["live"] == {}


def test_final_loss_above_the_threshold(tmp_path: Path) -> None:
    healthy_sweep(tmp_path, 4)
    write_run(tmp_path / "high", "high", loss=lambda step: 1.5 + 0.01 * (step % 3))
    assert flagged(tmp_path) == {}  # not judged without --loss-above
    found = flags(tmp_path, loss_above=1.0)
    assert {label for label, f in found.items() if f} == {"high"}
    assert found["high"]["failed"][0].startswith("final loss 1.51 (the mean of the last 50 steps) above 1")


def test_an_unstable_run_among_six(tmp_path: Path) -> None:
    healthy_sweep(tmp_path, 5)
    rng = random.Random(3)
    write_run(tmp_path / "wild", "wild", loss=lambda step: 0.7 + 0.6 * rng.random())
    found = flags(tmp_path)
    assert {label for label, f in found.items() if f} == {"wild"}
    [reason] = found["wild"]["unstable"]
    assert reason.startswith("the loss over its last 50 steps swings ") and "the other runs' median" in reason


def test_two_unstable_runs_among_six_are_both_flagged(tmp_path: Path) -> None:
    # The siblings' median, not their mean: another wild run among the siblings does not hide this one.
    healthy_sweep(tmp_path, 4)
    for name, seed in (("wild-a", 5), ("wild-b", 6)):
        rng = random.Random(seed)
        write_run(tmp_path / name, name, loss=lambda step, rng=rng: 0.7 + 0.6 * rng.random())
    assert flagged(tmp_path) == {"wild-a": {"unstable"}, "wild-b": {"unstable"}}


def test_the_page_states_the_rules_the_module_applies() -> None:
    # docs/triage.md names the numbers the constants hold (one home: the module; the page follows it).
    text = (Path(__file__).parents[2] / "docs" / "triage.md").read_text(encoding="utf-8")
    assert f"over {t.UNSTABLE_FACTOR:g}x the siblings' median swing and over {t.UNSTABLE_FLOOR:g}" in text
    assert f"under {t.SHORT_SHARE:.0%} of the siblings' median last step" in text
    assert f"at least {t.MIN_SIBLINGS} siblings that have the quantity" in text
    assert f"fewer than {t.MIN_WINDOW_POINTS} steps" in text
    assert f"last `--window` steps (default {t.DEFAULT_WINDOW})" in text
    assert f"`--slow-below` (default {t.DEFAULT_SLOW_BELOW:g})" in text


def test_a_loss_that_falls_steeply_is_no_swing(tmp_path: Path) -> None:
    healthy_sweep(tmp_path, 5)
    write_run(tmp_path / "steep", "steep", loss=lambda step: 5.0 - 0.02 * step + 0.01 * (step % 2))
    assert flagged(tmp_path) == {}


def test_unstable_needs_two_siblings_with_a_swing(tmp_path: Path) -> None:
    rng = random.Random(4)
    write_run(tmp_path / "h0", "h0")
    write_run(tmp_path / "wild", "wild", loss=lambda step: 0.7 + 0.6 * rng.random())
    assert flagged(tmp_path) == {}  # one sibling is no median
    write_run(tmp_path / "h1", "h1")
    assert flagged(tmp_path) == {"wild": {"unstable"}}


def test_slow_against_the_siblings_median_in_its_own_unit(tmp_path: Path) -> None:
    healthy_sweep(tmp_path, 5)
    write_run(tmp_path / "slow", "slow", tokens_per_second=300.0)
    # samples/s where a run counts no tokens: compared with the runs that have samples/s only
    write_run(tmp_path / "samples", "samples", tokens_per_second=None, samples_per_second=10.0)
    found = flags(tmp_path)
    assert {label for label, f in found.items() if f} == {"slow"}
    assert found["slow"]["slow"] == ["300 tokens/s (its median), 0.31x the other runs' median 970 (flagged below 0.5x)"]
    assert flagged(tmp_path, slow_below=0.0) == {}


def test_stalled_while_its_own_file_goes_on(tmp_path: Path) -> None:
    healthy_sweep(tmp_path, 4)
    # The monitor's writer kept writing snapshots for 10 minutes after the last step; no end.
    write_run(tmp_path / "hung", "hung", steps=120, end=None, after_last=600.0)
    found = flags(tmp_path)
    assert {label for label, f in found.items() if f} == {"hung"}
    [stalled] = found["hung"]["stalled"]
    assert stalled.startswith("no step after step 120 for 600 s (its hang deadline: 120 s)")
    assert "its own files went on being written; no end recorded" in stalled
    assert found["hung"]["failed"] == ["stopped at step 120 of the 200 planned"]


def test_stalled_against_a_sibling_that_went_on(tmp_path: Path) -> None:
    now = time.time()
    for index in range(3):
        write_run(tmp_path / f"h{index}", f"h{index}", start=now - STEPS * 0.1)
    # Killed (no end) half an hour ago; its file untouched since.
    path = write_run(tmp_path / "killed", "killed", steps=80, end=None, start=now - 1800 - 8)
    os.utime(path, (now - 1800, now - 1800))
    found = flags(tmp_path)
    assert set(found["killed"]) == {"failed", "stalled"}
    assert "other runs' files went on being written" in found["killed"]["stalled"][0]
    # The same run with its end recorded: it finished (early), it did not stall.
    (tmp_path / "killed" / "metrics-rank0.jsonl").unlink()
    write_run(tmp_path / "killed", "killed", steps=80, start=now - 1800 - 8)
    assert set(flags(tmp_path)["killed"]) == {"failed"}


def test_the_stall_deadline_is_learned_from_the_runs_own_steps(tmp_path: Path) -> None:
    healthy_sweep(tmp_path, 3)
    # 60 s steps: a 150 s pause is within 3 x its cycle (the hang deadline, as the monitor's own)
    write_run(tmp_path / "slow-steps", "slow-steps", steps=20, planned=20, end=None, cycle=60.0, after_last=150.0)
    assert "stalled" not in flags(tmp_path)["slow-steps"]


def test_files_written_before_runs_had_ids_are_one_run_per_project(tmp_path: Path) -> None:
    write_run(tmp_path / "shared", None, project="alpha")
    write_run(tmp_path / "shared", None, project="beta", tokens_per_second=200.0)
    write_run(tmp_path / "other", None, project="gamma")
    verdicts, _ = t.triage([tmp_path])
    assert [v.label for v in verdicts] == ["gamma", "alpha", "beta"]
    assert flagged(tmp_path) == {"beta": {"slow"}}


def test_runs_of_one_name_in_two_save_dirs_say_where(tmp_path: Path) -> None:
    write_run(tmp_path / "a", "same")
    write_run(tmp_path / "b", "same")
    labels = [v.label for v in t.triage([tmp_path])[0]]
    assert labels == [f"same ({tmp_path / 'a'})", f"same ({tmp_path / 'b'})"]


def test_ranks_of_one_run_are_one_row(tmp_path: Path) -> None:
    write_run(tmp_path / "r", "two-ranks", rank=1, loss=lambda step: "NaN" if step == 30 else 0.8)
    write_run(tmp_path / "r", "two-ranks", rank=0, loss=lambda step: 0.7)
    [verdict] = t.triage([tmp_path])[0]
    assert verdict.found.ranks == ["0", "1"] and verdict.final_loss == pytest.approx(0.7)  # rank 0's figures
    assert verdict.flags["failed"][0].startswith("non-finite loss at 1 of 200 steps, first at step 30")  # any rank's


def test_an_empty_directory(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert t.triage([tmp_path]) == ([], [])
    page = tmp_path / "triage.html"
    assert cli.main(["triage", str(tmp_path), "--html", str(page)]) == 0
    assert "no runs found" in capsys.readouterr().out
    assert "No runs found." in page.read_text()


def test_a_corrupt_line_is_skipped_and_said(tmp_path: Path) -> None:
    healthy_sweep(tmp_path, 3)
    path = tmp_path / "h1" / "metrics-rank0.jsonl"
    lines = path.read_text().splitlines(keepends=True)
    lines.insert(50, '{"type": "step", "rank": 0, "step": 4\n')  # cut off mid-write, then writing went on
    path.write_text("".join(lines))
    verdicts, notes = t.triage([tmp_path])
    assert [v.steps for v in verdicts] == [STEPS] * 3 and not any(v.flags for v in verdicts)
    [note] = notes
    assert note.startswith(f"{path}: skipped 1 lines that are not records: first at line 51 of metrics-rank0.jsonl: ")


def test_a_foreign_jsonl_file_is_skipped_and_said(tmp_path: Path) -> None:
    healthy_sweep(tmp_path, 2)
    foreign = tmp_path / "h0" / "other.jsonl"
    foreign.write_text("not json\n")
    (tmp_path / "empty").mkdir()
    (tmp_path / "empty" / "metrics-rank0.jsonl").write_text("")
    verdicts, notes = t.triage([tmp_path])
    assert [v.label for v in verdicts] == ["h0", "h1"]
    assert any(note.startswith(f"skipped {foreign}: ") and "not JSON" in note for note in notes)
    assert any("no step records" in note for note in notes)


def test_symlinks_are_not_followed(tmp_path: Path) -> None:
    outside = tmp_path / "outside"
    write_run(outside / "secret", "secret")
    given = tmp_path / "given"
    healthy_sweep(given, 2)
    (given / "link-dir").symlink_to(outside, target_is_directory=True)
    (given / "h0" / "metrics-rank1.jsonl").symlink_to(outside / "secret" / "metrics-rank0.jsonl")
    verdicts, notes = t.triage([given])
    assert [v.label for v in verdicts] == ["h0", "h1"]
    assert sorted(notes) == sorted(
        [
            f"not followed: {given / 'link-dir'} is a symlink",
            f"not followed: {given / 'h0' / 'metrics-rank1.jsonl'} is a symlink",
        ]
    )


def test_usage_errors_exit_2_with_a_clear_message(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    missing = tmp_path / "nope"
    for argv, message in (
        (["triage", str(missing)], f"{missing}: no such directory"),
        (["triage", str(tmp_path), "--window", "1"], "--window must be a whole number of steps from 2"),
        (["triage", str(tmp_path), "--slow-below", "2"], "--slow-below must be a share from 0"),
        (["triage", str(tmp_path), "--loss-above", "nan"], "--loss-above must be a finite number"),
    ):
        with pytest.raises(SystemExit) as exited:
            cli.main(argv)
        assert exited.value.code == 2
        assert f"ms-exporter triage: error: {message}" in capsys.readouterr().err


def test_the_command_prints_the_table_and_writes_a_self_contained_page(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    runs = tmp_path / "runs"
    healthy_sweep(runs, 4)
    write_run(runs / "nan", "nan", loss=lambda step: "NaN" if step > 100 else 0.8)
    write_run(runs / "slow", "slow", tokens_per_second=100.0)
    page = tmp_path / "triage.html"
    assert cli.main(["triage", str(runs), "--html", str(page), "--window", "20"]) == 0  # flagged runs: still 0
    out = capsys.readouterr().out.splitlines()
    assert out[0].split() == ["run", "steps", "final", "loss", "tokens/s", "flags"]
    nan_row = next(line for line in out if line.startswith("nan "))
    assert nan_row.split()[1:3] == ["200", "NaN"] and "failed: non-finite loss at 100 of 200 steps" in nan_row
    assert next(line for line in out if line.startswith("h0 ")).endswith("  -")
    assert "6 runs, 2 flagged (1 failed, 1 slow)" in out and out[-1] == f"wrote {page}"
    text = page.read_text()
    assert "<script" not in text and "http://" not in text and "https://" not in text  # nothing fetched
    assert text.count("<tr>") == 7 and text.count("<svg") == 6 and "non-finite loss at 100 of 200 steps" in text
    assert "the last 20 steps" in text  # the rules as applied


# -- TensorBoard event files ------------------------------------------------------------------------------------


def write_events(
    save_dir: Path, folder: str, losses: list[float], rank: int = 0, tokens: float = 1000.0, start: float = 0.0
) -> Path:
    """Event files as backend: tensorboard lays them out (tensorboardX's records), one scalar per key and step."""
    from tensorboardX import SummaryWriter

    log_dir = save_dir / "tensorboard" / folder / f"rank{rank}"
    start = start or time.time() - len(losses) * 0.1
    writer = SummaryWriter(logdir=str(log_dir))
    for step, loss in enumerate(losses, start=1):
        wall = start + 0.1 * step
        writer.add_scalar("loss", loss, step, walltime=wall)
        writer.add_scalar("tokens_per_second", tokens, step, walltime=wall)
        writer.add_scalar("step_duration_seconds", 0.09, step, walltime=wall)
        writer.add_scalar("grad/body.head", 0.5, step, walltime=wall)  # a prefixed layer tag: not a column
    writer.close()
    [path] = log_dir.glob("events.out.tfevents.*")
    return path


def test_tensorboard_only_runs_are_read_and_judged(tmp_path: Path) -> None:
    for index in range(3):
        write_events(tmp_path / f"h{index}", f"tb{index}", [falling(index)(s) for s in range(1, STEPS + 1)])
    write_events(tmp_path / "bad", "tb-nan", [0.9] * 50 + [math.nan] * 150)
    verdicts, notes = t.triage([tmp_path])
    assert notes == []
    found = {v.label: v for v in verdicts}
    assert sorted(found) == ["tb-nan", "tb0", "tb1", "tb2"]
    assert found["tb0"].found.sources == ["tensorboard"] and found["tb0"].found.ended is None
    assert found["tb0"].steps == STEPS and found["tb0"].throughput == pytest.approx(1000.0) and not found["tb0"].flags
    assert found["tb-nan"].flags == {
        "failed": ["non-finite loss at 150 of 200 steps, first at step 51; the last loss is NaN"]
    }


def test_a_run_in_json_lines_and_tensorboard_is_one_run(tmp_path: Path) -> None:
    for index, name in enumerate(("given-id", "proj-0123abcd")):
        save_dir = tmp_path / name
        write_run(save_dir, name, project="proj")
        # run_id given: its folder is the run_id; derived (`<project>-<8 hex>`): the project's
        write_events(save_dir, name if index == 0 else "proj", [0.7] * STEPS)
    verdicts, _ = t.triage([tmp_path])
    assert [(v.label, v.found.sources) for v in verdicts] == [
        ("given-id", ["json lines", "tensorboard"]),
        ("proj-0123abcd", ["json lines", "tensorboard"]),
    ]
    assert all(v.found.ended for v in verdicts)  # the end comes from JSON Lines


def test_tensorboard_fills_in_where_json_lines_lost_records(tmp_path: Path) -> None:
    write_run(tmp_path, "lost", steps=100, planned=200)
    write_events(tmp_path, "lost", [0.7] * 200)
    [verdict] = t.triage([tmp_path])[0]
    assert verdict.steps == 200 and verdict.found.notes == [
        "TensorBoard holds more steps than JSON Lines (200 against 100): its steps are used"
    ]
    assert "failed" not in verdict.flags  # the plan's 200 steps were reached


def test_both_event_readers_agree_and_stop_at_a_torn_record(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = write_events(tmp_path, "run", [0.5, math.nan, 0.25], start=1000.0)
    with_tensorboard = t.read_scalars(path)
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    reference = EventAccumulator(str(path), size_guidance={"scalars": 0}, purge_orphaned_data=False)
    reference.Reload()  # TensorBoard's own reader (by name, which the triage must not do) holds ours to the format
    assert sorted(reference.Tags()["scalars"]) == sorted(with_tensorboard)
    assert [(e.step, e.wall_time) for e in reference.Scalars("loss")] == [
        (step, wall) for step, (wall, _) in sorted(with_tensorboard["loss"].items())
    ]
    import builtins

    real_import = builtins.__import__

    def no_tensorboard(name: str, *args: Any, **kwargs: Any) -> Any:
        if name.startswith("tensorboard.") or name == "tensorboard":
            raise ImportError(name)
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_tensorboard)
    fallback = t._scalars_with_tensorboardx
    calls: list[Any] = []
    monkeypatch.setattr(t, "_scalars_with_tensorboardx", lambda handle: calls.append(handle) or fallback(handle))
    with_tensorboardx = t.read_scalars(path)
    assert len(calls) == 1  # the fallback read it
    assert with_tensorboardx.keys() == with_tensorboard.keys() >= {"loss", "tokens_per_second", "grad/body.head"}
    loss = with_tensorboardx["loss"]
    assert loss[1] == with_tensorboard["loss"][1] == (pytest.approx(1000.1), 0.5)
    assert math.isnan(loss[2][1]) and math.isnan(with_tensorboard["loss"][2][1])
    with path.open("ab") as out:
        out.write(b"\x10\x00\x00\x00\x00\x00\x00\x00torn")  # a writer killed mid-record
    assert t.read_scalars(path)["loss"][3][1] == 0.25 and len(calls) == 2
    monkeypatch.undo()
    assert t.read_scalars(path)["loss"][3][1] == 0.25
    reference.Reload()  # TensorBoard's reader stops at the torn record too
    assert [e.step for e in reference.Scalars("loss")] == [1, 2, 3]


def test_an_event_file_reached_through_a_link_is_refused(tmp_path: Path) -> None:
    path = write_events(tmp_path / "real", "run", [0.5])
    link = tmp_path / "link.tfevents"
    link.symlink_to(path)
    with pytest.raises(OSError):
        t.read_scalars(link)
