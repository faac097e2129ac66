"""Which rank, and where: a real 3-worker msrun job whose rank 1 data iterator blocks at step ~150.

Ranks 0 and 2 then wait for rank 1 in the gradient all-reduce (phase `step`) while rank 1 waits in its data
iterator (phase `data_wait`). Checked live and afterwards: the phases, rank 1's stack dump, `ms-exporter hangs`
over the endpoints and over the save_dirs, and a real Prometheus with the rules firing MindSporeTrainingHang for
rank 1 only. On CPU the collective gives up about 30 s after the block and msrun ends the job: the verdict must
come before that (hang.min_seconds 3 here; steps take 0.1-0.3 s).
"""

from __future__ import annotations

import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.integration.test_distributed import distributed_job
from tests.scrape import scrape
from tests.waiting import wait_until

pytestmark = pytest.mark.integration
ROOT = Path(__file__).resolve().parents[2]
WORKERS = 3


def phases(port: int) -> dict[str, tuple[str, float]]:
    """rank -> (phase, seconds in it), straight from each rank's endpoint."""
    found = {}
    for rank in range(WORKERS):
        page = scrape(f"http://127.0.0.1:{port + rank}/metrics")
        (phase,) = [labels["phase"] for labels in page.labels_of("mindspore_train_phase")
                    if page.value("mindspore_train_phase", phase=labels["phase"]) == 1]
        found[str(rank)] = (phase, page.value("mindspore_train_phase_seconds"))
    return found


def hangs(*targets: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "ms_exporter", "hangs", *targets], capture_output=True, text=True,
                          check=False, cwd=ROOT, timeout=60)


def test_the_rank_whose_data_iterator_blocks_is_named_live_and_afterwards(tmp_path: Path) -> None:
    saves = tmp_path / "save"
    with distributed_job(tmp_path, "--epochs", "50", "--block-rank", "1", "--block-after", "2400",
                         "--hang-min-seconds", "3", "--save-dir", str(saves), workers=WORKERS, project="hang",
                         scrape_interval="5s") as job:
        base_port = job.base_port
        endpoints = [f"127.0.0.1:{base_port + rank}" for rank in range(WORKERS)]
        blocked_at = float(wait_until(lambda: (saves / "blocked-at").exists() and (saves / "blocked-at").read_text(),
                                      300, "rank 1's data loader to block"))
        # Live: rank 1 waits in its data iterator, ranks 0 and 2 inside their step, in the all-reduce.
        def hung() -> dict[str, tuple[str, float]] | None:
            now = phases(base_port)
            return now if now["1"][0] == "data_wait" and now["1"][1] > 3 and now["0"][0] == now["2"][0] == "step" \
                else None

        wait_until(hung, 20, "rank 1 in data_wait past its deadline, ranks 0 and 2 in step")
        live = hangs(*endpoints)
        assert live.returncode == 1, live.stdout + live.stderr
        assert "project hang: rank 1 never arrived: in data_wait while 2 rank(s) are in step" in live.stdout
        firing = wait_until(lambda: job.query('ALERTS{alertname="MindSporeTrainingHang", '
                                                           'alertstate="firing"}'), 25, "MindSporeTrainingHang")
        assert [(a["metric"]["rank"], a["metric"]["phase"], a["metric"]["verdict"]) for a in firing] == [
            ("1", "data_wait", "never arrived")]
        seconds = time.time() - blocked_at
        print(f"\nMindSporeTrainingHang firing {seconds:.1f} s after rank 1's data loader blocked")
        (dump,) = (saves / "rank1").glob("hang-rank1-*.txt")
        text = dump.read_text()
        assert text.splitlines()[1].startswith("phase: data_wait for ")
        assert "in __getitem__" in text and "self._never.wait()" in text  # the blocked loader's frame
        assert re.search(r"training thread top frame: .*mindspore.*", text), text.splitlines()[2]
    # Afterwards, from what the ranks left in their save_dirs.
    later = hangs(*(str(saves / f"rank{rank}") for rank in range(WORKERS)))
    assert "project hang: rank 1 never arrived: in data_wait" in later.stdout, later.stdout + later.stderr
