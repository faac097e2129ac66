"""`ms-exporter checksums`: the pages of a replica group read and the first step and tensor that differ named, with
the ranks that differ; every target that gave no page said."""

from __future__ import annotations

import argparse
import json

import mindspore as ms
import numpy as np
import pytest

from ms_exporter.core.device import device_reductions as d
from ms_exporter.features.replica_checks import StepChecks
from ms_exporter.tools import checksums
from ms_exporter.tools.scrape import Access, FetchError


def pages(flip_at: int | None, local_outlier_at: int | None = None) -> dict[str, str]:
    """The /debug/checksums pages of three replicas by URL, rank 1's weight w1 flipped at `flip_at`."""
    served = {}
    for rank in range(3):
        rng = np.random.default_rng(0)
        weights = [
            ms.Parameter(ms.Tensor(rng.normal(size=(16, 16)).astype(np.float32)), name=f"w{i}") for i in range(2)
        ]
        check = StepChecks({"weights": weights, "optimizer": []}, buckets=2, window_steps=8)
        for step in range(1, 11):
            if rank == 1 and step == flip_at:
                np.asarray(weights[1].asnumpy()).reshape(-1).view(np.uint32)[3] ^= np.uint32(1 << 29)
            check.read(step, 1e30 if rank == 2 and step == local_outlier_at else 1.0 + 0.1 * rank)
        served[f"http://h:{9000 + rank}/debug/checksums"] = check.page(rank, "0")
    served["http://h:9003/debug/checksums"] = "404"  # a rank without a replica group
    return served


@pytest.fixture(autouse=True)
def in_place(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(d, "read_in_place", True)


def fetcher(served: dict[str, str]):  # type: ignore[no-untyped-def]
    def fetch(url: str, access: Access) -> str:
        if served.get(url, "404") == "404":
            raise FetchError("HTTP 404 Not Found")
        return served[url]

    return fetch


def run(served: dict[str, str], capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> tuple[int, str]:
    monkeypatch.setattr(checksums, "fetch", fetcher(served))
    args = argparse.Namespace(
        targets=[f"h:{9000 + r}" for r in range(4)], timeout=1.0, scheme="http", local_grad_factor=1000.0
    )
    status = checksums.run_checksums(args, lambda message: pytest.fail(message))
    return status, capsys.readouterr().out


def test_the_first_differing_step_tensor_and_rank_are_named(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    status, out = run(pages(flip_at=6), capsys, monkeypatch)
    assert status == 1
    assert out.splitlines() == [
        "no page: http://h:9003/debug/checksums: HTTP 404 Not Found",
        "replica group 0: ranks 0, 1, 2; steps 3 to 10 kept by all",
        "  first differs at step 6: weights tensor w1 on rank(s) 1",
    ]


def test_equal_replicas_say_so(capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    status, out = run(pages(flip_at=None), capsys, monkeypatch)
    assert status == 0 and out.splitlines()[-1] == "  equal at every step kept by all"


def test_a_page_that_is_not_a_checks_page_is_said(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    served = pages(flip_at=None)
    served["http://h:9002/debug/checksums"] = json.dumps({"something": "else"})
    status, out = run(served, capsys, monkeypatch)
    assert status == 0
    assert "no page: http://h:9002/debug/checksums: not a replica checks page" in out
    assert "replica group 0: ranks 0, 1; steps 3 to 10 kept by all" in out


def test_a_rank_whose_local_gradient_norm_stands_out_is_named(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    status, out = run(pages(flip_at=None, local_outlier_at=7), capsys, monkeypatch)
    assert status == 1
    assert out.splitlines()[-2:] == [
        "  equal at every step kept by all",
        "  local gradient norm at step 7 on rank 2: 1e+30 (the others' median 1.05)",
    ]
