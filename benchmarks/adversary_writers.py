"""Adversary cases for the file writers: a disk that is full for a while, a run the monitor stops early on purpose,
a `kill -9` of a TensorBoard-only run, and TensorBoard and W&B writers that cannot start.

Each case trains the demo Transformer for real in a child process (`python -m benchmarks.adversary_writers train
SPEC`), with a pacing callback after the monitor that appends `step wall_time` to a progress file every step,
writes the monitor's own counters to a status file, and ends the training when a stop file appears.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, TextIO

from benchmarks.adversary import Case
from tests.support.disks import fill, mounted_tmpfs

ROOT = Path(__file__).resolve().parents[1]
DISK_BYTES = 16 << 20  # the tmpfs a full disk is played on
# How far behind the kill the newest TensorBoard point may be: the records reach the writer within the publisher's
# second, the writer writes at least every 5 s (sinks/jsonl.py MAX_UNWRITTEN_SECONDS), and a loaded 2-core machine
# gets a few seconds' slack.
KILL_LAG_SECONDS = 10.0
KILL_AFTER_SECONDS = 15.0  # the training time before the kill: half the default `interval` (30 s)
_STARTUP_SECONDS = 120.0  # MindSpore's import and the first graph compilation, on a loaded machine


# -- the child: a real training -----------------------------------------------------------------------------------


def _train(spec: dict[str, Any]) -> None:
    import mindspore as ms
    from mindspore import nn
    from mindspore.train import Model

    from ms_exporter import TrainingMonitor
    from ms_exporter.demo import build_network, synthetic_dataset

    ms.set_context(mode=ms.GRAPH_MODE)
    ms.set_seed(0)
    scratch = Path(spec["scratch"])
    progress = open(scratch / "progress.txt", "a", buffering=1)  # noqa: SIM115  (open for the whole run)
    stop_file = scratch / "stop"
    pace = float(spec.get("pace", 0.0))
    monitor = TrainingMonitor({"port": 0, **spec["monitor"]})

    def write_status(**extra: Any) -> None:
        _write_status(scratch, monitor, **extra)

    network = build_network(layers=1, d_model=32, heads=2)
    optimizer = nn.Momentum(network.trainable_params(), 0.01, 0.9)
    model = Model(network, optimizer=optimizer)
    steps = int(spec["steps"])
    try:
        model.train(
            1,
            synthetic_dataset(size=steps * 8, batch=8),
            callbacks=[monitor, _pacer(progress, stop_file, pace, write_status)],
            dataset_sink_mode=False,
        )
    finally:
        monitor.close()
    write_status(step=-1, done=True)


def _counters(monitor: Any) -> dict[str, Any]:
    """The monitor's own counters: errors, dropped records and components switched off."""
    from ms_exporter.core import catalogue

    def by(family: Any, label: str) -> dict[str, float]:
        return {dict(s.labels)[label]: s.value for s in monitor.store.series_of(family)}

    return {
        "errors": by(catalogue.ERRORS, "component"),
        "dropped": by(catalogue.DROPPED_RECORDS, "sink"),
        "disabled": by(catalogue.COMPONENT_DISABLED, "component"),
    }


def _write_status(scratch: Path, monitor: Any, **extra: Any) -> None:
    """The monitor's counters (and `extra`) into SCRATCH/status.json, replaced whole so a reader never sees half."""
    temporary = scratch / "status.json.tmp"
    temporary.write_text(json.dumps({**_counters(monitor), **extra}))
    os.replace(temporary, scratch / "status.json")


def _pacer(progress: TextIO, stop_file: Path, pace: float, write_status: Callable[..., None]) -> Any:
    """The Pacer callback: it writes to `progress`, calls `write_status` and stops once `stop_file` exists."""
    from mindspore.train import Callback

    class Pacer(Callback):
        """After the monitor: the step's wall time, the monitor's counters, the pace, and the stop file."""

        def __init__(self) -> None:
            self.written = 0.0

        def on_train_step_end(self, run_context: Any) -> None:
            step = run_context.original_args().cur_step_num
            progress.write(f"{step} {time.time()}\n")
            now = time.monotonic()
            if now - self.written > 0.25:
                self.written = now
                write_status(step=step)
            if stop_file.exists():
                run_context.request_stop()
            if pace:
                time.sleep(pace)

    return Pacer()


def _child(scratch: Path, spec: dict[str, Any]) -> subprocess.Popen[bytes]:
    spec = {**spec, "scratch": str(scratch)}
    log = open(scratch / "child.log", "wb")  # noqa: SIM115  (handed to the child)
    try:
        return subprocess.Popen(
            [sys.executable, "-m", "benchmarks.adversary_writers", "train", json.dumps(spec)],
            cwd=ROOT,
            stdout=log,
            stderr=subprocess.STDOUT,
            env={**os.environ, "PYTHONPATH": str(ROOT)},
        )
    finally:
        log.close()


def _wait(what: str, ready: Callable[[], bool], child: subprocess.Popen[bytes] | None, seconds: float) -> bool:
    """Poll `ready` until it holds (True), the deadline passes or the child ended (False)."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if ready():
            return True
        if child is not None and child.poll() is not None:
            return ready()
        time.sleep(0.1)
    return False


def _status(scratch: Path) -> dict[str, Any]:
    with contextlib.suppress(OSError, ValueError):
        found: dict[str, Any] = json.loads((scratch / "status.json").read_text())
        return found
    return {}


def _progress(scratch: Path) -> list[tuple[int, float]]:
    lines = []
    with contextlib.suppress(OSError):
        for line in (scratch / "progress.txt").read_text().splitlines():
            with contextlib.suppress(ValueError):
                step, when = line.split()
                lines.append((int(step), float(when)))
    return lines


def _records(path: Path) -> list[dict[str, Any]]:
    found = []
    with contextlib.suppress(OSError):
        for line in path.read_text(encoding="utf-8").splitlines():
            with contextlib.suppress(ValueError):
                found.append(json.loads(line))
    return found


def _finish(child: subprocess.Popen[bytes], scratch: Path, seconds: float = 120.0) -> int:
    (scratch / "stop").touch()
    try:
        return child.wait(seconds)
    except subprocess.TimeoutExpired:
        child.kill()
        child.wait()
        return -9


def _log_tail(scratch: Path) -> str:
    with contextlib.suppress(OSError):
        return (scratch / "child.log").read_text(errors="replace")[-1500:]
    return ""


# -- a disk full for a while ----------------------------------------------------------------------------------------


def full_disk(scratch: Path) -> dict[str, Any]:
    """`backend: local` (interval 1 s) on a tmpfs filled until the writer failed 4 times (the old writer switched
    itself off after 3), then freed; the training goes on and is stopped after the file picked up again."""
    disk = scratch / "disk"
    with mounted_tmpfs(disk, DISK_BYTES) as why_not:
        if why_not is not None:
            return {"skipped": why_not}
        save_dir = disk / "out"
        path = save_dir / "metrics-rank0.jsonl"
        child = _child(
            scratch,
            {
                "monitor": {"backend": ["local"], "save_dir": str(save_dir), "interval": 1},
                "steps": 100_000,
                "pace": 0.02,
            },
        )
        facts: dict[str, Any] = {}
        try:
            steps_in = lambda: [r["step"] for r in _records(path) if r.get("type") == "step"]  # noqa: E731
            if not _wait("steps written", lambda: len(steps_in()) >= 20, child, _STARTUP_SECONDS):
                return {"error": "no step records before the disk filled", "log": _log_tail(scratch)}
            filler = fill(disk)
            errors = lambda: _status(scratch).get("errors", {}).get("local", 0)  # noqa: E731
            facts["failures_while_full"] = (
                errors() if not _wait("4 failed writes", lambda: errors() >= 4, child, 60) else errors()
            )
            freed_at = max((step for step, _ in _progress(scratch)), default=0)
            filler.unlink()
            facts["freed_at_step"] = freed_at
            # The file picks up again while training goes on (within the back-off: at most 60 s after space came back).
            facts["written_again_while_training"] = _wait(
                "written again", lambda: any(step > freed_at for step in steps_in()), child, 75
            )
        finally:
            facts["rc"] = _finish(child, scratch)
        facts.update(_written_or_lost(scratch, path))
        if not facts["done"]:
            facts["log"] = _log_tail(scratch)
        return facts


def _written_or_lost(scratch: Path, path: Path) -> dict[str, Any]:
    """After the run: the steps trained, the records in the JSON Lines file and those counted as lost."""
    status = _status(scratch)
    records = _records(path)
    trained = max((step for step, _ in _progress(scratch)), default=0)
    in_file = [r for r in records if r.get("type") in ("step", "event")]
    dropped = int(status.get("dropped", {}).get("local", 0))
    return {
        "trained_steps": trained,
        "records_in_file": len(in_file),
        "dropped": dropped,
        # Every record queued (each step, train_begin, train_end) is in the file or counted as lost.
        "accounted": len(in_file) + dropped == trained + 2,
        "disabled": int(status.get("disabled", {}).get("local", 0)),
        "done": bool(status.get("done")),
    }


def _full_disk_holds(facts: dict[str, Any]) -> bool:
    return (
        "skipped" not in facts
        and facts.get("done") is True
        and facts.get("rc") == 0
        and facts.get("failures_while_full", 0) >= 4
        and facts.get("written_again_while_training") is True
        and facts.get("accounted") is True
        and facts.get("disabled") == 0
        and facts.get("dropped", 0) > 0
    )


def _full_disk_shown(facts: dict[str, Any]) -> str:
    if "skipped" in facts or "error" in facts:
        return str(facts.get("skipped") or facts.get("error"))
    return (
        f"{facts['failures_while_full']} failed writes; written again while training: "
        f"{'yes' if facts['written_again_while_training'] else 'no'}; {facts['records_in_file']} records in the file "
        f"+ {facts['dropped']} counted lost = {facts['trained_steps'] + 2} queued: "
        f"{'yes' if facts['accounted'] else 'no'}; switched off: {'yes' if facts['disabled'] else 'no'}"
    )


# -- early stop, then triage and report -------------------------------------------------------------------------------


def early_stop(scratch: Path) -> dict[str, Any]:
    """actions.early_stop (per step, a min_delta no loss beats) ends a 400-step run early; then `ms-exporter triage`
    and `ms-exporter report` read its save_dir."""
    save_dir = scratch / "out"
    actions = {"early_stop": {"enable": True, "unit": "step", "patience": 5, "min_delta": 1.0e6}}
    child = _child(
        scratch, {"monitor": {"backend": ["local"], "save_dir": str(save_dir), "actions": actions}, "steps": 400}
    )
    try:
        rc = child.wait(_STARTUP_SECONDS + 120)
    except subprocess.TimeoutExpired:
        child.kill()
        child.wait()
        return {"error": "the training did not end", "log": _log_tail(scratch)}
    path = save_dir / "metrics-rank0.jsonl"
    records = _records(path)
    trained = max((r["step"] for r in records if r.get("type") == "step"), default=0)
    events = [r for r in records if r.get("type") == "event"]
    stop = next((e for e in events if e.get("event") == "action" and e.get("action") == "early_stop"), None)

    def command(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "ms_exporter", *args], capture_output=True, text=True, cwd=ROOT, check=False
        )

    triage = command("triage", str(save_dir), "--html", str(scratch / "triage.html"))
    report = command("report", str(path), "-o", str(scratch / "report.html"))
    tally = next((line for line in triage.stdout.splitlines() if " runs, " in line), None)  # "1 runs, 1 flagged (...)"
    page = (scratch / "triage.html").read_text(encoding="utf-8") if (scratch / "triage.html").exists() else ""
    return {
        "rc": rc,
        "trained_steps": trained,
        "planned_steps": 400,
        "early_stop_event": stop is not None,
        "early_stop_step": stop.get("step") if stop else None,
        "events": [e.get("event") for e in events],
        "triage_rc": triage.returncode,
        "triage_failed": "failed" in tally if tally is not None else None,
        "triage_table": triage.stdout[-800:],
        "triage_page_says_early_stop": "early stop at step" in page,
        "report_rc": report.returncode,
        "report_says_on_purpose": "stopped on purpose by early stop" in report.stdout,
        "report": report.stdout[-600:],
    }


def _early_stop_holds(facts: dict[str, Any]) -> bool:
    return (
        facts.get("rc") == 0
        and 0 < facts.get("trained_steps", 0) < facts.get("planned_steps", 0)
        and facts.get("early_stop_event") is True
        and facts.get("triage_rc") == 0
        and facts.get("triage_failed") is False
        and facts.get("triage_page_says_early_stop") is True
        and facts.get("report_says_on_purpose") is True
    )


def _early_stop_shown(facts: dict[str, Any]) -> str:
    if "error" in facts:
        return str(facts["error"])
    return (
        f"stopped at step {facts['trained_steps']} of {facts['planned_steps']}; early stop event: "
        f"{'yes' if facts['early_stop_event'] else 'no'}; triage flags it failed: "
        f"{'yes' if facts['triage_failed'] else 'no'}; report says on purpose: "
        f"{'yes' if facts['report_says_on_purpose'] else 'no'}"
    )


# -- kill -9 of a TensorBoard-only run ------------------------------------------------------------------------------


def tensorboard_kill(scratch: Path) -> dict[str, Any]:
    """`backend: tensorboard` at the default interval (30 s), killed with SIGKILL 15 s into training; the event
    file is read back with TensorBoard's own EventAccumulator."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    save_dir = scratch / "out"
    child = _child(
        scratch, {"monitor": {"backend": ["tensorboard"], "save_dir": str(save_dir)}, "steps": 100_000, "pace": 0.05}
    )
    try:
        began = lambda: _progress(scratch)[0][1] if _progress(scratch) else None  # noqa: E731
        if not _wait("training", lambda: began() is not None, child, _STARTUP_SECONDS):
            return {"error": "the training did not start", "log": _log_tail(scratch)}
        first = began()
        if first is None:  # the progress file went away: nothing to time the kill by
            return {"error": "no progress recorded", "log": _log_tail(scratch)}
        _wait("15 s of training", lambda: time.time() - first >= KILL_AFTER_SECONDS, child, KILL_AFTER_SECONDS + 30)
        killed_at = time.time()
        child.send_signal(signal.SIGKILL)
    finally:
        if child.poll() is None:
            child.kill()
        child.wait()
    trained = _progress(scratch)
    log_dir = save_dir / "tensorboard" / "default" / "rank0"
    points: dict[int, float] = {}
    if log_dir.is_dir():
        reader = EventAccumulator(str(log_dir), size_guidance={"scalars": 0})
        reader.Reload()
        if "loss" in reader.Tags()["scalars"]:
            points = {event.step: event.value for event in reader.Scalars("loss")}
    when = dict(trained)
    newest = max(points, default=None)
    return {
        "trained_seconds": killed_at - first,
        "trained_steps": max((step for step, _ in trained), default=0),
        "points": len(points),
        "newest_point_step": newest,
        "lag_seconds": killed_at - when[newest] if newest in when else None,
    }


def _tensorboard_kill_holds(facts: dict[str, Any]) -> bool:
    lag = facts.get("lag_seconds")
    return facts.get("points", 0) > 0 and lag is not None and lag <= KILL_LAG_SECONDS


def _tensorboard_kill_shown(facts: dict[str, Any]) -> str:
    if "error" in facts:
        return str(facts["error"])
    lag = "-" if facts["lag_seconds"] is None else f"{facts['lag_seconds']:.1f} s"
    return (
        f"killed after {facts['trained_seconds']:.0f} s at step {facts['trained_steps']}: {facts['points']} loss "
        f"points, the newest {lag} before the kill (allowed {KILL_LAG_SECONDS:.0f} s)"
    )


# -- writers that cannot start --------------------------------------------------------------------------------------


def writers_cannot_start(scratch: Path) -> dict[str, Any]:
    """`backend: [tensorboard, wandb]` and no `local`, where `save_dir/tensorboard` and `save_dir/wandb` are files:
    neither writer can start."""
    save_dir = scratch / "out"
    save_dir.mkdir()
    (save_dir / "tensorboard").write_text("a file where TensorBoard's directory goes\n")
    (save_dir / "wandb").write_text("a file where W&B's directory goes\n")
    wandb = {"mode": "offline"}
    child = _child(
        scratch,
        {"monitor": {"backend": ["tensorboard", "wandb"], "save_dir": str(save_dir), "wandb": wandb}, "steps": 40},
    )
    try:
        rc = child.wait(_STARTUP_SECONDS + 120)
    except subprocess.TimeoutExpired:
        child.kill()
        child.wait()
        return {"error": "the training did not end", "log": _log_tail(scratch)}
    files = sorted(p.name for p in save_dir.glob("*.jsonl"))
    records = _records(save_dir / "metrics-rank0.jsonl")
    log = (scratch / "child.log").read_text(errors="replace")
    status = _status(scratch)
    return {
        "rc": rc,
        "jsonl_files": files,
        "step_records": sorted({r["step"] for r in records if r.get("type") == "step"}),
        "fallback_events": [r.get("sink") for r in records if r.get("event") == "fallback"],
        "told": log.count("could not start; from now on the step records in JSON Lines"),
        "errors": status.get("errors", {}),
    }


def _cannot_start_holds(facts: dict[str, Any]) -> bool:
    return (
        facts.get("rc") == 0
        and facts.get("jsonl_files") == ["metrics-rank0.jsonl"]
        and facts.get("step_records") == list(range(1, 41))
        and facts.get("fallback_events") == ["tensorboard"]
        and facts.get("told") == 1
        and facts.get("errors", {}).get("tensorboard", 0) >= 1
        and facts.get("errors", {}).get("wandb", 0) >= 1
    )


def _cannot_start_shown(facts: dict[str, Any]) -> str:
    if "error" in facts:
        return str(facts["error"])
    return (
        f"JSON Lines: {', '.join(facts['jsonl_files']) or 'none'} with {len(facts['step_records'])} of 40 steps; "
        f"fallback said {facts['told']}x"
    )


CASES: tuple[Case, ...] = (
    Case(
        "local_full_disk",
        "fills the disk under save_dir until the JSON Lines writer failed 4 times, then frees it",
        "the writer retries with a back-off and writes again; every record is in the file or counted as lost",
        full_disk,
        _full_disk_holds,
        _full_disk_shown,
    ),
    Case(
        "early_stop_triage",
        "actions.early_stop ends a 400-step run early; triage and report read it",
        "an early_stop event is in JSON Lines; triage does not flag the run failed, report says it stopped on purpose",
        early_stop,
        _early_stop_holds,
        _early_stop_shown,
    ),
    Case(
        "tensorboard_kill9",
        f"kill -9 of a TensorBoard-only run {KILL_AFTER_SECONDS:.0f} s into training (interval 30 s)",
        f"the event file holds the loss up to within {KILL_LAG_SECONDS:.0f} s of the kill (JSON Lines' bound)",
        tensorboard_kill,
        _tensorboard_kill_holds,
        _tensorboard_kill_shown,
    ),
    Case(
        "writers_cannot_start",
        "TensorBoard and W&B writers whose directories are files, no `local` backend",
        "the run falls back to one JSON Lines file with every step, said once",
        writers_cannot_start,
        _cannot_start_holds,
        _cannot_start_shown,
    ),
)


def main(argv: list[str]) -> int:
    if argv[:1] == ["train"]:
        _train(json.loads(argv[1]))
        return 0
    print(f"usage: python -m benchmarks.adversary_writers train SPEC (got {argv})", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
