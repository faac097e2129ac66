"""Real data-parallel training under msrun (2 CPU workers), discovered by a real Prometheus through file_sd."""

from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path

import pytest

from tests.support.distributed import distributed_job
from tests.support.scrape import scrape
from tests.support.waiting import wait_until

pytestmark = pytest.mark.integration
STEPS = 64  # 1024 samples / batch 16 / 2 shards = 32 steps per epoch, 2 epochs


def test_two_ranks_discovered_aggregated_and_a_finished_rank_that_goes_pages_nothing(tmp_path: Path) -> None:
    with distributed_job(tmp_path) as job:
        targets, base_port, query = job.targets, job.base_port, job.query
        files = wait_until(
            lambda: (
                sorted(targets.glob("ms-exporter-dist-rank*.json"))
                if len(list(targets.glob("ms-exporter-dist-rank*.json"))) == 2
                else None
            ),
            180,
            "both ranks' target files",
        )
        ports = [json.loads(f.read_text())[0]["targets"][0].rsplit(":", 1)[1] for f in files]
        assert ports == [str(base_port), str(base_port + 1)]  # port = base + local rank
        for rank, port in enumerate(ports):
            info = scrape(f"http://127.0.0.1:{port}/metrics").labels_of("mindspore_train_info")
            assert len(info) == 1 and info[0]["rank"] == str(rank) and info[0]["world_size"] == "2"
            assert info[0]["local_rank"] == str(rank)

        wait_until(lambda: len(query('up{job="mindspore"} == 1')) == 2, 60, "Prometheus discovering both ranks")
        # Training ends; the endpoints linger with their final values, so the rule's mean can be checked exactly.
        wait_until(
            lambda: len(query(f'mindspore_train_global_step{{project="dist"}} == {STEPS}')) == 2,
            240,
            f"both ranks at step {STEPS}",
        )
        time.sleep(3)
        losses = {r["metric"]["rank"]: float(r["value"][1]) for r in query('mindspore_train_loss{project="dist"}')}
        assert set(losses) == {"0", "1"} and losses["0"] != losses["1"]  # each rank reports its own shard's loss
        (mean,) = query('project:mindspore_train_loss:mean{project="dist"}')
        assert float(mean["value"][1]) == pytest.approx((losses["0"] + losses["1"]) / 2, rel=1e-9)
        # Even ranks: the straggler alert never fired during the whole run. (It may go pending for a second while
        # the graphs compile: the test timing's 10 s rate window then holds a few samples, not the same per rank.)
        assert query('max_over_time(ALERTS{alertname="MindSporeTrainingStraggler", alertstate="firing"}[1h])') == []

        # Both ranks ended normally and say so; a finished rank that goes (here killed, with no chance to leave
        # discovery, and msrun then stops the other worker too) is not a rank gone: nothing pages.
        assert job.by_rank('mindspore_train_phase{project="dist", phase="ended"}') == {"0": 1.0, "1": 1.0}
        os.kill(int((targets / "pid-rank1").read_text()), signal.SIGKILL)
        rank1 = f"127.0.0.1:{base_port + 1}"
        wait_until(lambda: query(f'up{{instance="{rank1}"}} == 0'), 60, "rank 1's endpoint down")
        time.sleep(8)  # the test timing's gone_for (2 s) four times over, evaluated every second
        # Firing, never: without the rules' `unless ... ended` both would fire within those 8 s. (Pending for a
        # second is no page: on a loaded machine one scrape of a training rank can outlast the test's 1 s timeout.)
        gone = 'ALERTS{alertname=~"MindSporeTrainingRank(Down|Missing)", alertstate="firing"}'
        assert query(f"max_over_time({gone}[1h])") == []


def test_a_rank_with_a_slow_data_loader_is_the_straggler(tmp_path: Path) -> None:
    # Rank 1's loader takes 0.25 s per batch, several times a step here, so prefetch cannot hide it. Rank 0 then
    # waits for rank 1 in every all-reduce: rank 0 has the long steps, rank 1 the long data wait. The job is
    # stopped once the alert has fired; 6 epochs (about 50 s of slowed training) leave room for a slow machine.
    with distributed_job(tmp_path, "--slow-rank", "1", "--slow-seconds", "0.25", "--epochs", "6") as job:
        firing = wait_until(
            lambda: job.query('ALERTS{alertname="MindSporeTrainingStraggler", project="dist", alertstate="firing"}'),
            180,
            "MindSporeTrainingStraggler firing",
        )
        assert [a["metric"]["rank"] for a in firing] == ["1"]
        # Never, at any time of the run, for the rank that waits.
        assert (
            job.query(
                'max_over_time(ALERTS{alertname="MindSporeTrainingStraggler", alertstate="firing", rank="0"}[1h])'
            )
            == []
        )
        step = job.by_rank('rank:mindspore_train_step_duration_seconds:mean{project="dist"}')
        wait = job.by_rank('rank:mindspore_train_data_wait_seconds:mean{project="dist"}')
        assert step["0"] > step["1"], (step, wait)  # what made a step-time rule name rank 0
        assert wait["1"] > 5 * wait["0"], (step, wait)
        (alert,) = [
            a
            for a in job.alerts()
            if a["labels"]["alertname"] == "MindSporeTrainingStraggler" and a["state"] == "firing"
        ]
        assert alert["annotations"]["description"].startswith("The job waits for rank 1 of project dist: ")


def test_a_functional_loop_compares_replica_fingerprints_and_names_its_slow_rank(tmp_path: Path) -> None:
    """The same job written as MindSpore 2.x's functional loop (value_and_grad, DistributedGradReducer, an @ms.jit
    step) through the loop API: the replicas' fingerprints agree, and rank 1's slow loader makes it the straggler."""
    arguments = ("--loop", "--slow-rank", "1", "--slow-seconds", "0.25", "--epochs", "6")
    with distributed_job(tmp_path, *arguments) as job:
        firing = wait_until(
            lambda: job.query('ALERTS{alertname="MindSporeTrainingStraggler", project="dist", alertstate="firing"}'),
            240,
            "MindSporeTrainingStraggler firing",
        )
        assert [a["metric"]["rank"] for a in firing] == ["1"]
        wait_until(
            lambda: job.by_rank('mindspore_train_param_fingerprint_step{project="dist"}') == {"0": 100.0, "1": 100.0},
            240,
            "both ranks' fingerprints of step 100",
        )
        fingerprints = job.by_rank('mindspore_train_param_fingerprint{project="dist"}')
        assert set(fingerprints) == {"0", "1"} and fingerprints["0"] == fingerprints["1"], fingerprints
        assert job.query('ALERTS{alertname="MindSporeTrainingReplicaDivergence"}') == []
        grad_norms = job.by_rank('mindspore_train_grad_norm{project="dist"}')
        assert set(grad_norms) == {"0", "1"}  # from the grads the loop handed in, reduced on each rank's device
        tokens = job.by_rank('mindspore_train_tokens_total{project="dist"}')  # the batches' masks, counted
        assert set(tokens) == {"0", "1"} and min(tokens.values()) > 0, tokens
