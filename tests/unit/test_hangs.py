"""`ms-exporter hangs`: the verdict on recorded phase states (the same cases as the MindSporeTrainingHang promtool
tests), reading dumps a watchdog wrote and pages ranks serve."""

from __future__ import annotations

import datetime
import os
import re
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from ms_exporter.core import catalogue
from ms_exporter.features.watchdog import render_dump
from ms_exporter.tools.hangs import RankState, collect, from_dump, newest_dumps, verdicts
from ms_exporter.tools.scrape import Access, FetchError

ROOT = Path(__file__).resolve().parents[2]


def state(rank: int, phase: str, seconds: float, deadline: float | None = 120.0, project: str = "demo") -> RankState:
    return RankState(project, str(rank), phase, seconds, deadline)


@pytest.mark.parametrize(
    ("ranks", "culprits", "all_same"),
    [
        # rank 1's data iterator blocks; ranks 0 and 2 wait for it in the all-reduce, inside their step
        ([state(0, "step", 180), state(1, "data_wait", 185), state(2, "step", 180)], ["1"], False),
        ([state(0, "step", 180), state(1, "step", 181)], ["0", "1"], True),  # no rank stands out
        # rank 1's last scrape predates the block: it still shows the step it was in then; no verdict until it is
        # seen where it is stuck
        ([state(0, "step", 125), state(1, "step", 0.0), state(2, "step", 124)], [], False),
        ([state(0, "step", 180), state(1, "data_wait", 180)], ["1"], False),  # a tie goes against the one outside step
        ([state(0, "step", 0.1), state(1, "data_wait", 0.05)], [], False),  # advancing
        ([state(0, "ended", 900, None), state(1, "ended", 900, None)], [], False),  # finished
        # the ranks are scraped a few seconds apart: rank 1 is seen past its deadline first, the others not yet, but
        # they say where they are (in step, waiting for it)
        ([state(0, "step", 2.0), state(1, "data_wait", 130), state(2, "step", 1.0)], ["1"], False),
        # ... and a rank of the waiting majority seen past its deadline first is not named
        ([state(0, "step", 125), state(1, "data_wait", 100), state(2, "step", 90)], [], False),
        # rank 0 alone saves a checkpoint within its deadline: the others, past theirs in the next all-reduce, are held
        ([state(0, "checkpoint", 300, 1800), state(1, "step", 299), state(2, "step", 299)], [], False),
        # ... until rank 0 is past its own
        ([state(0, "checkpoint", 1900, 1800), state(1, "step", 1899), state(2, "step", 1899)], ["0"], False),
        # only ranks in step are held: a rank stuck in data_wait is named while the others are busy in a callback
        (
            [state(0, "callbacks", 180, 1800), state(1, "data_wait", 180), state(2, "callbacks", 180, 1800)],
            ["1"],
            False,
        ),
    ],
)
def test_the_verdict_names_the_rank_the_job_waits_for(
    ranks: list[RankState], culprits: list[str], all_same: bool
) -> None:
    (verdict,) = verdicts(ranks)
    assert [r.rank for r in verdict.culprits] == culprits
    assert verdict.all_same_phase == all_same


def test_each_project_gets_its_own_verdict() -> None:
    found = verdicts(
        [
            state(0, "step", 200, project="a"),
            state(1, "data_wait", 200, project="a"),
            state(0, "step", 0.1, project="b"),
        ]
    )
    assert [(v.project, [r.rank for r in v.culprits]) for v in found] == [("a", ["1"]), ("b", [])]
    assert found[0].text() == "project a: rank 1 never arrived: in data_wait while 1 rank(s) are in step"
    assert found[1].text() == "project b: no rank is past its hang deadline"


def test_ranks_seen_past_the_deadline_before_the_others_give_no_verdict_yet() -> None:
    (verdict,) = verdicts([state(0, "step", 125), state(1, "step", 0.0), state(2, "step", 124)])
    assert verdict.text() == (
        "project demo: rank 0, rank 2 past the hang deadline in step, rank 1 not yet: no "
        "verdict until every rank is past it or one is seen in another phase"
    )


def test_ranks_held_by_a_busy_rank_are_said_to_be_waiting() -> None:
    (verdict,) = verdicts([state(0, "checkpoint", 300, 1800), state(1, "step", 299), state(2, "step", 299)])
    assert verdict.text() == (
        "project demo: rank 1, rank 2 past the hang deadline in the phase most ranks are in; "
        "the rank(s) in another phase are not past theirs yet"
    )


def write_dump(directory: Path, rank: int, phase: str, seconds: float, when: datetime.datetime) -> Path:
    path = directory / f"hang-rank{rank}-{when:%Y%m%dT%H%M%SZ}.txt"
    path.write_text(render_dump(rank, "demo", phase, seconds, 5.0, when, None, None))
    return path


def test_dumps_left_in_save_dirs_give_the_verdict_after_the_processes_died(tmp_path: Path) -> None:
    day = datetime.datetime(2026, 12, 1, 6, 0, tzinfo=datetime.timezone.utc)
    dirs = [tmp_path / f"rank{r}" for r in range(3)]
    for directory in dirs:
        directory.mkdir()
    write_dump(dirs[0], 0, "step", 6.0, day)
    write_dump(dirs[1], 1, "step", 3.0, day)  # an older episode of rank 1 ...
    newest = write_dump(dirs[1], 1, "data_wait", 6.5, day + datetime.timedelta(minutes=1))  # ... and the newest
    write_dump(dirs[2], 2, "step", 6.0, day)
    assert newest_dumps(dirs[1]) == [newest]
    read = from_dump(newest)
    assert (read.project, read.rank, read.phase, read.seconds, read.deadline) == ("demo", "1", "data_wait", 6.5, 5.0)
    # A dump is written past the deadline: it counts as stopped even where its figures round to the deadline.
    assert from_dump(write_dump(tmp_path, 7, "data_wait", 5.0, day)).stopped
    states = collect([str(d) for d in dirs], Access())
    (verdict,) = verdicts(states)
    assert [r.rank for r in verdict.culprits] == ["1"]
    done = subprocess.run(
        [sys.executable, "-m", "ms_exporter", "hangs", *map(str, dirs)],
        capture_output=True,
        text=True,
        check=False,
        cwd=ROOT,
    )
    assert done.returncode == 1, done.stderr
    lines = done.stdout.splitlines()
    assert lines[1].startswith("rank 1 (project demo): data_wait for 6 s (deadline 5 s)  PAST DEADLINE")
    assert lines[-1] == "project demo: rank 1 never arrived: in data_wait while 2 rank(s) are in step"


def test_live_endpoints_are_read_with_their_stacks(tmp_path: Path) -> None:
    def page(rank: int, phase: str, seconds: float) -> str:
        lines = [
            f'mindspore_train_phase{{phase="{p}",project="demo",rank="{rank}"}} {float(p == phase)}'
            for p in catalogue.PHASES
        ]
        lines += [
            f'mindspore_train_phase_seconds{{project="demo",rank="{rank}"}} {seconds}',
            f'mindspore_train_hang_deadline_seconds{{project="demo",rank="{rank}"}} 5.0',
        ]
        return "\n".join(lines) + "\n"

    dump = render_dump(
        1, "demo", "data_wait", 9.0, 5.0, datetime.datetime.now(datetime.timezone.utc), threading.get_ident(), None
    )

    def fetcher(url: str, access: Access) -> str:
        if url == "http://h:2/debug/stacks":
            return dump
        if url.endswith("/debug/stacks"):
            raise FetchError("HTTP 404 Not Found")
        if url == "http://h:3/metrics":
            raise FetchError("Connection refused")
        return page(1, "data_wait", 9.0) if url == "http://h:2/metrics" else page(0, "step", 8.0)

    states = collect(["h:1", "h:2", "h:3"], Access(), fetcher=fetcher)
    by_rank = {s.rank: s for s in states}
    # The dump named this thread as the training thread: its top frame was the dump's own stack walk.
    assert re.search(r"features/watchdog\.py:\d+ in python_stacks$", by_rank["1"].top_frame or "")
    assert by_rank["0"].phase == "step" and by_rank["0"].stopped and by_rank["0"].top_frame is None
    assert by_rank["?"].error == "Connection refused"
    (verdict,) = [v for v in verdicts(states) if v.project == "demo"]
    assert [r.rank for r in verdict.culprits] == ["1"]


def run_hangs(*targets: Path, limit_bytes: int | None = None) -> subprocess.CompletedProcess[str]:
    """`ms-exporter hangs` in a child with a deadline (a read that waits for a FIFO's writer would hang this test, not
    fail it), its address space capped at `limit_bytes` when given."""
    cap = (
        f"import resource; resource.setrlimit(resource.RLIMIT_AS, ({limit_bytes}, {limit_bytes}))\n"
        if limit_bytes
        else ""
    )
    code = cap + "import sys; from ms_exporter.cli import main; sys.exit(main(['hangs', *sys.argv[1:]]))"
    return subprocess.run(
        [sys.executable, "-c", code, *map(str, targets)],
        capture_output=True,
        text=True,
        check=False,
        cwd=ROOT,
        timeout=120,
    )


def test_hangs_refuses_a_dump_that_is_a_fifo_without_waiting(tmp_path: Path) -> None:
    day = datetime.datetime(2026, 12, 1, 6, 0, tzinfo=datetime.timezone.utc)
    os.mkfifo(tmp_path / "hang-rank0-20261201T060000Z.txt")  # nothing ever writes to it
    write_dump(tmp_path, 1, "data_wait", 6.5, day)
    done = run_hangs(tmp_path)
    assert "Traceback" not in done.stderr, done.stderr
    lines = done.stdout.splitlines()
    assert any(
        line.startswith("rank 0 (project ?): no answer: cannot read the dump: ") and "not a regular file" in line
        for line in lines
    ), lines
    assert any(line.startswith("rank 1 (project demo): data_wait for 6 s") for line in lines), lines


def test_hangs_reads_the_head_of_a_huge_dump_not_all_of_it(tmp_path: Path) -> None:
    """A 1 GB dump (sparse) is read in a process that may not hold 512 MB: only its first lines are read."""
    day = datetime.datetime(2026, 12, 1, 6, 0, tzinfo=datetime.timezone.utc)
    path = write_dump(tmp_path, 3, "checkpoint", 1900.0, day)
    with path.open("r+b") as dump:
        dump.truncate(1024 * 1024 * 1024)
    done = run_hangs(tmp_path, limit_bytes=512 * 1024 * 1024)
    assert done.returncode == 1 and "Traceback" not in done.stderr, done.stderr
    assert done.stdout.splitlines()[0].startswith("rank 3 (project demo): checkpoint for 1900 s"), done.stdout
