"""`ms-exporter triage`: every run under some directories, read back from its JSON Lines and TensorBoard event files,
and the runs that failed, are unstable, stalled or slow flagged with the reason, in a table and an HTML page.

The rules (docs/triage.md) compare each run with its siblings, the other runs found: a sweep of one model judged
against itself. The numbers are the constants below; the command line moves `--window`, `--slow-below` and
`--loss-above`.
"""

from __future__ import annotations

import argparse
import contextlib
import html
import math
import os
import re
import statistics
import struct
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any

from ms_exporter.config import MAX_STEPS, HangConfig
from ms_exporter.core import catalogue
from ms_exporter.core.compat import zip_strict
from ms_exporter.core.files.safe_files import open_regular
from ms_exporter.tools.report import (
    PLOTTED,
    ReportError,
    Run,
    add_record,
    deadline_after,
    early_stop_of,
    group_files,
    load_runs,
    summary,
)

DEFAULT_WINDOW = 50  # the last steps the final loss and the loss's swing are taken over
DEFAULT_SLOW_BELOW = 0.5  # slow: throughput under this share of the other runs' median
UNSTABLE_FACTOR = 3.0  # unstable: the loss swings more than this many times the other runs' median swing ...
UNSTABLE_FLOOR = 0.05  # ... and more than this share of its own level
SHORT_SHARE = 0.8  # stopped early, where no plan is recorded: the last step under this share of the others' median
MIN_SIBLINGS = 2  # a rule that compares with the other runs needs at least this many of them with the quantity
MIN_WINDOW_POINTS = 10  # finite losses the swing needs in the window
FLAGS = ("failed", "unstable", "stalled", "slow")

_JSONL = re.compile(r"\.jsonl(\.\d+)?$")
_RANK_DIR = re.compile(r"^rank(\d+)$")
_DERIVED_RUN_ID = re.compile(r"-[0-9a-f]{8}$")  # config/run_identity.py: `<project stem>-<8 hex digits>`
_PLANNED = catalogue.jsonl_key(catalogue.PLANNED_STEPS.name)
_ENDS = ("train_end", "signal")  # JSON Lines events after which a run's process ended as asked
_SCALARS = tuple(key for key in PLOTTED if key != "time")  # the step columns TensorBoard's scalars carry
_LOSS = catalogue.LOSS.short


@dataclass(frozen=True)
class Rules:
    """What the command line sets; the rest of the rules are the module's constants."""

    window: int = DEFAULT_WINDOW
    slow_below: float = DEFAULT_SLOW_BELOW
    loss_above: float | None = None
    hang: HangConfig = field(default_factory=HangConfig)  # how long without a step is stalled (its defaults)


@dataclass
class Found:
    """One run as its files show it: the figures are its lowest rank's; non-finite losses count on every rank."""

    name: str  # the records' run (run_id), else the project; a TensorBoard-only run: its folder
    where: Path  # its save_dir
    run: Run
    sources: list[str]  # "json lines", "tensorboard"
    ranks: list[str]
    ended: bool | None  # an end recorded after the last step; None: TensorBoard files, which record none
    end: str = ""  # how it ended: "train_end", "signal SIGTERM", "early stop at step 40: <reason>"
    on_purpose: bool = False  # the monitor's early stop ended it: short of its plan on purpose, not failed
    planned: int | None = None  # the global step its training call was planned to end at
    latest: float | None = None  # the newest time its files show (records, modification times)
    nonfinite: list[int] = field(default_factory=list)  # steps with a non-finite loss, any rank
    notes: list[str] = field(default_factory=list)


@dataclass
class Verdict:
    """A run's figures as the table shows them, and its flags: flag -> reasons, in FLAGS' order."""

    found: Found
    label: str
    steps: int
    final_loss: float | str | None  # the mean of the last window's finite losses; "NaN"/"Inf" when the last was
    window_steps: int  # the finite losses that mean is taken over
    throughput: float | None
    unit: str  # "tokens/s" or "samples/s"
    swing: float | None  # the loss's residual std about its trend over the window, over its mean
    swing_steps: int  # the losses the swing is taken over
    flags: dict[str, list[str]] = field(default_factory=dict)


def run_triage(args: argparse.Namespace, error: Callable[[str], Any]) -> int:
    """`ms-exporter triage`, with arguments declared in cli.py; `error` is the subcommand parser's (exits 2)."""
    if not 2 <= args.window <= MAX_STEPS:
        error(f"--window must be a whole number of steps from 2 to {MAX_STEPS:g}, not {args.window}")
    if not 0 <= args.slow_below <= 1:
        error(f"--slow-below must be a share from 0 (never slow) to 1, not {args.slow_below:g}")
    if args.loss_above is not None and not math.isfinite(args.loss_above):
        error(f"--loss-above must be a finite number, not {args.loss_above}")
    for directory in args.dirs:
        if not os.path.isdir(directory):
            error(f"{directory}: no such directory (give the directories that hold the runs' save_dirs)")
    rules = Rules(window=args.window, slow_below=args.slow_below, loss_above=args.loss_above)
    verdicts, notes = triage([Path(d) for d in args.dirs], rules)
    print(render_table(verdicts))
    for note in notes:
        print(f"note: {note}")
    if args.html:
        try:
            Path(args.html).write_text(render_html(verdicts, notes, rules, args.dirs), encoding="utf-8")
        except OSError as exc:
            print(f"ms-exporter triage: {args.html}: {exc}", file=sys.stderr)
            return 1
        print(f"wrote {args.html}")
    return 0


def triage(dirs: list[Path], rules: Rules | None = None) -> tuple[list[Verdict], list[str]]:
    """Every run under `dirs`, judged; and notes on what could not be read (skipped files, links not followed)."""
    rules = rules or Rules()
    found, notes = find_runs(dirs)
    return judge(found, rules), notes


# -- finding the runs -------------------------------------------------------------------------------------------


def find_runs(dirs: list[Path]) -> tuple[list[Found], list[str]]:
    """The runs whose files lie under `dirs` (never through a symlink), a run seen in JSON Lines and TensorBoard
    once."""
    jsonl, events, notes = _walk(dirs)
    runs: dict[tuple[Path, str], list[tuple[Run, str]]] = {}  # (save_dir, name) -> (run, source) of each rank
    try:
        groups = group_files([str(path) for path in jsonl])
    except ReportError as exc:  # a file that went away since the walk
        groups = []
        notes.append(f"skipped the JSON Lines files: {exc}")
    for group in groups:
        try:
            for run in load_runs(group, nofollow=True):
                name = run.run or run.project or "default"
                runs.setdefault((group[0].parent, name), []).append((run, "json lines"))
                if run.skipped():
                    notes.append(f"{group[-1]}: {run.skipped()}")
        except (ReportError, OSError) as exc:
            notes.append(f"skipped {group[-1]}: {exc}")
    for (save_dir, folder, rank), files in sorted(_event_runs(events).items()):
        tensorboard = _tensorboard_run(files, folder, rank, notes)
        if tensorboard is None:
            continue
        key = _matching(runs, save_dir, folder) or (save_dir, folder)
        runs.setdefault(key, []).append((tensorboard, "tensorboard"))
    return [_found(save_dir, name, ranks) for (save_dir, name), ranks in runs.items()], notes


def _walk(dirs: list[Path]) -> tuple[list[Path], list[Path], list[str]]:
    """JSON Lines files and TensorBoard event files under `dirs`: regular files only, each once, and no symlink
    followed (a link is noted and left)."""
    jsonl: list[Path] = []
    events: list[Path] = []
    notes: list[str] = []
    seen: set[tuple[int, int]] = set()
    stack = [Path(d) for d in reversed(dirs)]
    while stack:
        directory = stack.pop()
        try:
            entries = sorted(os.scandir(directory), key=lambda entry: entry.name)
        except OSError as exc:
            notes.append(f"skipped {directory}: {exc.strerror or exc}")
            continue
        subdirectories = []
        for entry in entries:
            path = Path(entry.path)
            try:
                if entry.is_symlink():
                    if _JSONL.search(entry.name) or "tfevents" in entry.name or entry.is_dir():
                        notes.append(f"not followed: {path} is a symlink")
                    continue
                if entry.is_dir(follow_symlinks=False):
                    subdirectories.append(path)
                    continue
                if not entry.is_file(follow_symlinks=False):
                    continue
                info = entry.stat(follow_symlinks=False)
            except OSError:
                continue
            if (info.st_dev, info.st_ino) in seen:
                continue
            if _JSONL.search(entry.name):
                seen.add((info.st_dev, info.st_ino))
                jsonl.append(path)
            elif "tfevents" in entry.name:
                seen.add((info.st_dev, info.st_ino))
                events.append(path)
        stack.extend(reversed(subdirectories))
    return jsonl, events, notes


def _event_runs(events: list[Path]) -> dict[tuple[Path, str, str], list[Path]]:
    """Event files by (save_dir, run folder, rank): `save_dir/tensorboard/<run>/rank<r>/events.out.tfevents.*` as
    the tensorboard backend writes them; a file elsewhere is a run of its own directory's name, rank 0."""
    found: dict[tuple[Path, str, str], list[Path]] = {}
    for path in events:
        rank_dir = path.parent
        rank = _RANK_DIR.match(rank_dir.name)
        if rank and rank_dir.parent.parent.name == "tensorboard":
            key = (rank_dir.parent.parent.parent, rank_dir.parent.name, rank.group(1))
        else:
            key = (path.parent, path.parent.name, "0")
        found.setdefault(key, []).append(path)
    return found


def _matching(
    runs: dict[tuple[Path, str], list[tuple[Run, str]]], save_dir: Path, folder: str
) -> tuple[Path, str] | None:
    """The JSON Lines run of save_dir that TensorBoard's `folder` is (config/run_identity.py: the run_id when one
    was given, else the project's stem, which a derived run id begins with)."""
    candidates = [key for key in runs if key[0] == save_dir]
    for key in candidates:
        if key[1] == folder:
            return key
    for key in candidates:
        run = runs[key][0][0]
        if folder in (_DERIVED_RUN_ID.sub("", run.run), run.project):
            return key
    return None


def _found(save_dir: Path, name: str, ranks: list[tuple[Run, str]]) -> Found:
    """One run from its ranks' readings (a rank may be read from JSON Lines and TensorBoard both)."""
    by_rank: dict[str, dict[str, Run]] = {}
    for run, source in ranks:
        by_rank.setdefault(run.rank, {})[source] = run
    order = sorted(by_rank, key=lambda rank: (not rank.isdigit(), int(rank) if rank.isdigit() else 0, rank))
    readings = by_rank[order[0]]
    notes: list[str] = []
    run = readings.get("json lines") or readings["tensorboard"]
    tensorboard = readings.get("tensorboard")
    if tensorboard is not None and run is not tensorboard and len(tensorboard.steps["step"]) > len(run.steps["step"]):
        # Both were written from the same steps: the one with fewer lost records (dropped, or a writer switched off).
        notes.append(
            f"TensorBoard holds more steps than JSON Lines ({len(tensorboard.steps['step'])} against "
            f"{len(run.steps['step'])}): its steps are used"
        )
        run.steps, run.last_loss, run.nonfinite_steps = (
            tensorboard.steps,
            tensorboard.last_loss,
            tensorboard.nonfinite_steps,
        )
    sources = sorted({source for rank in by_rank.values() for source in rank})
    nonfinite = sorted(
        {step for rank in by_rank.values() for reading in rank.values() for step in reading.nonfinite_steps}
    )
    times = [t for t in run.steps["time"] if t is not None]
    latest = [max(times)] if times else []
    for rank in by_rank.values():
        for reading in rank.values():
            latest.extend(float(event["time"]) for event in reading.events if _real(event.get("time")))
            for file in reading.files:
                with contextlib.suppress(OSError):
                    latest.append(os.lstat(file).st_mtime)
    ended: bool | None = None
    end = ""
    early = None
    if "json lines" in readings:
        last = run.steps["step"][-1]
        ends = [e for e in run.events if e.get("event") in _ENDS and _step_of(e.get("step"), last) >= last]
        ended = bool(ends)
        if ends:
            end = str(ends[-1]["event"]) + (f" {ends[-1].get('signal')}" if ends[-1].get("event") == "signal" else "")
        early = early_stop_of(run) if ended else None
        if early is not None:
            end = f"early stop at step {early['step']}: {early['reason']}"
    planned = _number(run.last_snapshot.get(_PLANNED))
    return Found(
        name=name,
        where=save_dir,
        run=run,
        sources=sources,
        ranks=order,
        ended=ended,
        end=end,
        on_purpose=early is not None,
        planned=int(planned) if planned is not None and planned >= 1 else None,
        latest=max(latest) if latest else None,
        nonfinite=nonfinite,
        notes=notes,
    )


def _number(value: Any) -> float | None:
    """A finite number as a float; None for anything else (a string, a bool, NaN written as "NaN")."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    number = float(value)
    return number if math.isfinite(number) else None


def _real(value: Any) -> bool:
    return _number(value) is not None


def _step_of(value: Any, default: int) -> int:
    return int(value) if _real(value) else default


# -- TensorBoard event files ---------------------------------------------------------------------------------------


def _tensorboard_run(files: list[Path], folder: str, rank: str, notes: list[str]) -> Run | None:
    """A run from one rank's event files (a file per process that wrote there, read in name order: a later file's
    step wins); None when they hold no loss."""
    records: dict[int, dict[str, Any]] = {}
    read: list[str] = []
    for path in sorted(files):
        try:
            scalars = read_scalars(path)
        except Exception as exc:  # a foreign or damaged file: noted, the others read
            notes.append(f"skipped {path}: {exc}")
            continue
        read.append(str(path))
        for tag, points in scalars.items():
            if tag not in _SCALARS:
                continue
            for step, (wall_time, value) in points.items():
                record = records.setdefault(step, {"type": "step", "step": step})
                record[tag] = _as_written(value)
                record["time"] = wall_time
    if not any(_LOSS in record for record in records.values()):
        if read:
            notes.append(f"skipped {Path(read[0]).parent}: no loss in its event files")
        return None
    run = Run(label="", files=read, project=folder, run=folder, rank=rank)
    for step in sorted(records):
        if 0 <= step <= MAX_STEPS:
            add_record(run, records[step])
    return run if run.steps["step"] else None


def _as_written(value: float) -> float | str:
    """A value as JSON Lines writes it: non-finite numbers as "NaN", "Inf", "-Inf"."""
    if math.isnan(value):
        return "NaN"
    if math.isinf(value):
        return "Inf" if value > 0 else "-Inf"
    return value


def read_scalars(path: Path) -> dict[str, dict[int, tuple[float, float]]]:
    """tag -> step -> (wall time, value) of an event file's scalars (the summary values with a `simple_value`, which
    are what TensorBoard's EventAccumulator calls scalars). The file must be a regular file reached without a
    symlink, and its records are read through the descriptor that was checked: TensorBoard's readers take a path
    and open it again, and whoever can write a swept directory could put a link to a FIFO at the name in between
    and hang the triage for ever. The Event message and its checksum come from `tensorboard` where it is
    installed, else from tensorboardX (`backend: tensorboard`'s library, which has no reader of its own)."""
    # O_NOFOLLOW and a regular file only: a link planted at the name is refused, a FIFO never opened.
    with os.fdopen(open_regular(path, os.O_RDONLY), "rb") as handle:
        try:
            from tensorboard.compat.proto.event_pb2 import Event
            from tensorboard.compat.tensorflow_stub.pywrap_tensorflow import masked_crc32c
        except ImportError:
            return _scalars_with_tensorboardx(handle)
        return _scalars_of(handle, Event, masked_crc32c)


def _scalars_with_tensorboardx(handle: Any) -> dict[str, dict[int, tuple[float, float]]]:
    try:
        from tensorboardX.proto.event_pb2 import Event
        from tensorboardX.record_writer import masked_crc32c
    except ImportError:
        raise ReportError("neither tensorboard nor tensorboardX is installed to read it") from None
    return _scalars_of(handle, Event, masked_crc32c)


def _scalars_of(handle: Any, event_type: Any, crc: Callable[[bytes], int]) -> dict[str, dict[int, tuple[float, float]]]:
    found: dict[str, dict[int, tuple[float, float]]] = {}
    for data in _records(handle, crc):
        event = event_type.FromString(data)
        for value in event.summary.value:
            if value.WhichOneof("value") == "simple_value":
                found.setdefault(value.tag, {})[int(event.step)] = (float(event.wall_time), float(value.simple_value))
    return found


def _records(handle: Any, crc: Callable[[bytes], int]) -> Iterator[bytes]:
    """The TFRecords of an event file (length, its masked CRC-32C, the data, its masked CRC-32C), up to the first
    torn or damaged one (a writer killed mid-record leaves one at the end)."""
    while len(header := handle.read(12)) == 12:
        length_bytes, (length_crc,) = header[:8], struct.unpack("<I", header[8:])
        if int(crc(length_bytes)) != length_crc:
            return
        (length,) = struct.unpack("<Q", length_bytes)
        data = handle.read(length)
        footer = handle.read(4)
        if len(data) != length or len(footer) != 4 or int(crc(data)) != struct.unpack("<I", footer)[0]:
            return
        yield data


# -- the rules -----------------------------------------------------------------------------------------------------


def judge(found: list[Found], rules: Rules | None = None) -> list[Verdict]:
    """Each run against its siblings (every other run found), in the order found."""
    rules = rules or Rules()
    names = [f.name for f in found]
    verdicts = []
    for f in found:
        facts = summary(f.run, rules.hang)
        final, count = _final_loss(f.run, rules.window)
        verdicts.append(
            Verdict(
                found=f,
                label=f.name if names.count(f.name) == 1 else f"{f.name} ({f.where})",
                steps=int(facts["steps"]),
                final_loss=final,
                window_steps=count,
                throughput=facts["throughput_p50"],
                unit=facts["throughput_unit"],
                swing=_swing(f.run, rules.window),
                swing_steps=min(len(f.run.steps[_LOSS]), rules.window),
            )
        )
    newest = max((f.latest for f in found if f.latest is not None), default=None)
    for index, verdict in enumerate(verdicts):
        others = verdicts[:index] + verdicts[index + 1 :]
        stalled = _stalled(verdict, others, newest, rules)
        for flag, reason in (
            *_failed(verdict, others, bool(stalled), rules),
            *(("stalled", reason) for reason in stalled),
            *_unstable(verdict, others),
            *_slow(verdict, others, rules),
        ):
            verdict.flags.setdefault(flag, []).append(reason)
        verdict.flags = {flag: verdict.flags[flag] for flag in FLAGS if flag in verdict.flags}
    return verdicts


def _final_loss(run: Run, window: int) -> tuple[float | str | None, int]:
    if isinstance(run.last_loss, str):
        return run.last_loss, 0
    losses = [v for v in run.steps[_LOSS][-window:] if v is not None]
    return (statistics.fmean(losses), len(losses)) if losses else (None, 0)


def _swing(run: Run, window: int) -> float | None:
    """How much the loss moves about its trend over the last `window` steps, as a share of its level: the standard
    deviation of its residuals about the least-squares line, over the mean's magnitude. A falling loss is no swing;
    None without MIN_WINDOW_POINTS losses or with a non-finite one in the window."""
    losses = run.steps[_LOSS][-window:]
    if len(losses) < MIN_WINDOW_POINTS or any(v is None for v in losses):
        return None
    values = [float(v) for v in losses]
    n = len(values)
    mean_x, mean_y = (n - 1) / 2, statistics.fmean(values)
    spread = sum((x - mean_x) ** 2 for x in range(n))
    slope = sum((x - mean_x) * (y - mean_y) for x, y in enumerate(values)) / spread
    residuals = [y - (mean_y + slope * (x - mean_x)) for x, y in enumerate(values)]
    level = abs(mean_y)
    if level < 1e-12:
        return None
    return math.sqrt(sum(r * r for r in residuals) / n) / level


def _median_of(values: list[float]) -> float | None:
    return statistics.median(values) if len(values) >= MIN_SIBLINGS else None


def _last_time(run: Run) -> float | None:
    return next((t for t in reversed(run.steps["time"]) if t is not None), None)


def _short(verdict: Verdict, others: list[Verdict]) -> tuple[bool, float | None]:
    """Whether the run's last step is under SHORT_SHARE of the other runs' median last step (and that median)."""
    median = _median_of([float(o.steps) for o in others])
    return (median is not None and verdict.steps < SHORT_SHARE * median), median


def _stalled(verdict: Verdict, others: list[Verdict], newest: float | None, rules: Rules) -> list[str]:
    """No end recorded, and no step for longer than the run's hang deadline before the newest time any run's files
    show (its own included: a file still written after its steps stopped). TensorBoard files record no end: a run
    read from them alone is judged only when it is short of its siblings."""
    found = verdict.found
    last = _last_time(found.run)
    if found.ended or newest is None or last is None:
        return []
    if found.ended is None and not _short(verdict, others)[0]:
        return []
    idle = newest - last
    deadline = deadline_after(found.run, rules.hang)
    if idle <= deadline:
        return []
    own = found.latest is not None and found.latest - last > deadline
    whose = "its own files went on being written" if own else "other runs' files went on being written"
    no_end = "no end recorded" if found.ended is False else "TensorBoard files record no end"
    return [
        f"no step after step {verdict.steps} for {idle:,.0f} s (its hang deadline: {deadline:,.0f} s) while "
        f"{whose}; {no_end}"
    ]


def _failed(verdict: Verdict, others: list[Verdict], stalled: bool, rules: Rules) -> Iterator[tuple[str, str]]:
    found = verdict.found
    if found.nonfinite:
        records = len(found.run.steps["step"])
        last = f"; the last loss is {found.run.last_loss}" if isinstance(found.run.last_loss, str) else ""
        yield (
            "failed",
            f"non-finite loss at {len(found.nonfinite)} of {records} steps, first at step {found.nonfinite[0]}{last}",
        )
    if (found.ended or stalled) and not found.on_purpose:  # a run still going, or stopped on purpose, did not fail
        how = f" ({found.end})" if found.end.startswith("signal") else ""
        if found.planned is not None:
            if verdict.steps < found.planned:
                yield "failed", f"stopped at step {verdict.steps} of the {found.planned} planned{how}"
        else:
            short, median = _short(verdict, others)
            if short:
                yield (
                    "failed",
                    f"stopped at step {verdict.steps}, under {SHORT_SHARE:.0%} of the other runs' median last step "
                    f"({median:g}; no planned total recorded){how}",
                )
    final = verdict.final_loss
    if rules.loss_above is not None and isinstance(final, float) and final > rules.loss_above:
        yield (
            "failed",
            f"final loss {final:.4g} (the mean of the last {verdict.window_steps} steps) above {rules.loss_above:g}",
        )


def _unstable(verdict: Verdict, others: list[Verdict]) -> Iterator[tuple[str, str]]:
    median = _median_of([o.swing for o in others if o.swing is not None])
    swing = verdict.swing
    if swing is None or median is None:
        return
    if swing > UNSTABLE_FACTOR * median and swing > UNSTABLE_FLOOR:
        times = f"{swing / median:.1f}x" if median > 0 else "far above"
        yield (
            "unstable",
            f"the loss over its last {verdict.swing_steps} steps swings "
            f"{swing:.3f} of its level, {times} the other runs' median {median:.3f} "
            f"(flagged above {UNSTABLE_FACTOR:g}x and {UNSTABLE_FLOOR:g})",
        )


def _slow(verdict: Verdict, others: list[Verdict], rules: Rules) -> Iterator[tuple[str, str]]:
    rate = verdict.throughput
    median = _median_of([o.throughput for o in others if o.throughput is not None and o.unit == verdict.unit])
    if rate is None or median is None or not median > 0:
        return
    if rate < rules.slow_below * median:
        yield (
            "slow",
            f"{rate:.4g} {verdict.unit} (its median), {rate / median:.2f}x the other runs' median {median:.4g} "
            f"(flagged below {rules.slow_below:g}x)",
        )


# -- output -----------------------------------------------------------------------------------------------------


def _loss_text(value: float | str | None) -> str:
    if value is None:
        return "-"
    return value if isinstance(value, str) else f"{value:.4g}"


def _rate_text(verdict: Verdict) -> str:
    if verdict.throughput is None:
        return "-"
    rate = verdict.throughput
    text = f"{rate:,.0f}" if rate >= 100 else f"{rate:.3g}"
    return text + ("" if verdict.unit == "tokens/s" else f" {verdict.unit}")


def _flags_text(verdict: Verdict) -> str:
    if not verdict.flags:
        return "-"
    return "; ".join(f"{flag}: {reason}" for flag, reasons in verdict.flags.items() for reason in reasons)


def render_table(verdicts: list[Verdict]) -> str:
    """The terminal table: one line per run, the flags with their reasons in the last column, then a count."""
    if not verdicts:
        return "no runs found (JSON Lines files of backend: local, or TensorBoard event files of backend: tensorboard)"
    head = ("run", "steps", "final loss", "tokens/s", "flags")
    rows = [(v.label, str(v.steps), _loss_text(v.final_loss), _rate_text(v), _flags_text(v)) for v in verdicts]
    widths = [max(len(row[i]) for row in (head, *rows)) for i in range(len(head) - 1)]

    def line(row: tuple[str, ...]) -> str:
        cells = [
            row[0].ljust(widths[0]),
            *(cell.rjust(width) for cell, width in zip_strict(row[1:-1], widths[1:])),
        ]
        return "  ".join([*cells, row[-1]])

    counts = {flag: sum(1 for v in verdicts if flag in v.flags) for flag in FLAGS}
    flagged = sum(1 for v in verdicts if v.flags)
    tally = ", ".join(f"{count} {flag}" for flag, count in counts.items() if count)
    total = f"{len(verdicts)} runs, {flagged} flagged" + (f" ({tally})" if tally else "")
    return "\n".join([line(head), *(line(row) for row in rows), total])


_FLAG_COLOURS = {"failed": "#e03131", "unstable": "#f08c00", "stalled": "#ae3ec9", "slow": "#1c7ed6"}


def render_html(verdicts: list[Verdict], notes: list[str], rules: Rules, dirs: list[str]) -> str:
    """One self-contained page (no script, no fetch): the report page's style, the table with each run's loss
    drawn small (the window shaded, non-finite steps marked), the rules as applied, the notes."""
    template = (resources.files("ms_exporter.endpoint") / "web_assets" / "report.html").read_text(encoding="utf-8")
    style = template[template.index("<style>") : template.index("</style>") + len("</style>")]
    extra = (
        "<style>\n  td.flags { text-align: left; white-space: normal; min-width: 24em; }\n"
        "  td.where, th.left { text-align: left; }\n  .flag { font-weight: 600; }\n  svg { display: block; }\n"
        "  ul { margin: 6px 0; }\n  section.text { margin: 10px 14px; }\n</style>"
    )
    rows = []
    for v in verdicts:
        flags = (
            "<br>".join(
                f'<span class="flag" style="color:{_FLAG_COLOURS[flag]}">{flag}</span>: {html.escape(reason)}'
                for flag, reasons in v.flags.items()
                for reason in reasons
            )
            or "-"
        )
        final = _loss_text(v.final_loss)
        final = f'<span class="bad">{final}</span>' if isinstance(v.final_loss, str) else final
        notes_of = "".join(f"<br><span class='muted'>{html.escape(n)}</span>" for n in v.found.notes)
        rows.append(
            "<tr>"
            f"<td>{html.escape(v.label)}</td>"
            f"<td class='where'>{html.escape(str(v.found.where))}<br><span class='muted'>"
            f"{html.escape(', '.join(v.found.sources))}; rank {html.escape(', '.join(v.found.ranks))}"
            f"{'; ' + html.escape(v.found.end) if v.found.end else ''}</span>{notes_of}</td>"
            f"<td>{v.steps}</td><td>{final}</td><td>{html.escape(_rate_text(v))}</td>"
            f"<td>{_sparkline(v.found.run, rules.window)}</td><td class='flags'>{flags}</td>"
            "</tr>"
        )
    head = "".join(
        f"<th class='left'>{h}</th>" if h in ("where", "loss", "flags") else f"<th>{h}</th>"
        for h in ("run", "where", "steps", "final loss", "tokens/s", "loss", "flags")
    )
    table = f"<table><tr>{head}</tr>{''.join(rows)}</table>" if rows else "<p>No runs found.</p>"
    loss_above = f"{rules.loss_above:g}" if rules.loss_above is not None else "not given"
    rule_items = [
        f"failed: a non-finite loss; stopped before its planned total (else under {SHORT_SHARE:.0%} of the other "
        f"runs' median last step) after an end or a stall; the final loss (the mean of the last {rules.window} steps) "
        f"above --loss-above ({loss_above})",
        f"unstable: the loss's swing about its trend over the last {rules.window} steps above {UNSTABLE_FACTOR:g}x "
        f"the other runs' median swing and above {UNSTABLE_FLOOR:g} of its level",
        "stalled: no end recorded and no step for longer than the run's hang deadline (at least "
        f"{rules.hang.min_seconds:g} s) before the newest time any run's files show",
        f"slow: the median throughput under {rules.slow_below:g}x the other runs' median",
        f"a rule that compares with the other runs needs {MIN_SIBLINGS} of them that have the quantity",
    ]
    flagged = sum(1 for v in verdicts if v.flags)
    return (
        '<!DOCTYPE html>\n<html lang="en">\n<head>\n<meta charset="utf-8">\n'
        '<meta name="viewport" content="width=device-width, initial-scale=1">\n'
        f"<title>ms_exporter triage: {html.escape(', '.join(dirs))}</title>\n{style}\n{extra}\n</head>\n<body>\n"
        f"<header><h1>ms_exporter triage</h1><div class='muted'>{len(verdicts)} runs under "
        f"{html.escape(', '.join(dirs))}, {flagged} flagged</div></header>\n"
        f"<div class='table'>{table}</div>\n"
        f"<section class='text'><h2>Rules</h2><ul>{''.join(f'<li>{html.escape(r)}</li>' for r in rule_items)}</ul>"
        + (f"<h2>Notes</h2><ul>{''.join(f'<li>{html.escape(n)}</li>' for n in notes)}</ul>" if notes else "")
        + "</section>\n</body>\n</html>\n"
    )


def _sparkline(run: Run, window: int, width: int = 220, height: int = 40) -> str:
    """The run's loss as an inline SVG line: the last `window` steps shaded, non-finite steps as red ticks."""
    steps = run.steps["step"]
    points = [(s, v) for s, v in zip_strict(steps, run.steps[_LOSS]) if v is not None]
    if not steps:
        return "-"
    first, last = int(steps[0]), int(steps[-1])
    span = max(last - first, 1)

    def x(step: int) -> float:
        return 1.0 + (width - 2) * float(step - first) / span

    shade = x(steps[-min(window, len(steps))])
    parts = [f'<rect x="{shade:.1f}" y="0" width="{width - shade:.1f}" height="{height}" fill="#8884"/>']
    if points:
        stride = max(1, len(points) // 400)
        shown = points[::stride]
        # From 0 (or the lowest loss, when below): a loss that wobbles by 1% of its level draws nearly flat, one that
        # jumps to ten times its level does not; each run's own scale would draw both alike.
        low, high = min(0.0, *(v for _, v in shown)), max(v for _, v in shown)
        scale = (height - 4) / (high - low) if high > low else 0.0
        line = " ".join(f"{x(s):.1f},{height - 2 - (v - low) * scale:.1f}" for s, v in shown)
        parts.append(f'<polyline points="{line}" fill="none" stroke="#1c7ed6" stroke-width="1"/>')
    bad = sorted(set(run.nonfinite_steps))[:: max(1, len(run.nonfinite_steps) // 200)]
    parts.extend(
        f'<line x1="{x(s):.1f}" x2="{x(s):.1f}" y1="{height - 6}" y2="{height}" stroke="#e03131"/>' for s in bad
    )
    return f'<svg width="{width}" height="{height}" role="img" aria-label="loss">{"".join(parts)}</svg>'
