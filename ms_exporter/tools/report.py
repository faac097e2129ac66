"""`ms-exporter report`: a finished run's JSON Lines rendered into one static HTML file with a summary.

Several files (ranks, or separate runs) share each chart's axes, one colour each. Rotated pieces of one rank's
file (`metrics-rank0.jsonl.1`, `.2` ...) given together are read as one run. A file that holds several runs (run ids
that shared a save_dir, or one run id trained again from the start after a normal end) gives one run each.
"""

from __future__ import annotations

import datetime
import html
import json
import math
import os
import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any, BinaryIO

from ms_exporter.config import MAX_STEPS, HangConfig
from ms_exporter.core import catalogue
from ms_exporter.core.analysis.learned_deadline import LearnedDeadline, nearest_rank
from ms_exporter.core.compat import zip_strict
from ms_exporter.core.files.safe_files import open_regular
from ms_exporter.core.thresholds import DEFAULTS

# Step-record columns the report plots, in chart order (and the wall-clock time of each record); memory comes from
# the snapshots.
PLOTTED = (
    *(
        family.short
        for family in (
            catalogue.LOSS,
            catalogue.LOSS_SMOOTHED,
            catalogue.LEARNING_RATE,
            catalogue.TOKENS_PER_SECOND,
            catalogue.SAMPLES_PER_SECOND,
            catalogue.STEP_DURATION,
            catalogue.DATA_WAIT,
            catalogue.GRAD_NORM,
            catalogue.MFU,
            catalogue.MODEL_FLOPS_PER_SECOND,
        )
    ),
    "time",
)
_LOSS, _SMOOTHED = catalogue.LOSS.short, catalogue.LOSS_SMOOTHED.short
EARLY_STOP = "early_stop"  # the action (catalogue.ACTIONS) whose event marks a stop on purpose
_DROPPED = catalogue.jsonl_key(catalogue.DROPPED_RECORDS.name, (("sink", "local"),))
# The ledger (docs/goodput.md): the run's totals over all its processes, else this process's (goodput off: none).
_LEDGER_KEYS = [
    {bucket: catalogue.jsonl_key(family.name, (("bucket", bucket),)) for bucket in catalogue.TIME_BUCKETS}
    for family in (catalogue.RUN_TIME_SECONDS, catalogue.TIME_SECONDS)
]
_RESTARTS = catalogue.jsonl_key(catalogue.RESTARTS.name)
_ROTATED = re.compile(r"^(?P<base>.+\.jsonl)(\.\d+)?$")
# Snapshot keys of the memory figure, in the order of preference (memory in use on the device, else the host's).
_MEMORY_KEYS = {
    catalogue.jsonl_key(catalogue.MEMORY_BYTES.name, (("kind", kind),)): kind for kind in catalogue.MEMORY_IN_USE_ORDER
}
# The hardware monitor's quantities the report charts per device (docs/hardware.md), by their snapshot key's short
# name: each snapshot holds `<short>{device="gpu0"}` for every device the rank reads, the host included.
DEVICE_CHARTED = tuple(
    catalogue.jsonl_key(family.name)
    for family in (catalogue.DEVICE_TEMPERATURE, catalogue.DEVICE_POWER, catalogue.DEVICE_UTILIZATION)
)
_DEVICE_KEY = re.compile(r'^(?P<short>[a-z_]+)\{device="(?P<device>[^"]*)"\}$')
_MAX_LABEL = 256  # characters of a project or rank shown
_NONFINITE = ("NaN", "Inf", "-Inf")  # how the writer writes a loss that is no number


# A record is a few KiB (a snapshot of every series: tens of KiB); a longer line is no record, and is skipped
# without being held whole (a 2 GB line took 4.2 GB of memory to read).
MAX_LINE_BYTES = 16 * 1024 * 1024
_CHUNK = 1024 * 1024


class ReportError(ValueError):
    """An input that cannot be read as ms_exporter JSON Lines; the message names the file and line."""


class _NotRecord(ValueError):
    """A line that is no ms_exporter record; the message says why. `foreign`: no JSON Lines record of any writer
    (not UTF-8, not JSON, not an object with a type): as a file's first line, the file is the wrong one."""

    def __init__(self, why: str, foreign: bool = False) -> None:
        super().__init__(why)
        self.foreign = foreign


@dataclass
class Run:
    label: str
    files: list[str]
    steps: dict[str, list[Any]] = field(default_factory=lambda: {"step": [], **{k: [] for k in PLOTTED}})
    memory: list[tuple[int, float]] = field(default_factory=list)  # (step, bytes) from snapshots
    memory_kind: str | None = None  # which kind `memory` holds (catalogue.MEMORY_IN_USE_ORDER)
    # DEVICE_CHARTED quantity -> device -> (step, value) from snapshots; only what the run measured.
    devices: dict[str, dict[str, list[tuple[int, float]]]] = field(default_factory=dict)
    last_loss: float | str | None = None  # the last step's loss as written: a number, or "NaN"/"Inf"/"-Inf"
    nonfinite_steps: list[int] = field(default_factory=list)  # steps whose loss was written "NaN"/"Inf"/"-Inf"
    last_snapshot: dict[str, Any] = field(default_factory=dict)
    events: list[dict[str, Any]] = field(default_factory=list)
    project: str = ""
    run: str = ""  # the records' `run` (empty in files written before records carried it)
    rank: str = ""
    # 1, or the n-th training under this run id that began again below the steps the earlier ones reached after they
    # had ended normally: a run id used again for a new run (load_runs), which the report shows apart.
    attempt: int = 1
    began: float | None = None  # the wall-clock time of its first train_begin event
    skipped_lines: int = 0  # lines that were no record: cut off mid-write, not JSON, not UTF-8, too long ...
    first_skipped: str = ""  # where the first was, and why

    def skipped(self) -> str | None:
        """What the report says about the lines it skipped; None when it skipped none."""
        if not self.skipped_lines:
            return None
        return f"skipped {self.skipped_lines} lines that are not records: first at {self.first_skipped}"


def _number(value: Any) -> float | None:
    """JSON Lines writes NaN/Inf as strings; the report's JSON carries them as null (an integer past a float, too)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    try:
        number = float(value)
    except OverflowError:
        return None
    return number if math.isfinite(number) else None


def _rotation_order(path: Path) -> tuple[int, str]:
    # metrics.jsonl.3 is older than .2, which is older than .1, which is older than the live file.
    suffix = path.name.rsplit(".", 1)[-1]
    return (-int(suffix) if suffix.isdigit() else 0, path.name)


def group_files(paths: list[str]) -> list[list[Path]]:
    """One group per run: a live file and its rotated pieces, oldest first."""
    groups: dict[str, list[Path]] = {}
    for raw in paths:
        path = Path(raw)
        if not path.is_file():
            raise ReportError(f"{raw}: no such file (give the metrics-rank<r>.jsonl files that backend: local wrote)")
        match = _ROTATED.match(path.name)
        key = str(path.parent / match.group("base")) if match else str(path)
        groups.setdefault(key, []).append(path)
    return [sorted(files, key=_rotation_order) for files in groups.values()]


def _lines(handle: BinaryIO) -> Iterator[bytes | None]:
    """The file's lines; None for a line longer than MAX_LINE_BYTES, read past in chunks and never held whole."""
    while line := handle.readline(MAX_LINE_BYTES + 1):
        if len(line) <= MAX_LINE_BYTES or line.endswith(b"\n"):
            yield line
            continue
        while (rest := handle.readline(_CHUNK)) and not rest.endswith(b"\n"):
            pass
        yield None


def _finite(text: str) -> float:
    number = float(text)
    if not math.isfinite(number):
        raise _NotRecord(f"a number out of range ({text[:20]})")
    return number


def _constant(name: str) -> Any:
    raise _NotRecord(f"{name} is not JSON (the writer writes non-finite numbers as strings)")


def _record(line: bytes | None) -> dict[str, Any]:
    """One line as a record; _NotRecord saying why it is none."""
    if line is None:
        raise _NotRecord(f"longer than {MAX_LINE_BYTES:,} bytes")
    try:
        record = json.loads(line.decode("utf-8"), parse_float=_finite, parse_constant=_constant)
    except UnicodeDecodeError as exc:
        raise _NotRecord(f"not UTF-8 (byte {exc.start})", foreign=True) from None
    except _NotRecord:
        raise
    except (ValueError, RecursionError) as exc:  # JSONDecodeError; an integer of over 4300 digits; deep nesting
        raise _NotRecord(f"not JSON ({getattr(exc, 'msg', None) or type(exc).__name__})", foreign=True) from None
    if not isinstance(record, dict) or "type" not in record:
        raise _NotRecord("not an ms_exporter JSON Lines record (a JSON object with a type)", foreign=True)
    kind = record["type"]
    if kind == "step":
        step = record.get("step")
        if isinstance(step, bool) or not isinstance(step, int) or not 0 <= step <= MAX_STEPS:
            raise _NotRecord(f"a step record whose step is not a whole number from 0 to {MAX_STEPS:g}")
    elif kind == "snapshot" and not isinstance(record.get("metrics", {}), dict):
        raise _NotRecord("a snapshot whose metrics are not a JSON object")
    return record


def load_runs(files: list[Path], nofollow: bool = False) -> list[Run]:
    """The runs the files hold, in the order they first appear. Runs that shared a save_dir share its files: each
    record names its run (`project`, and `run` in newer files; an older file without `run` is one run per project).
    Lines that are no record are skipped and counted (Run.skipped says where the first was and why); a file whose
    first line is not JSON is the wrong file: ReportError. `nofollow`: a file that is a symlink or no regular file
    is refused (OSError), as `core/files/safe_files.py` opens the monitor's own files (`ms-exporter triage` walking
    directories)."""
    runs: dict[tuple[str, str, int], Run] = {}
    last_steps: dict[tuple[str, str, int], int] = {}
    attempts: dict[tuple[str, str], int] = {}  # (project, run) -> the attempt its records belong to now
    ended: set[tuple[str, str]] = set()  # (project, run) whose last training ended normally
    skipped: list[tuple[int, str]] = []  # lines that belong to no run: counted on the first run
    for path in files:
        with os.fdopen(open_regular(path, os.O_RDONLY), "rb") if nofollow else path.open("rb") as handle:
            for number, line in enumerate(_lines(handle), start=1):
                if line is not None and not line.strip():
                    continue
                try:
                    record = _record(line)
                except _NotRecord as exc:
                    if number == 1 and exc.foreign:  # the wrong file was given
                        raise ReportError(f"{path}:{number}: {exc}") from None
                    # A line cut off mid-write (a killed run, a full disk), or one that something else wrote.
                    skipped.append((number, f"line {number} of {path.name}: {exc}"))
                    continue
                project = str(record.get("project", ""))[:_MAX_LABEL]
                name = (project, str(record.get("run", ""))[:_MAX_LABEL])
                event = record.get("event") if record["type"] == "event" else None
                attempt = attempts.setdefault(name, 1)
                if event == "train_begin" and name in ended and _begins_below(record, last_steps[name + (attempt,)]):
                    # A training that ended normally, then one that starts over its steps under the same run id:
                    # the monitor's run state started a new run (docs/goodput.md), so the report does too.
                    attempt = attempts[name] = attempt + 1
                if event == "train_begin":
                    ended.discard(name)
                elif event == "train_end":
                    ended.add(name)
                key = (*name, attempt)
                run = runs.get(key)
                if run is None:
                    run = runs[key] = Run(
                        label="", files=[str(f) for f in files], project=project, run=name[1], attempt=attempt
                    )
                    last_steps[key] = 0
                if event == "train_begin" and run.began is None:
                    run.began = _number(record.get("time"))
                run.rank = str(record.get("rank", run.rank))[:_MAX_LABEL]
                last_steps[key] = _add_record(run, record, last_steps[key])
    found = [run for run in runs.values() if run.steps["step"]]
    if not found:
        first = f" (skipped {len(skipped)} lines that are not records: first at {skipped[0][1]})" if skipped else ""
        raise ReportError(f"{files[0]}: no step records (was it written by backend: local during training?){first}")
    if skipped:
        found[0].skipped_lines, found[0].first_skipped = len(skipped), skipped[0][1]
    return found


def _begins_below(record: dict[str, Any], last_step: int) -> bool:
    step = _number(record.get("step"))
    return step is not None and step < last_step


def holds(runs: list[Run]) -> list[str]:
    """What the report says about a file that holds more than one run: how many, and that each is summarised on
    its own (a run id used again for a new run, with how to keep runs apart)."""
    by_file: dict[str, list[Run]] = {}
    for run in runs:
        by_file.setdefault(run.files[-1], []).append(run)
    lines = []
    for file, found in by_file.items():
        if len(found) < 2:
            continue
        again = sorted({r.run or r.project for r in found if r.attempt > 1})
        reused = (
            f"; run id {', '.join(again)} was used again after a normal end (a run of its own each time: give each "
            "run its own run_id or save_dir)"
            if again
            else ""
        )
        lines.append(f"{file} holds {len(found)} runs, each summarised on its own line below{reused}")
    return lines


def load_run(files: list[Path]) -> Run:
    """The first run the files hold (load_runs): the run, where they hold one."""
    return load_runs(files)[0]


def add_record(run: Run, record: dict[str, Any]) -> None:
    """One record as JSON Lines writes it (a step, a snapshot, an event) into a run read from elsewhere (triage's
    runs from TensorBoard event files): the same reading as a file's lines get."""
    _add_record(run, record, run.steps["step"][-1] if run.steps["step"] else 0)


def _add_record(run: Run, record: dict[str, Any], last_step: int) -> int:
    """One record into its run; the run's last step after it."""
    kind = record["type"]
    if kind == "step":
        last_step = record["step"]
        run.steps["step"].append(last_step)
        for key in PLOTTED:
            run.steps[key].append(_number(record.get(key)))
        if run.steps[_LOSS][-1] is None:  # the smoothed loss of a NaN step is no loss: a gap
            run.steps[_SMOOTHED][-1] = None
        loss = record.get("loss")
        run.last_loss = loss if isinstance(loss, (int, float)) or loss in _NONFINITE else None
        if isinstance(loss, str) and loss in _NONFINITE:
            run.nonfinite_steps.append(last_step)
    elif kind == "snapshot":
        metrics = record.get("metrics", {})
        run.last_snapshot = metrics
        memory_key = next((k for k in _MEMORY_KEYS if k in metrics), None)
        memory = _number(metrics[memory_key]) if memory_key is not None else None
        if memory is not None and memory_key is not None and last_step:
            run.memory.append((last_step, memory))
            run.memory_kind = _MEMORY_KEYS[memory_key]
        if last_step:
            _add_devices(run, last_step, metrics)
    elif kind == "event":
        run.events.append(record)
    return last_step


def _add_devices(run: Run, step: int, metrics: dict[str, Any]) -> None:
    for key, value in metrics.items():
        match = _DEVICE_KEY.match(key) if key.startswith("device_") else None
        number = _number(value)
        if match is None or number is None or match.group("short") not in DEVICE_CHARTED:
            continue
        device = match.group("device")[:_MAX_LABEL]
        run.devices.setdefault(match.group("short"), {}).setdefault(device, []).append((step, number))


def summary(run: Run, hang: HangConfig | None = None) -> dict[str, Any]:
    losses = [v for v in run.steps["loss"] if v is not None]
    throughput_key = "tokens_per_second" if any(run.steps["tokens_per_second"]) else "samples_per_second"
    rates = sorted(v for v in run.steps[throughput_key] if v is not None and v > 0)
    snapshot = run.last_snapshot

    def counters(prefix: str, label: str) -> dict[str, float]:
        found = {}
        for key, value in snapshot.items():
            number = _number(value)
            if key.startswith(prefix + "{") and number:
                name = re.search(label + r'="([^"]*)"', key)
                if name:
                    found[name.group(1)] = number
        return found

    return {
        "label": run.label,
        "steps": run.steps["step"][-1],
        "records": len(run.steps["step"]),
        # The last step's loss as it was, NaN included: a run that ended NaN did not end at its last finite loss.
        "final_loss": run.last_loss if isinstance(run.last_loss, (int, float, str)) else None,
        "last_finite_loss": next((v for v in reversed(run.steps["loss"]) if v is not None), None),
        "last_finite_step": next(
            (s for s, v in zip_strict(reversed(run.steps["step"]), reversed(run.steps["loss"])) if v is not None),
            None,
        ),
        "min_loss": min(losses) if losses else None,
        "nonfinite_losses": sum(1 for v in run.steps["loss"] if v is None),
        "throughput_unit": throughput_key.replace("_per_second", "/s"),
        "throughput_p10": _percentile(rates, 0.1),
        "throughput_p50": _percentile(rates, 0.5),
        "throughput_p90": _percentile(rates, 0.9),
        # Model FLOPs utilisation over the run's step records (docs/mfu.md); None without a peak.
        "mfu_p50": _percentile(sorted(v for v in run.steps[catalogue.MFU.short] if v is not None), 0.5),
        "breaches": counters("threshold_breaches_total", "metric"),
        "actions": counters("actions_total", "action"),
        "events": [e.get("event") for e in run.events],
        "early_stop": early_stop_of(run),
        "stalls": stalls(run, hang),
        # Records the writer could not write (it fell behind, or the disk was full): counted by the monitor.
        "dropped_records": int(_number(snapshot.get(_DROPPED)) or 0),
        "skipped_lines": run.skipped_lines,
        "skipped": run.skipped(),
        "wall_seconds": _wall_seconds(run),
        "time": ledger(snapshot),
        "restarts": int(_number(snapshot.get(_RESTARTS)) or 0),
        "checkpoint": checkpoint_advice(snapshot),
        "failslow": failslow(snapshot),
    }


def checkpoint_advice(snapshot: dict[str, Any]) -> dict[str, float | None]:
    """The checkpoint interval advisor's figures in a snapshot (docs/failslow.md#checkpoint-interval); each None
    where the run had none (no restart, no save)."""
    advised = catalogue.CHECKPOINT_INTERVAL_ADVISED.name
    return {
        "advised": _number(snapshot.get(catalogue.jsonl_key(advised, (("bound", "best"),)))),
        "low": _number(snapshot.get(catalogue.jsonl_key(advised, (("bound", "low"),)))),
        "high": _number(snapshot.get(catalogue.jsonl_key(advised, (("bound", "high"),)))),
        "current": _number(snapshot.get(catalogue.jsonl_key(catalogue.CHECKPOINT_INTERVAL.name))),
        "loss": _number(snapshot.get(catalogue.jsonl_key(catalogue.CHECKPOINT_GOODPUT_LOSS.name))),
        "mtbf": _number(snapshot.get(catalogue.jsonl_key(catalogue.MTBF.name))),
    }


def failslow(snapshot: dict[str, Any]) -> dict[str, float | None]:
    """The rank's fail-slow figures in a snapshot (docs/failslow.md): slowdowns flagged, the time they added, the
    last one's onset step and size; None where the detector had not begun."""
    return {
        "onsets": _number(snapshot.get(catalogue.jsonl_key(catalogue.FAILSLOW_ONSETS.name))),
        "seconds": _number(snapshot.get(catalogue.jsonl_key(catalogue.FAILSLOW_SECONDS.name))),
        "onset_step": _number(snapshot.get(catalogue.jsonl_key(catalogue.FAILSLOW_ONSET_STEP.name))),
        "size": _number(snapshot.get(catalogue.jsonl_key(catalogue.FAILSLOW_SIZE.name))),
    }


def early_stop_of(run: Run) -> dict[str, Any] | None:
    """The early stop (actions.early_stop) that ended the run's last training call, as its JSON Lines event says:
    {"step", "reason"}; None where the monitor did not stop it. A stop on purpose, not a failure."""
    found: dict[str, Any] | None = None
    for event in run.events:
        if event.get("event") == "train_begin":
            found = None
        elif event.get("event") == "action" and event.get("action") == EARLY_STOP:
            step = _number(event.get("step"))
            found = {"step": int(step) if step is not None else None, "reason": str(event.get("reason", ""))}
    return found


def ledger(snapshot: dict[str, Any]) -> dict[str, float]:
    """Seconds per goodput bucket in a snapshot: the run's totals, else the process's; empty without a ledger."""
    for keys in _LEDGER_KEYS:
        found = {bucket: _number(snapshot.get(key)) for bucket, key in keys.items()}
        if all(value is not None for value in found.values()):
            return {bucket: float(value or 0.0) for bucket, value in found.items()}
    return {}


def _wall_seconds(run: Run) -> float | None:
    times = [t for t in run.steps["time"] if t is not None]
    return times[-1] - times[0] if len(times) > 1 else None


def gaps(run: Run, hang: HangConfig | None = None) -> list[tuple[int, float, float, float]]:
    """(step, start, seconds, deadline) of each gap between two records: its step and wall-clock start, its length,
    and the hang deadline the monitor had while it lasted (core/analysis/learned_deadline.py, the probe's own
    formula, fed the same cycles: the first record's step and data wait until a few cycles are in)."""
    return _learned_gaps(run, hang)[0]


def deadline_after(run: Run, hang: HangConfig | None = None) -> float:
    """The hang deadline the monitor had after the run's last record (gaps' formula, fed every cycle): how long
    the run may go without a step before `ms-exporter triage` calls it stalled."""
    return _learned_gaps(run, hang)[1].seconds()


def _learned_gaps(run: Run, hang: HangConfig | None) -> tuple[list[tuple[int, float, float, float]], LearnedDeadline]:
    hang = hang or HangConfig()
    times, steps = run.steps["time"], run.steps["step"]
    learned = LearnedDeadline(hang)
    first = run.steps[catalogue.STEP_DURATION.short][0] if times else None
    if first is not None:
        learned.first_step(first + (run.steps[catalogue.DATA_WAIT.short][0] or 0.0))
    found = []
    for index in range(1, len(times)):
        earlier, later = times[index - 1], times[index]
        if earlier is None or later is None:
            continue
        found.append((steps[index - 1], earlier, later - earlier, learned.seconds()))
        learned.cycle(later - earlier)
    return found, learned


def stalls(run: Run, hang: HangConfig | None = None) -> list[dict[str, float]]:
    """Where the run stood still: two records further apart in wall-clock time than the hang deadline the monitor
    would have had there (`hang.factor` x the `hang.percentile` of the cycles before, at least `hang.min_seconds`;
    docs/hangs.md), with the step it stood at and for how long."""
    return [
        {"step": step, "start": start, "seconds": seconds}
        for step, start, seconds, deadline in gaps(run, hang)
        if seconds > deadline
    ]


def _percentile(values: list[float], q: float) -> float | None:
    return nearest_rank(values, q * 100) if values else None


def _utc(seconds: float) -> str:
    return datetime.datetime.fromtimestamp(seconds, datetime.timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC")


def render(runs: list[Run], hang: HangConfig | None = None) -> str:
    projects = [r.project for r in runs]
    # A project with two runs (two run_ids in one save_dir) names the run too.
    labels = [
        f"project {r.project}"
        + (f" run {r.run}" if r.run and projects.count(r.project) > 1 else "")
        + f" rank {r.rank}"
        for r in runs
    ]
    for index, run in enumerate(runs):
        if any(other.attempt > 1 for other in runs if (other.project, other.run) == (run.project, run.run)):
            began = f", began {_utc(run.began)}" if run.began is not None else ""
            labels[index] += f" (training {run.attempt} under this run id{began})"
    for index, run in enumerate(runs):
        duplicate = labels.count(labels[index]) > 1
        run.label = labels[index] + (f" ({Path(run.files[-1]).name}, run {index + 1})" if duplicate else "")
    data = [
        {
            "label": r.label,
            "steps": r.steps,
            "memory": r.memory,
            "memory_kind": r.memory_kind,
            "devices": r.devices,
            "summary": summary(r, hang),
        }
        for r in runs
    ]
    assets = resources.files("ms_exporter.endpoint") / "web_assets"
    template = (assets / "report.html").read_text(encoding="utf-8")
    payload = json.dumps(data, allow_nan=False, separators=(",", ":")).replace("</", "<\\/")
    title = "ms_exporter report: " + ", ".join(r.label for r in runs)
    return (
        template.replace("__CHART_JS__", (assets / "chart.js").read_text(encoding="utf-8"))
        .replace("__TITLE__", html.escape(title))
        .replace("__DEVICE_HOT_CELSIUS__", json.dumps(DEFAULTS.device_hot_celsius))
        .replace("__DATA__", payload)
    )


def write_report(paths: list[str], output: str, hang: HangConfig | None = None) -> list[Run]:
    runs = [run for files in group_files(paths) for run in load_runs(files)]
    Path(output).write_text(render(runs, hang), encoding="utf-8")
    return runs
