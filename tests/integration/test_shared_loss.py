"""The actions in a real data-parallel job: every rank must decide alike, so GradNormTrainOneStepCell hands every
rank the replicas' mean loss once an action reads the loss (docs/rollback.md#in-a-job-of-several-ranks). Two msrun
CPU workers train on different shards with actions.early_stop on: the same loss on both at every step, and both
stop at the same step (a rank stopping alone would leave the other waiting in its next all-reduce)."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

from tests.support.distributed import msrun_command, msrun_environment
from tests.support.waiting import free_port

pytestmark = pytest.mark.integration

# No improvement by 100 ever counts: every rank stops at its 21st evaluation, whatever its losses.
EARLY_STOP = "{early_stop: {enable: true, unit: step, patience: 20, min_delta: 100}}"
LINE = re.compile(r"^rank (\d) step (\d+) loss (\S+)$", re.MULTILINE)


def test_every_rank_decides_from_the_replicas_mean_loss_and_stops_at_the_same_step(tmp_path: Path) -> None:
    env = msrun_environment(MS_EXPORTER_ACTIONS=EARLY_STOP)
    command = msrun_command(
        env, 2, free_port(), tmp_path / "log", "--port", str(free_port(2)), "--epochs", "1", "--print-losses"
    )
    done = subprocess.run(command, env=env, cwd=tmp_path, capture_output=True, text=True, timeout=600)
    logs = "".join(path.read_text(errors="replace") for path in sorted((tmp_path / "log").glob("worker_*.log")))
    assert done.returncode == 0, logs[-4000:]
    losses: dict[int, dict[int, str]] = {0: {}, 1: {}}
    for rank, step, loss in LINE.findall(logs):
        losses[int(rank)][int(step)] = loss
    assert losses[0] and losses[0] == losses[1], losses  # the same mean on both ranks, to the last bit printed
    assert max(losses[0]) == 21, sorted(losses[0])  # both stopped early, at the same step
    assert len(set(losses[0].values())) > 1  # training steps, not one value repeated
    assert "decide from the loss" not in logs  # the cell shared it: no warning
