"""Which rank, and where: a real 3-worker msrun job whose rank 1 data iterator blocks at step ~150.

Ranks 0 and 2 then wait for rank 1 in the gradient all-reduce (phase `step`) while rank 1 waits in its data
iterator (phase `data_wait`). Checked live and afterwards: the phases, rank 1's stack dump, `ms-exporter hangs`
over the endpoints and over the save_dirs, and a real Prometheus with the rules firing MindSporeTrainingHang for
rank 1 only. On CPU the collective gives up about 30 s after the block and msrun ends the job: the verdict must
come before that (hang.min_seconds 3 here; steps take 0.1-0.3 s).
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

from ms_exporter.features.watchdog import NATIVE_TIMEOUT
from tests.support.distributed import distributed_job
from tests.support.scrape import scrape
from tests.support.waiting import wait_until

pytestmark = pytest.mark.integration
ROOT = Path(__file__).resolve().parents[2]
WORKERS = 3


def phases(port: int) -> dict[str, tuple[str, float, float]]:
    """rank -> (phase, seconds in it, its hang deadline), straight from each rank's endpoint."""
    found = {}
    for rank in range(WORKERS):
        page = scrape(f"http://127.0.0.1:{port + rank}/metrics")
        (phase,) = [
            labels["phase"]
            for labels in page.labels_of("mindspore_train_phase")
            if page.value("mindspore_train_phase", phase=labels["phase"]) == 1
        ]
        found[str(rank)] = (
            phase,
            page.value("mindspore_train_phase_seconds"),
            page.value("mindspore_train_hang_deadline_seconds"),
        )
    return found


def hangs(*targets: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "ms_exporter", "hangs", *targets],
        capture_output=True,
        text=True,
        check=False,
        cwd=ROOT,
        timeout=60,
    )


def py_spy_may_read_processes() -> bool:
    """Whether py-spy may attach to another process of this user here (ptrace permitted)."""
    sleeper = subprocess.Popen(
        [sys.executable, "-c", "import time; print('ready', flush=True); time.sleep(60)"],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert sleeper.stdout is not None and sleeper.stdout.readline() == "ready\n"  # its interpreter is up
        spy = Path(sys.executable).parent / "py-spy"
        return (
            subprocess.run(
                [str(spy), "dump", "--pid", str(sleeper.pid)], capture_output=True, timeout=60, check=False
            ).returncode
            == 0
        )
    finally:
        sleeper.kill()
        sleeper.wait()


def test_the_rank_whose_data_iterator_blocks_is_named_live_and_afterwards(tmp_path: Path) -> None:
    saves = tmp_path / "save"
    with distributed_job(
        tmp_path,
        "--epochs",
        "50",
        "--block-rank",
        "1",
        "--block-after",
        "2400",
        "--hang-min-seconds",
        "3",
        "--save-dir",
        str(saves),
        workers=WORKERS,
        project="hang",
        scrape_interval="5s",
    ) as job:
        base_port = job.base_port
        endpoints = [f"127.0.0.1:{base_port + rank}" for rank in range(WORKERS)]
        blocked_at = float(
            wait_until(
                lambda: (saves / "blocked-at").exists() and (saves / "blocked-at").read_text(),
                300,
                "rank 1's data loader to block",
            )
        )

        # Live: rank 1 waits in its data iterator, ranks 0 and 2 inside their step, in the all-reduce. The deadline
        # is the one rank 1 serves: 3 s (hang.min_seconds), or more where a loaded machine's steps made it so.
        seen: list[dict[str, tuple[str, float, float]]] = []

        def hung() -> dict[str, tuple[str, float, float]] | None:
            now = phases(base_port)
            seen.append(now)
            phase, seconds, deadline = now["1"]
            return now if phase == "data_wait" and seconds > deadline and now["0"][0] == now["2"][0] == "step" else None

        try:
            wait_until(hung, 25, "rank 1 in data_wait past its deadline, ranks 0 and 2 in step")
        except AssertionError as exc:
            raise AssertionError(f"{exc}; last read (phase, seconds, deadline) by rank: {seen[-1:]}") from None
        # The goodput ledger books the wait past the deadline as stalled (docs/goodput.md).
        stuck = scrape(f"http://127.0.0.1:{base_port + 1}/metrics")
        assert stuck.value("mindspore_train_time_seconds_total", bucket="stalled") > 0
        live = hangs(*endpoints)
        assert live.returncode == 1, live.stdout + live.stderr
        assert "project hang: rank 1 never arrived: in data_wait while 2 rank(s) are in step" in live.stdout
        firing = wait_until(
            lambda: job.query('ALERTS{alertname="MindSporeTrainingHang", alertstate="firing"}'),
            25,
            "MindSporeTrainingHang",
        )
        assert [(a["metric"]["rank"], a["metric"]["phase"], a["metric"]["verdict"]) for a in firing] == [
            ("1", "data_wait", "never arrived")
        ]
        seconds = time.time() - blocked_at
        print(f"\nMindSporeTrainingHang firing {seconds:.1f} s after rank 1's data loader blocked")
        # The suspicion is published before the dump is written: py-spy may take seconds to read native stacks on
        # a loaded machine, so the page can come first.
        (dump,) = wait_until(
            lambda: list((saves / "rank1").glob("hang-rank1-*.txt")), NATIVE_TIMEOUT + 10, "rank 1's stack dump"
        )
        text = dump.read_text()
        assert text.splitlines()[1].startswith("phase: data_wait for ")
        assert "in __getitem__" in text and "self._never.wait()" in text  # the blocked loader's frame
        assert re.search(r"training thread top frame: .*mindspore.*", text), text.splitlines()[2]
        # py-spy is among the test dependencies: the dump has native frames where the machine lets it read them.
        if py_spy_may_read_processes():
            assert text.splitlines()[3] == "stacks: Python frames, and native frames from py-spy below"
            native = text.split("py-spy dump --native:\n", 1)[1]
            assert "__getitem__" in native and "(libc" in native, native[:2000]
        else:
            assert text.splitlines()[3].startswith("stacks: Python frames only (py-spy could not read")
    # Afterwards, from what the ranks left in their save_dirs.
    later = hangs(*(str(saves / f"rank{rank}") for rank in range(WORKERS)))
    assert "project hang: rank 1 never arrived: in data_wait" in later.stdout, later.stdout + later.stderr


# The healthy run's slow parts: a ModelCheckpoint save every 50 steps, a checkpoint-like callback (named in
# hang.checkpoint_callbacks) that holds every rank for PAUSE_SECONDS every PAUSE_EVERY steps, an evaluation every
# 5 epochs. hang.min_seconds is set under the
# pause, so a pause counted as data wait or step would page. `make hangs-healthy` runs the same for 10+ minutes.
# 21 steps an epoch: 8 epochs hold one pause and one evaluation (make hangs-healthy runs 70: 9 pauses). Not fewer: the
# learned deadline is refreshed every 16 step cycles, and from 112 cycles on its 99th percentile is the second-longest
# cycle, not the longest. The pause is 45 s: the learned step deadline must stay under it for the test to mean
# anything, and the slow first cycles (the first collective waits for the slowest rank's compile, an evaluation
# compiles) lift that deadline above hang.min_seconds on a busy machine: 24-34 s seen on 2 cores after 100 cycles.
HEALTHY_EPOCHS = int(os.environ.get("HANGS_HEALTHY_EPOCHS", "8"))
PAUSE_EVERY, MIN_SECONDS, PAUSE_SECONDS = 150, 20, 45


# Long (make test-long; make hangs-healthy for 10+ minutes): the suite's short version is test_training's checkpoint
# and callbacks phases, test_alerting's quiet healthy run and the hang-deadline unit tests.
@pytest.mark.long
def test_a_healthy_run_with_checkpoints_pauses_and_evaluations_pages_nothing(tmp_path: Path) -> None:
    saves = tmp_path / "save"
    steps = HEALTHY_EPOCHS * 21
    with distributed_job(
        tmp_path,
        "--epochs",
        str(HEALTHY_EPOCHS),
        "--checkpoint-every",
        "50",
        "--pause-every",
        str(PAUSE_EVERY),
        "--pause-seconds",
        str(PAUSE_SECONDS),
        "--eval-every",
        "5",
        "--hang-min-seconds",
        str(MIN_SECONDS),
        "--save-dir",
        str(saves),
        workers=WORKERS,
        project="healthy",
        scrape_interval="5s",
    ) as job:
        began = time.time()
        ended = 'mindspore_train_phase{project="healthy", phase="ended"} == 1'
        wait_until(
            lambda: len(job.query(ended)) == WORKERS,
            60 + steps * 3 + 2 * PAUSE_SECONDS * steps // PAUSE_EVERY,
            "every rank to end its training",
        )
        minutes = (time.time() - began) / 60
        time.sleep(10)  # one more scrape and rule evaluation after the end
        window = f"[{int(time.time() - began) + 60}s]"
        final = job.by_rank('mindspore_train_global_step{project="healthy"}')
        assert final == {str(rank): steps for rank in range(WORKERS)}
        # Nothing took the slow parts for a hang: no alert ever pending, no suspicion, no dump...
        hang_alerts = job.query(f'count_over_time(ALERTS{{alertname=~"MindSporeTraining(Hang|Stalled)"}}{window})')
        assert hang_alerts == [], hang_alerts
        assert set(job.by_rank(f"max_over_time(mindspore_train_hang_suspected{window})").values()) == {0.0}
        assert set(job.by_rank("mindspore_train_hang_dumps_total").values()) == {0.0}
        # The goodput ledger agrees: the pauses are checkpoint time, none of it stalled.
        assert set(job.by_rank('mindspore_train_time_seconds_total{bucket="stalled"}').values()) == {0.0}
        assert min(job.by_rank('mindspore_train_time_seconds_total{bucket="checkpoint"}').values()) > PAUSE_SECONDS
        # ...though each rank was held longer than its step deadline, in the checkpoint phase.
        held = job.by_rank(
            f"max_over_time((mindspore_train_phase_seconds and on (instance) "
            f'mindspore_train_phase{{phase="checkpoint"}} == 1){window[:-1]}:5s])'
        )
        assert len(held) == WORKERS and min(held.values()) > MIN_SECONDS, held
        # The learned step deadline went under the pause: the pause would have paged had it been taken for a step.
        lowest = job.by_rank(f"min_over_time(mindspore_train_hang_deadline_seconds{window})")
        assert set(lowest) == set(held) and min(lowest.values()) >= MIN_SECONDS, lowest
        assert max(lowest.values()) < PAUSE_SECONDS, lowest
        assert set(job.by_rank('mindspore_train_eval_metric{name="accuracy"}')) == {"0", "1", "2"}
    assert list(saves.rglob("hang-*.txt")) == []
    for rank in range(WORKERS):
        assert list((saves / f"rank{rank}" / "ckpt").glob("demo-*.ckpt")), f"rank {rank} saved no checkpoint"
    print(
        f"\nhealthy 3-rank run of {minutes:.1f} minutes, {steps} steps, pauses of {PAUSE_SECONDS} s every "
        f"{PAUSE_EVERY} steps: no hang alert, no dump"
    )
