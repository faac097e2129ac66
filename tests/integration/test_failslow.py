"""Fail-slow in a real 4-worker msrun data-parallel job (docs/failslow.md): a callback of rank 2 turns slow at step
150 (examples/distributed_train.py --slow-hook-rank); every rank waits for it in the all-reduce. Rank 2's detector
flags the slowdown with its onset step, its relative score falls, and MindSporeTrainingFailSlow names rank 2 only:
the ranks that wait score as before."""

from __future__ import annotations

from pathlib import Path

import pytest

from ms_exporter.core import catalogue as c
from tests.support.dashboard_queries import FAILSLOW_PANEL, without_data
from tests.support.distributed import distributed_job
from tests.support.waiting import wait_until

pytestmark = pytest.mark.integration
WORKERS = 4
ONSET = 150


def test_the_slowed_rank_is_paged_with_its_onset_step_and_the_ranks_that_wait_are_not(tmp_path: Path) -> None:
    arguments = ("--epochs", "40", "--slow-hook-rank", "2", "--slow-hook-from", str(ONSET))
    with distributed_job(tmp_path, *arguments, workers=WORKERS, project="failslow") as job:
        firing = wait_until(
            lambda: job.query('ALERTS{alertname="MindSporeTrainingFailSlow", alertstate="firing", project="failslow"}'),
            900,
            "MindSporeTrainingFailSlow",
        )
        assert [alert["metric"]["rank"] for alert in firing] == ["2"]
        onsets = job.by_rank(f'{c.FAILSLOW_ONSET_STEP.name}{{project="failslow"}}')
        # The hook sleeps from step 150's end: step 151's cycle is the first that holds it.
        assert ONSET <= onsets["2"] <= ONSET + 2, onsets
        relative = job.by_rank(f'{c.RANK_RELATIVE_SLOWNESS}{{project="failslow"}}')
        sizes = job.by_rank(f'{c.FAILSLOW_SIZE.name}{{project="failslow"}}')
        print(f"\nfail-slow: onsets {onsets}, sizes {sizes}, relative scores {relative}")
        assert relative["2"] < 0.95 and all(relative[rank] > 0.95 for rank in ("0", "1", "3")), relative
        assert job.by_rank(f'{c.FAILSLOW.name}{{project="failslow"}}')["2"] == 1.0
        empty = without_data(job.query, "failslow", titles=(FAILSLOW_PANEL, "Slowness scores"))
        assert empty == [], "dashboard queries without data:\n" + "\n".join(empty)
