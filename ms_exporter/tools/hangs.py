"""`ms-exporter hangs`: where each rank is and for how long, and the job's verdict: which rank the others wait for.

The verdict is MindSporeTrainingHang's rule (ms_exporter/generate/alerts/hangs.py), in Python: the ranks past their
hang deadline that are in a phase fewer of their project's ranks are in (the ranks that never reached the
collective the others wait in); on a tie, the ones not in `step`, where the collective is; every rank when all the
project's ranks are in one phase and every one is past its deadline. Ranks that ended are left out, and a rank in
`step` does not count as stopped while another rank of its project is in another phase within that phase's
deadline (it waits in the collective for a rank that is still busy, a long checkpoint save on rank 0, say).
"""

from __future__ import annotations

import argparse
import math
import os
import re
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ms_exporter.core import catalogue
from ms_exporter.core.files import safe_files
from ms_exporter.tools.rank_samples import parse_ranks
from ms_exporter.tools.scrape import Access, FetchError, beside, fetch
from ms_exporter.tools.targets import expand_targets, parse_target_argument

DUMP_GLOB = "hang-rank*-*.txt"
# What of a dump is read: its first lines say where the rank was (render_dump); the stacks after them can be
# megabytes (a 1 GB file took 2.1 GB of memory when read whole).
DUMP_HEAD_BYTES = 64 * 1024
# The first lines of a dump (ms_exporter/features/watchdog.py render_dump).
_HEADER = re.compile(
    r"^ms_exporter hang dump: rank (?P<rank>\d+) of project (?P<project>.*), pid (?P<pid>\d+), "
    r"(?P<time>\S+)$"
)
_PHASE = re.compile(r"^phase: (?P<phase>\w+) for (?P<seconds>[\d.]+) s(?: \(deadline (?P<deadline>[\d.]+) s\))?$")
_TOP = re.compile(r"^training thread top frame: (?P<frame>.*)$")


@dataclass(frozen=True)
class RankState:
    project: str
    rank: str
    phase: str | None
    seconds: float | None  # in the current phase
    deadline: float | None
    top_frame: str | None = None
    source: str = ""
    error: str | None = None  # an endpoint that gave no page
    dumped: bool = False  # read from a hang dump: written because the phase was past its deadline

    @property
    def stopped(self) -> bool:
        """Past its hang deadline (the condition of MindSporeTrainingStalled)."""
        if self.dumped:
            return True
        return (
            self.phase not in (None, catalogue.ENDED)
            and self.seconds is not None
            and self.deadline is not None
            and self.seconds > self.deadline
        )


@dataclass(frozen=True)
class Verdict:
    project: str
    culprits: tuple[RankState, ...]
    waiting: tuple[RankState, ...]  # the project's other ranks (not ended)
    all_same_phase: bool

    def text(self) -> str:
        if not self.culprits and not self.waiting:
            return f"project {self.project}: no rank is past its hang deadline"
        if not self.culprits:
            stopped = ", ".join(f"rank {r.rank}" for r in self.waiting if r.stopped)
            if len({r.phase for r in self.waiting}) == 1:
                others = ", ".join(f"rank {r.rank}" for r in self.waiting if not r.stopped)
                return (
                    f"project {self.project}: {stopped} past the hang deadline in {self.waiting[0].phase}, "
                    f"{others} not yet: no verdict until every rank is past it or one is seen in another phase"
                )
            return (
                f"project {self.project}: {stopped or 'no rank'} past the hang deadline in the phase most "
                "ranks are in; the rank(s) in another phase are not past theirs yet"
            )
        names = ", ".join(f"rank {r.rank}" for r in self.culprits)
        if self.all_same_phase:
            return (
                f"project {self.project}: every stopped rank ({names}) is in {self.culprits[0].phase}: no rank "
                "stands out; look at what they share (a collective, the network, the storage)"
            )
        phases = ", ".join(sorted({r.phase or "?" for r in self.waiting}))
        return (
            f"project {self.project}: {names} never arrived: in {self.culprits[0].phase} while "
            f"{len(self.waiting)} rank(s) are in {phases}"
        )


def verdicts(ranks: Iterable[RankState]) -> list[Verdict]:
    """One verdict per project (MindSporeTrainingHang's rule)."""
    by_project: dict[str, list[RankState]] = {}
    for state in ranks:
        by_project.setdefault(state.project, []).append(state)
    found = []
    for project, states in sorted(by_project.items()):
        present = [s for s in states if s.phase is not None and s.phase != catalogue.ENDED]
        busy_elsewhere = any(s.phase != catalogue.STEP_PHASE and not s.stopped for s in present)
        stopped = [s for s in states if s.stopped and not (busy_elsewhere and s.phase == catalogue.STEP_PHASE)]
        weights: dict[str | None, float] = dict(Counter(s.phase for s in present))
        if catalogue.STEP_PHASE in weights:  # a tie goes against the ranks outside the collective
            weights[catalogue.STEP_PHASE] += 0.5
        if len(weights) <= 1:  # every rank in one phase: named when every one is past its deadline
            everyone = len(stopped) == len(present) > 0
            found.append(
                Verdict(
                    project,
                    tuple(stopped) if everyone else (),
                    tuple(present) if stopped and not everyone else (),
                    everyone,
                )
            )
            continue
        most = max(weights.values())
        culprits = tuple(s for s in stopped if weights[s.phase] < most)
        found.append(Verdict(project, culprits, tuple(s for s in present if s not in culprits), False))
    return found


# -- reading ranks -----------------------------------------------------------------------------------------------


def from_page(text: str, source: str, stacks: str | None = None) -> list[RankState]:
    """The ranks a /metrics page serves, with the top frame of a /debug/stacks dump when there is one."""
    top = _dump_fields(stacks)["top_frame"] if stacks else None
    states = []
    for (project, rank), samples in parse_ranks(text).items():
        phases = samples.by_label(catalogue.PHASE.name, "phase")
        phase = next((name for name, value in phases.items() if value == 1), None)
        deadline = samples.value(catalogue.HANG_DEADLINE.name)
        states.append(
            RankState(
                project,
                rank,
                phase,
                samples.value(catalogue.PHASE_SECONDS.name),
                deadline if deadline is not None and math.isfinite(deadline) else None,
                top,
                source,
            )
        )
    return states


def from_dump(path: Path) -> RankState:
    """A rank as its newest dump left it (after the process died); one that cannot be read says why."""
    try:
        text = _head(path, DUMP_HEAD_BYTES)
    except OSError as exc:  # a FIFO, device, directory or symlink (UnsafeFile, ELOOP), or gone meanwhile
        rank = path.name.split("-")[1].removeprefix("rank") if path.name.count("-") >= 2 else "?"
        return RankState(
            "?", rank or "?", None, None, None, source=str(path), error=f"cannot read the dump: {exc.strerror or exc}"
        )
    fields = _dump_fields(text)
    return RankState(
        fields["project"] or "?",
        fields["rank"] or "?",
        fields["phase"],
        fields["seconds"],
        fields["deadline"],
        fields["top_frame"],
        str(path),
        dumped=True,
    )


def _head(path: Path, limit: int) -> str:
    """The first `limit` bytes of the regular file `path`, without waiting (a FIFO is refused, not read)."""
    fd = safe_files.open_regular(path, os.O_RDONLY)
    try:
        chunks, size = [], 0
        while size < limit and (chunk := os.read(fd, limit - size)):
            chunks.append(chunk)
            size += len(chunk)
    finally:
        os.close(fd)
    return b"".join(chunks).decode("utf-8", errors="replace")


def _dump_fields(text: str) -> dict[str, Any]:
    fields: dict[str, Any] = dict.fromkeys(("project", "rank", "phase", "seconds", "deadline", "top_frame"))
    for line in text.splitlines()[:6]:
        if header := _HEADER.match(line):
            fields.update(project=header["project"], rank=header["rank"])
        elif phase := _PHASE.match(line):
            fields.update(
                phase=phase["phase"],
                seconds=float(phase["seconds"]),
                deadline=float(phase["deadline"]) if phase["deadline"] else None,
            )
        elif top := _TOP.match(line):
            fields["top_frame"] = top["frame"]
    return fields


def newest_dumps(directory: Path) -> list[Path]:
    """The newest dump of each rank in a save_dir (the UTC timestamp in the name sorts by time)."""
    newest: dict[str, Path] = {}
    for path in sorted(directory.glob(DUMP_GLOB)):
        newest[path.name.split("-")[1]] = path
    return list(newest.values())


def collect(
    targets: Sequence[str], access: Access, scheme: str = "http", fetcher: Callable[[str, Access], str] = fetch
) -> list[RankState]:
    """Every rank the targets name: live endpoints (a URL, host:port or a file_sd directory or file) and save_dirs
    (a directory holding hang dumps)."""
    states: list[RankState] = []
    specs = []
    for text in targets:
        path = Path(text)
        if path.is_dir() and any(path.glob(DUMP_GLOB)):
            states += [from_dump(dump) for dump in newest_dumps(path)]
        else:
            specs.append(parse_target_argument(text, scheme))
    for target in expand_targets(specs, scheme):
        if target.problem is not None:
            states.append(
                RankState(
                    target.project or "?", target.rank or "?", None, None, None, source=target.url, error=target.problem
                )
            )
            continue
        try:
            page = fetcher(target.url, access)
        except FetchError as exc:
            states.append(
                RankState(
                    target.project or "?", target.rank or "?", None, None, None, source=target.url, error=str(exc)
                )
            )
            continue
        try:
            stacks: str | None = fetcher(beside(target.url, "/debug/stacks"), access)
        except FetchError:  # 404 before any dump, or hang.debug_endpoint off
            stacks = None
        states += from_page(page, target.url, stacks)
    return states


def line(state: RankState) -> str:
    if state.error is not None:
        return f"rank {state.rank} (project {state.project}): no answer: {state.error}  [{state.source}]"
    seconds = f" for {state.seconds:.0f} s" if state.seconds is not None else ""
    deadline = f" (deadline {state.deadline:.0f} s)" if state.deadline is not None else ""
    mark = "  PAST DEADLINE" if state.stopped else ""
    top = f"  top: {state.top_frame}" if state.top_frame else ""
    return (
        f"rank {state.rank} (project {state.project}): {state.phase or 'no phase yet'}{seconds}{deadline}{mark}"
        f"{top}  [{state.source}]"
    )


def run_hangs(args: argparse.Namespace, error: Callable[[str], Any]) -> int:
    """`ms-exporter hangs`: exit 1 when a project has a rank past its hang deadline, else 0."""
    if not args.timeout > 0:
        error(f"--timeout must be a number of seconds > 0, not {args.timeout:g}")
    try:
        states = collect(args.targets, Access(timeout=args.timeout), args.scheme)
    except ValueError as exc:
        error(str(exc))
        return 2
    states.sort(key=lambda s: (s.project, int(s.rank) if s.rank.isdigit() else 1 << 30, s.source))
    for state in states:
        print(line(state))
    found = verdicts(states)
    for verdict in found:
        print(verdict.text())
    return 1 if any(verdict.culprits for verdict in found) else 0
