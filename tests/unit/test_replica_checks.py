"""Replica checks at every step: one flipped bit in any weight or optimizer state tensor is seen at the step it
happens, in its bucket's checksum, and the window names the step, the tensor and the rank."""

from __future__ import annotations

import json
import math

import mindspore as ms
import numpy as np
import pytest

from ms_exporter.config import load_config
from ms_exporter.core import catalogue as c
from ms_exporter.core.analysis.replicas import first_disagreement
from ms_exporter.core.device import device_reductions as d
from ms_exporter.core.output_layout import LayoutResolver
from ms_exporter.core.ranks import RankInfo
from ms_exporter.core.store import MetricStore
from ms_exporter.features.fingerprint import Fingerprints
from ms_exporter.features.replica_checks import StepChecks, split


def replica() -> dict[str, list[ms.Parameter]]:
    """The same weights and moments on every call, as replicas hold them."""
    rng = np.random.default_rng(3)
    shapes = [(64, 64), (64,), (256, 64), (64,), (10, 64)]
    weights = [
        ms.Parameter(ms.Tensor(rng.normal(size=s).astype(np.float32)), name=f"w{i}") for i, s in enumerate(shapes)
    ]
    moments = [
        ms.Parameter(ms.Tensor(rng.normal(size=s).astype(np.float32)), name=f"adam_m.w{i}")
        for i, s in enumerate(shapes)
    ]
    step = ms.Parameter(ms.Tensor(np.array([0], np.int32)), name="global_step")
    return {"weights": weights, "optimizer": [*moments, step]}


def flip(parameter: ms.Parameter, element: int, bit: int) -> None:
    """Flip one bit of one element, in place (the way the injector does on the CPU target)."""
    words = np.asarray(parameter.asnumpy()).reshape(-1).view(np.uint32)
    words[element] ^= np.uint32(1 << bit)


@pytest.fixture(autouse=True)
def in_place(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(d, "read_in_place", True)


def test_buckets_are_runs_of_about_equal_values() -> None:
    sizes = [type("T", (), {"size": n})() for n in (100, 100, 100, 100, 1000, 1, 1)]
    assert split(sizes, 3) == [(0, 4), (5, 6)]
    assert split(sizes, 8) == [(0, 1), (2, 3), (4, 4), (5, 6)]  # a share is 176 values
    assert split(sizes[:2], 1) == [(0, 1)]
    assert split([], 4) == []


@pytest.mark.parametrize("kind", ["weights", "optimizer"])
@pytest.mark.parametrize("bit", [31, 30, 23, 22, 0])  # sign, exponent, top and bottom of the mantissa
def test_one_flip_is_seen_at_its_step_in_its_bucket_and_named(kind: str, bit: int) -> None:
    replicas = [replica() for _ in range(3)]
    checks = [StepChecks(r, buckets=3, window_steps=16) for r in replicas]
    for step in range(1, 11):
        if step == 6:
            flip(replicas[2][kind][2], element=1234, bit=bit)
        for check in checks:
            check.read(step)
    published = [check.publish() for check in checks]
    assert published[0] == published[1]
    differing = {key for key in published[0] if published[0][key] != published[2][key]}
    bucket = next(str(n) for n, (first, last) in enumerate(checks[2].buckets[kind]) if first <= 2 <= last)
    assert differing == {(kind, bucket)}
    pages = {str(rank): json.loads(check.page(rank, "0")) for rank, check in enumerate(checks)}
    name = "w2" if kind == "weights" else "adam_m.w2"
    assert first_disagreement(pages) == {"step": 6, "kind": kind, "tensor": name, "ranks": ["2"]}


def test_a_flip_undone_before_the_comparison_is_still_seen() -> None:
    """The checksum covers every step since the last comparison, not only the last step."""
    replicas = [replica() for _ in range(2)]
    checks = [StepChecks(r, buckets=1, window_steps=4) for r in replicas]
    for step in range(1, 9):
        if step in (3, 4):  # flipped at step 3, flipped back at step 4
            flip(replicas[1]["weights"][0], element=7, bit=12)
        for check in checks:
            check.read(step)
    assert checks[0].publish() != checks[1].publish()
    for check in checks:  # the next window starts equal again
        check.read(9)
    assert checks[0].publish() == checks[1].publish()


def test_the_onset_stays_on_the_page_for_two_comparisons() -> None:
    """The steps of the last two comparison intervals are kept beside the last steps: the interval in which a
    differing checksum's onset lies is still on the page after the rolling window has moved past it."""
    replicas = [replica() for _ in range(3)]
    checks = [StepChecks(r, buckets=2, window_steps=5) for r in replicas]

    def first(until: int, start: int) -> dict[str, object] | None:
        for step in range(start, until + 1):
            if step == 6:
                flip(replicas[2]["weights"][4], element=3, bit=1)
            for check in checks:
                check.read(step)
            if step % 5 == 0:
                for check in checks:
                    check.publish()
        return first_disagreement({str(r): json.loads(c.page(r, "0")) for r, c in enumerate(checks)})

    assert first(18, 1) == {"step": 6, "kind": "weights", "tensor": "w4", "ranks": ["2"]}
    page = json.loads(checks[0].page(0, "0"))
    assert [row["step"] for row in page["steps"]] == list(range(6, 19))  # (5, 10], (10, 15] and the last five
    found = first(22, 19)  # two comparisons later the interval of step 6 is gone: the earliest kept step differs
    assert found is not None and found["step"] == 11 and found["ranks"] == ["2"]


def test_equal_replicas_agree_at_every_step() -> None:
    replicas = [replica() for _ in range(3)]
    checks = [StepChecks(r, buckets=8, window_steps=8) for r in replicas]
    for step in range(1, 6):
        for r in replicas:  # the same update on every replica, in place
            for param in r["weights"]:
                np.asarray(param.asnumpy())[...] *= 0.5
        for check in checks:
            check.read(step)
    pages = {str(rank): json.loads(check.page(rank, "0")) for rank, check in enumerate(checks)}
    assert first_disagreement(pages) is None
    assert len({tuple(sorted(check.publish().items())) for check in checks}) == 1


def test_the_fingerprint_step_publishes_the_checksums_and_the_window() -> None:
    store = MetricStore()
    config = load_config({"divergence": {"replica_group": "0", "every_n_steps": 5, "buckets": 2}}).divergence
    fingerprints = Fingerprints(store, config, RankInfo(1, 1, 3, "node"), LayoutResolver())
    tensors = replica()
    network = type("Network", (), {"weights": tensors["weights"]})()
    optimizer = type("Optimizer", (), {"get_parameters": lambda self: [*tensors["weights"], *tensors["optimizer"]]})()
    fingerprints.on_train_begin({"train_network": network, "optimizer": optimizer, "cur_step_num": 0})
    assert fingerprints.checksums_page() is None
    for step in range(1, 6):
        fingerprints.on_step_end(step, None)
    labels = sorted((dict(s.labels)["kind"], dict(s.labels)["bucket"]) for s in store.series_of(c.PARAM_CHECKSUM))
    assert labels == [("optimizer", "0"), ("optimizer", "1"), ("weights", "0"), ("weights", "1")]
    assert store.value_of(c.PARAM_FINGERPRINT_STEP) == 5
    assert all(not math.isnan(series.value) for series in store.series_of(c.PARAM_CHECKSUM))
    page = json.loads(fingerprints.checksums_page() or "")
    assert [row["step"] for row in page["steps"]] == [1, 2, 3, 4, 5]
    assert page["rank"] == 1 and page["tensors"]["optimizer"][-1] == "global_step"
    assert len(page["steps"][0]["optimizer"]) == len(tensors["optimizer"])


def test_checks_that_cost_more_than_their_share_of_the_cycle_are_said_once(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """The feature times each step's checks against the rest of the cycle; here a clock makes each check 2 ms of a
    14 ms cycle (14%): one warning naming the setting, then none."""
    import logging

    from ms_exporter.features import fingerprint as module
    from ms_exporter.features.check_cost import CHECK_WINDOW

    ticks = iter(float(i) * 0.002 + (i // 2) * 0.010 for i in range(10_000))  # a check of 2 ms every 14 ms
    monkeypatch.setattr(module.time, "perf_counter", lambda: next(ticks))
    store = MetricStore()
    config = load_config({"divergence": {"replica_group": "0", "every_n_steps": 1000}}).divergence
    fingerprints = Fingerprints(store, config, RankInfo(1, 1, 3, "node"), LayoutResolver())
    tensors = replica()
    network = type("Network", (), {"weights": tensors["weights"]})()
    optimizer = type("Optimizer", (), {"get_parameters": lambda self: [*tensors["weights"], *tensors["optimizer"]]})()
    fingerprints.on_train_begin({"train_network": network, "optimizer": optimizer, "cur_step_num": 0})
    with caplog.at_level(logging.WARNING, logger="ms_exporter"):
        for step in range(1, 4 * CHECK_WINDOW):
            fingerprints.on_step_end(step, None)
    warnings = [r.getMessage() for r in caplog.records if "replica checks read" in r.getMessage()]
    assert len(warnings) == 1, warnings
    assert "in 2.00 ms every 1 step(s), 14.3% of this rank's median 14.0 ms between two checks" in warnings[0]
    assert "divergence.check_every_n_steps: 20 on every rank" in warnings[0]  # 17 steps would do; 20 divides 1000


def test_checks_every_n_steps_read_those_steps_and_see_a_flip_at_the_next() -> None:
    store = MetricStore()
    config = load_config({"divergence": {"replica_group": "0", "every_n_steps": 10, "check_every_n_steps": 5}})
    fingerprints = Fingerprints(store, config.divergence, RankInfo(1, 1, 3, "node"), LayoutResolver())
    tensors = replica()
    network = type("Network", (), {"weights": tensors["weights"]})()
    optimizer = type("Optimizer", (), {"get_parameters": lambda self: [*tensors["weights"], *tensors["optimizer"]]})()
    fingerprints.on_train_begin({"train_network": network, "optimizer": optimizer, "cur_step_num": 0})
    twin = StepChecks(replica(), buckets=8, window_steps=128)
    for step in range(1, 11):
        if step == 7:
            flip(tensors["weights"][2], 5, 30)
        fingerprints.on_step_end(step, None)
        if step % 5 == 0:
            twin.read(step)
    page = json.loads(fingerprints.checksums_page() or "")
    assert [row["step"] for row in page["steps"]] == [5, 10]  # only the checked steps
    assert store.value_of(c.PARAM_FINGERPRINT_STEP) == 10
    theirs = json.loads(twin.page(1, "0"))
    assert page["steps"][0]["weights"] == theirs["steps"][0]["weights"]  # step 5: the replicas agree
    mine, other = page["steps"][1]["weights"], theirs["steps"][1]["weights"]
    assert [i for i, (a, b) in enumerate(zip(mine, other)) if a != b] == [2]  # step 10 names the flipped tensor


def test_a_check_interval_must_divide_the_comparison_interval() -> None:
    from ms_exporter.config import ConfigError

    with pytest.raises(ConfigError, match=r"check_every_n_steps.*must divide every_n_steps \(100\)"):
        load_config({"divergence": {"check_every_n_steps": 30}})
    assert load_config({"divergence": {"check_every_n_steps": 25}}).divergence.check_every_n_steps == 25
