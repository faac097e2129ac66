"""Silent data corruption of a local gradient in a real 3-worker msrun data-parallel job (docs/sdc.md#local-gradients),
and the suite's short versions of `make sdc`'s injection campaigns: in one process, and on three msrun processes.

One bit of rank 2's local gradient of the classifier's weight flips before step 40's all-reduce (an exponent bit:
the element becomes enormous or infinite). With `divergence.skip_local_grad_outliers` every replica skips that step:
the corrupted update is applied nowhere, the replicas stay equal, training goes on; rank 2 alone is flagged, and
MindSporeTrainingSilentDataCorruption pages for it with kind="local_gradients".
"""

from __future__ import annotations

import json
import math
import subprocess
import sys
import urllib.request
from pathlib import Path

import pytest

from benchmarks.sdc import LOCATIONS
from ms_exporter.core import catalogue as c
from tests.support.distributed import distributed_job
from tests.support.waiting import wait_until

pytestmark = pytest.mark.integration
ROOT = Path(__file__).resolve().parents[2]
WORKERS = 3
FLIP = "{rank: 2, step: 40, kind: gradients, tensor: head.weight, element: 1, bit: 30}"


def test_a_corrupted_local_gradient_is_flagged_on_its_rank_and_skipped_on_every_replica(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(
        "MS_EXPORTER_DIVERGENCE",
        "{every_n_steps: 20, window_steps: 500, allow_injection: true, skip_local_grad_outliers: true, "
        f"inject_flips: [{FLIP}]}}",
    )
    with distributed_job(tmp_path, "--epochs", "20", workers=WORKERS, project="sdc") as job:
        firing = wait_until(
            lambda: job.query(
                'ALERTS{alertname="MindSporeTrainingSilentDataCorruption", alertstate="firing", project="sdc"}'
            ),
            900,
            "MindSporeTrainingSilentDataCorruption",
        )
        assert [(a["metric"]["rank"], a["metric"]["kind"]) for a in firing] == [("2", "local_gradients")]
        assert job.by_rank(f'{c.LOCAL_GRAD_OUTLIER_STEP.name}{{project="sdc"}} >= 0') == {"2": 40.0}  # else NaN
        assert job.by_rank(f'{c.LOCAL_GRAD_OUTLIERS.name}{{project="sdc"}}') == {"0": 0, "1": 0, "2": 1}
        assert job.by_rank(f'{c.LOCAL_GRAD_SKIPPED.name}{{project="sdc"}}') == {"0": 1, "1": 1, "2": 1}
        pages = {}
        for rank in range(WORKERS):
            url = f"http://127.0.0.1:{job.base_port + rank}/debug/checksums"
            with urllib.request.urlopen(url, timeout=30) as response:
                pages[rank] = {row["step"]: row for row in json.loads(response.read())["steps"]}
        for rank, rows in pages.items():
            # Step 40 applied nothing: its weights are step 39's, bit for bit, on every replica; step 41 moved them.
            assert rows[40]["weights"] == rows[39]["weights"] != rows[41]["weights"], rank
            assert all(math.isfinite(rows[s]["local_grad_norm"]) for s in rows if s != 40 or rank != 2)
        assert math.isinf(pages[2][40]["local_grad_norm"]) or pages[2][40]["local_grad_norm"] > 1e10
        named = subprocess.run(
            [sys.executable, "-m", "ms_exporter", "checksums", *(f"127.0.0.1:{job.base_port + r}" for r in range(3))],
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
            cwd=ROOT,
        )
        assert named.returncode == 1 and "local gradient norm at step 40 on rank 2:" in named.stdout, named.stdout
        assert "equal at every step kept by all" in named.stdout, named.stdout
        # The replicas never held other bits: no checksum differs.
        assert not job.query(
            'ALERTS{alertname="MindSporeTrainingSilentDataCorruption", kind=~"weights|optimizer", project="sdc"}'
        )


def test_the_injection_campaign_detects_and_names_every_flip_of_weights_and_moments(tmp_path: Path) -> None:
    """The short version of `make sdc` (10,000 steps there): 120 steps, one flip every 4."""
    # In its own process: the campaign trains in GRAPH mode.
    raw = tmp_path / "sdc.json"
    subprocess.run(
        [
            sys.executable,
            "-m",
            "benchmarks.sdc",
            "--steps",
            "120",
            "--every",
            "4",
            "--seed",
            "7",
            "--json",
            str(raw),
            "--no-page",
        ],
        check=True,
        cwd=ROOT,
        timeout=900,
        capture_output=True,
    )
    result = json.loads(raw.read_text())
    by_location = {location: [i for i in result["injections"] if i["location"] == location] for location in LOCATIONS}
    assert all(by_location.values()), {k: len(v) for k, v in by_location.items()}
    for location in ("weights", "optimizer"):
        assert all(i["detected"] and i["named"] and i["latency"] == 0 for i in by_location[location])
    for injection in by_location["gradients"]:  # flagged exactly where the norm rule says
        assert injection["detected"] == (not math.isfinite(injection["ratio"]) or injection["ratio"] > 1000.0)
    assert result["false_positives"] == {"checksums": 0, "local_gradients": 0}


def test_the_campaign_on_three_msrun_processes_detects_and_names_every_stored_flip_at_its_step(tmp_path: Path) -> None:
    """The short version of `make sdc`'s msrun campaign: one job of flips of weights and moments (a local gradient's
    flip in an msrun job is the first test's)."""
    raw = tmp_path / "campaign.json"
    arguments = ("--jobs", "1", "--flips", "8", "--every", "4", "--seed", "3", "--json", str(raw), "--no-page")
    subprocess.run(
        [sys.executable, "-m", "benchmarks.sdc_msrun_campaign", *arguments],
        check=True,
        cwd=ROOT,
        timeout=1200,
        capture_output=True,
    )
    result = json.loads(raw.read_text())
    injections = result["injections"]
    assert len(injections) == 8 and {i["location"] for i in injections} == {"weights", "optimizer"}
    assert {i["class"] for i in injections} == {"sign", "exponent", "top 8 mantissa", "low mantissa"}
    assert all(i["detected"] and i["named"] and i["latency"] == 0 for i in injections), injections
    assert result["false_positives"] == {"checksums": 0} and result["clean_steps"]["checksums"] > 20
