"""Local gradient norms (docs/sdc.md#local-gradients): measured by the train cell before the all-reduce, a drill's
flip lands between the backward pass and the reducer, an outlier is flagged against the rank's own history and
against its replicas at the same step."""

from __future__ import annotations

import json
import math

import mindspore as ms
import numpy as np
import pytest
from mindspore import nn

from ms_exporter.cells.train_cells import GradNormTrainOneStepCell
from ms_exporter.config import load_config
from ms_exporter.core import catalogue as c
from ms_exporter.core.analysis.replicas import local_gradient_outliers
from ms_exporter.core.output_layout import LayoutResolver
from ms_exporter.core.ranks import RankInfo
from ms_exporter.core.store import MetricStore
from ms_exporter.features.fingerprint import Fingerprints
from ms_exporter.features.local_gradients import WARMUP_STEPS, LocalGradientCheck


def cell() -> GradNormTrainOneStepCell:
    ms.set_seed(3)
    network = nn.WithLossCell(nn.Dense(6, 2), nn.MSELoss())
    optimizer = nn.SGD(network.trainable_params(), learning_rate=0.01)
    return GradNormTrainOneStepCell(network, optimizer, every_n_steps=1000)


def batch(step: int) -> tuple[ms.Tensor, ms.Tensor]:
    rng = np.random.default_rng(step)
    return ms.Tensor(rng.normal(size=(4, 6)).astype(np.float32)), ms.Tensor(rng.normal(size=(4, 2)).astype(np.float32))


def expected_norm(train: GradNormTrainOneStepCell, inputs: tuple[ms.Tensor, ms.Tensor]) -> float:
    grads = ms.grad(train.network, grad_position=None, weights=train.weights)(*inputs)
    return math.sqrt(sum(float((np.asarray(g.asnumpy(), np.float64) ** 2).sum()) for g in grads))


def test_the_cell_writes_the_local_norm_of_the_gradients_it_applies() -> None:
    train = cell()
    norm = train.measure_local_norms()
    assert math.isnan(float(norm.asnumpy()[0]))
    for step in (1, 2, 3):
        wanted = expected_norm(train, batch(step))
        train(*batch(step))
        assert float(norm.asnumpy()[0]) == pytest.approx(wanted, rel=1e-5)


@pytest.mark.parametrize("bit", [31, 30])
def test_a_drill_flips_the_local_gradient_before_it_is_applied(bit: int) -> None:
    """The flipped gradient is the one measured and applied: a sign flip leaves the norm, an exponent flip raises it;
    either way the weight moves as the flipped gradient says, and the steps around are ordinary."""
    train, twin = cell(), cell()
    norm, twin_norm = train.measure_local_norms(), twin.measure_local_norms()
    train.flip_local_gradient(2, 0, 1, bit)  # step 2, the first weight's gradient, element 1
    for step in (1, 2, 3):
        before = [np.array(w.asnumpy()) for w in train.weights]
        grads = ms.grad(twin.network, grad_position=None, weights=twin.weights)(*batch(step))
        train(*batch(step))
        twin(*batch(step))
        moved = np.array(train.weights[0].asnumpy()).reshape(-1) - before[0].reshape(-1)
        if step != 2:
            assert float(norm.asnumpy()[0]) == pytest.approx(float(twin_norm.asnumpy()[0]), rel=1e-6)
            continue
        g = np.array(grads[0].asnumpy()).reshape(-1).copy()
        g.view(np.uint32)[1] ^= np.uint32(1 << bit)
        with np.errstate(over="ignore", invalid="ignore"):
            assert moved[1] == pytest.approx(-0.01 * g[1], rel=1e-4)
        if bit == 31:
            assert float(norm.asnumpy()[0]) == pytest.approx(float(twin_norm.asnumpy()[0]), rel=1e-6)
        else:
            assert float(norm.asnumpy()[0]) > 1e6 * float(twin_norm.asnumpy()[0])
        return


def test_an_outlier_is_flagged_against_the_rank_own_history_and_kept_out_of_it() -> None:
    values = iter([1.0] * WARMUP_STEPS + [2.0, 5000.0, 1.5, math.inf, 1.0, 999.0])
    check = LocalGradientCheck(lambda: next(values), factor=1000)
    for step in range(1, WARMUP_STEPS + 7):
        check.read(step)
    assert check.outliers == 2
    assert check.last_outlier == (WARMUP_STEPS + 4, math.inf, 1.0)


def test_no_judgement_before_the_history_is_warm() -> None:
    values = iter([1.0, 1e9, *[1.0] * WARMUP_STEPS])
    check = LocalGradientCheck(lambda: next(values), factor=1000)
    for step in range(1, WARMUP_STEPS + 3):
        check.read(step)
    assert check.outliers == 0


def test_replicas_name_the_rank_whose_norm_is_an_outlier_at_a_step() -> None:
    def page(norms: dict[int, float]) -> dict[str, object]:
        return {"steps": [{"step": s, "local_grad_norm": n} for s, n in norms.items()]}

    pages = {
        "0": page({10: 1.0, 11: 1.2, 12: 0.9}),
        "1": page({10: 1.1, 11: 2.0e5, 12: 1.0}),
        "2": page({10: 0.8, 11: 1.3, 12: math.inf}),
    }
    found = local_gradient_outliers(pages, factor=1000)
    assert [(f["step"], f["rank"]) for f in found] == [(11, "1"), (12, "2")]
    assert found[0]["replicas"] == pytest.approx(1.25)


def test_the_fingerprint_part_reads_the_cell_and_publishes_and_announces() -> None:
    config = load_config({"divergence": {"replica_group": "0", "every_n_steps": 5}}).divergence
    store = MetricStore()
    events: list[tuple[int, str, dict[str, object]]] = []
    part = Fingerprints(
        store,
        config,
        RankInfo(rank=1, world_size=2, local_rank=1, node="n"),
        LayoutResolver(),
        lambda step, event, details: events.append((step, event, details)),
    )
    train = cell()
    train.flip_local_gradient(WARMUP_STEPS + 2, 0, 0, 30)
    part.on_train_begin({"train_network": train, "cur_step_num": 0})
    for step in range(1, WARMUP_STEPS + 6):
        train(*batch(step))
        part.on_step_end(step, None)
    # The inf the flip made reaches the weight (every replica applies it): the steps after are outliers too.
    flagged = [e for e in events if e[1] == "local_gradient_outlier"]
    assert flagged[0][0] == WARMUP_STEPS + 2 and {e[2]["rank"] for e in flagged} == {1}
    (outliers,) = store.series_of(c.LOCAL_GRAD_OUTLIERS)
    assert outliers.value == len(flagged)
    (at,) = store.series_of(c.LOCAL_GRAD_OUTLIER_STEP)
    assert at.value == flagged[-1][0]
    published = [e for e in events if e[1] == "replica_checksums"]
    assert [e[0] for e in published] == [5, 10, 15, 20] and len(published[0][2]["weights"]) == 2
    rows = json.loads(part.checksums_page() or "{}")["steps"]
    norms = {row["step"]: row["local_grad_norm"] for row in rows}
    assert not math.isfinite(norms[WARMUP_STEPS + 2]) and math.isfinite(norms[WARMUP_STEPS + 1])


def test_with_skipping_on_the_corrupted_step_is_not_applied_and_training_goes_on() -> None:
    config = load_config(
        {"divergence": {"replica_group": "0", "every_n_steps": 5, "skip_local_grad_outliers": True}}
    ).divergence
    store = MetricStore()
    part = Fingerprints(store, config, RankInfo(rank=0, world_size=1, local_rank=0, node="n"), LayoutResolver())
    train = cell()
    corrupted = WARMUP_STEPS + 2
    train.flip_local_gradient(corrupted, 0, 0, 30)
    part.on_train_begin({"train_network": train, "cur_step_num": 0})
    assert float(train.local_grad_limit.asnumpy()[0]) == math.inf  # nothing skipped before a history
    for step in range(1, WARMUP_STEPS + 6):
        before = [np.array(w.asnumpy()) for w in train.weights]
        train(*batch(step))
        part.on_step_end(step, None)
        after = [np.array(w.asnumpy()) for w in train.weights]
        unchanged = all(np.array_equal(a, b) for a, b in zip(after, before))
        assert unchanged == (step == corrupted), step
        assert all(np.isfinite(a).all() for a in after)
        if step == WARMUP_STEPS:  # the limit the monitor handed the cell: factor times the median of the history
            assert 0 < float(train.local_grad_limit.asnumpy()[0]) < math.inf
    (skipped,) = store.series_of(c.LOCAL_GRAD_SKIPPED)
    (outliers,) = store.series_of(c.LOCAL_GRAD_OUTLIERS)
    assert (skipped.value, outliers.value) == (1, 1)
