"""actions.rollback's parts: the health score, what a divergence is, the loop guard, the kept states and the
poisoned-batch list (the whole action runs in tests/integration/test_rollback.py)."""

from __future__ import annotations

import math
from pathlib import Path

import mindspore as ms
import numpy as np
import pytest
from mindspore import Tensor, nn, ops

from ms_exporter.actions.good_state import GoodStates
from ms_exporter.actions.health import HealthScore
from ms_exporter.actions.rollback import LoopGuard, divergence_of
from ms_exporter.config import load_config
from ms_exporter.skipped_batches import (
    KeepUnlisted,
    SkipListedSamples,
    SkippedBatches,
    batch_identity,
    sample_hash,
)

NAN = math.nan


def test_health_is_the_worst_of_its_three_terms() -> None:
    health = HealthScore(span=2, grad_high=10, grad_exploding=100, memory_growth_limit=0.3)
    assert health.observe(2.0, 2.0, NAN, NAN).score == 1.0  # nothing known against it
    health.observe(2.0, 2.0, NAN, NAN)
    rising = health.observe(2.0, 2.5, 55.0, 0.15)  # smoothed +25% over the span: half way to 0
    assert (rising.loss, rising.grad, rising.memory) == (pytest.approx(0.5), pytest.approx(0.5), pytest.approx(0.5))
    assert health.observe(2.0, 2.5, 1000.0, 0.0).score == 0.0  # past the exploding norm
    assert health.observe(math.inf, 2.5, 1.0, 0.0).score == 0.0
    worn = health.observe(2.0, 2.5, 1.0, 0.3)
    assert worn.score == 0.0 and worn.replica_score > 0  # memory growth is left out of the replicas' decision


def test_after_a_restart_the_loss_trend_starts_again() -> None:
    health = HealthScore(span=2, grad_high=10, grad_exploding=100, memory_growth_limit=0.3)
    for smoothed in (2.0, 2.0, 4.0):  # doubled over the span
        rising = health.observe(2.0, smoothed, NAN, NAN)
    assert rising.loss == 0.0
    health.restart()  # a rollback: the trend of the path left behind is gone
    assert health.observe(2.0, 2.0, NAN, NAN).loss == 1.0
    assert health.observe(2.0, 2.5, NAN, NAN).loss == pytest.approx(0.5)  # +25% since the restart


def test_what_a_divergence_is() -> None:
    config = load_config({"actions": {"rollback": {"enable": True}}}).actions.rollback
    assert divergence_of(config, math.nan, 1.0, NAN, 100.0) == "nonfinite_loss"
    assert divergence_of(config, 3.5, 1.0, NAN, 100.0) == "loss_spike"
    assert divergence_of(config, 3.5, 1.0, NAN, 100.0, warm=False) is None  # a smoothed loss of a few steps
    assert divergence_of(config, 1.0, 1.0, 150.0, 100.0) == "grad_norm"
    assert divergence_of(config, 1.0, 1.0, math.inf, 100.0) == "grad_norm"
    assert divergence_of(config, 2.9, 1.0, 99.0, 100.0) is None
    quiet = load_config({"actions": {"rollback": {"enable": True, "on_nonfinite": False, "spike_factor": None}}})
    assert divergence_of(quiet.actions.rollback, math.nan, 1.0, NAN, 100.0) is None
    assert divergence_of(quiet.actions.rollback, 50.0, 1.0, NAN, 100.0) is None


def test_the_loop_guard_allows_max_rollbacks_within_the_window() -> None:
    guard = LoopGuard(max_rollbacks=2, window_steps=100)
    for step in (10, 50):
        assert guard.allows(step)
        guard.record(step)
    assert not guard.allows(109)  # both still inside (9, 109]
    assert guard.allows(110)  # the one at 10 left the window


@pytest.mark.parametrize("storage", ["memory", "disk"])
def test_a_kept_state_comes_back_exactly_and_old_ones_go(storage: str, tmp_path: Path) -> None:
    ms.set_context(mode=ms.PYNATIVE_MODE)
    net = nn.Dense(3, 2)
    optimizer = nn.Adam(net.trainable_params(), 0.1)
    train = nn.TrainOneStepCell(nn.WithLossCell(net, nn.MSELoss()), optimizer)
    states = GoodStates(storage, 2**30, tmp_path, max_kept=2)
    states.bind(train, leave_out=(optimizer.learning_rate,))
    assert "optimizer.global_step" in states.names and "optimizer.learning_rate" not in states.names
    x, y = Tensor(np.ones((4, 3), np.float32)), Tensor(np.zeros((4, 2), np.float32))
    before: dict[str, np.ndarray] = {}
    for step in (1, 2, 3):
        train(x, y)
        states.capture(step)
        if step == 2:
            before = {name: p.asnumpy().copy() for name, p in train.parameters_and_names()}
    kept = states._kept[0]
    assert [s.step for s in states._kept] == [2, 3]
    assert sorted(p.name for p in tmp_path.glob("*.npz")) == (
        ["good-step000000000002-2.npz", "good-step000000000003-3.npz"] if storage == "disk" else [])
    states.restore(kept)
    after = {name: p.asnumpy() for name, p in train.parameters_and_names()}
    for name, value in before.items():
        np.testing.assert_array_equal(after[name], value, err_msg=name)
    states.close()
    assert list(tmp_path.glob("*.npz")) == []


def test_auto_storage_goes_to_disk_past_the_memory_limit(tmp_path: Path) -> None:
    net = nn.Dense(64, 64)
    small, large = GoodStates("auto", 2**30, tmp_path, 1), GoodStates("auto", 1024, tmp_path, 1)
    small.bind(net)
    large.bind(net)
    assert (small.where, large.where) == ("memory", "disk")


def test_a_batch_row_hashes_as_the_sample_it_was_stacked_from() -> None:
    samples = [(np.arange(4, dtype=np.int32) + i, np.float32(i)) for i in range(3)]
    columns = [np.stack([s[0] for s in samples]), np.stack([s[1] for s in samples])]
    identity = batch_identity(7, 2, 3, columns)
    assert identity["sample_hashes"] == [sample_hash(s) for s in samples]
    assert identity["batch_hash"] == sample_hash(columns)
    assert batch_identity(7, 2, None, None) == {"step": 7, "epoch": 2, "position": None}


def test_the_list_appends_and_both_skippers_leave_listed_samples_out(tmp_path: Path) -> None:
    samples = [(np.full(2, i, dtype=np.int32),) for i in range(6)]
    listed = SkippedBatches(tmp_path)
    assert listed.read() == []
    wrapper = SkipListedSamples(samples, tmp_path)
    assert len(list(wrapper)) == 6
    assert listed.append([{"step": 1, "sample_hashes": [sample_hash(samples[1])]}]) == 1
    assert listed.append([{"step": 2, "sample_hashes": [sample_hash(samples[4])]}]) == 2
    assert [int(s[0][0]) for s in wrapper] == [0, 2, 3, 5] and wrapper.skipped == 2  # read again at each pass
    keep = KeepUnlisted(tmp_path)
    assert [keep(*s) for s in samples] == [True, False, True, True, False, True]
    (tmp_path / "skipped-batches.json").write_text("[1, 2]")
    with pytest.raises(ValueError, match="not a skipped-batches list"):
        listed.read()


def test_restore_writes_into_the_parameter_a_graph_compiled_before_reads(tmp_path: Path) -> None:
    """GRAPH mode: a forward graph compiled before the restore computes with the restored values."""
    ms.set_context(mode=ms.GRAPH_MODE)
    net = nn.Dense(3, 1)
    x = Tensor(np.ones((1, 3), np.float32))
    states = GoodStates("memory", 2**30, tmp_path, 1)
    states.bind(net)
    kept = states.capture(1)
    expected = net(x).asnumpy().copy()  # compiles
    for parameter in net.trainable_params():
        ops.assign(parameter, parameter * 10)
    assert not np.array_equal(net(x).asnumpy(), expected)
    states.restore(kept)
    np.testing.assert_array_equal(net(x).asnumpy(), expected)
    ms.set_context(mode=ms.PYNATIVE_MODE)


def test_keep_unlisted_filters_a_real_pipeline_before_batch(tmp_path: Path) -> None:
    """The recipe for sources other than GeneratorDataset: Dataset.filter with the predicate, then batch."""
    import mindspore.dataset as ds

    ids = np.arange(12, dtype=np.int32).reshape(6, 2)
    labels = np.arange(6, dtype=np.int32)
    SkippedBatches(tmp_path).append([{"sample_hashes": [sample_hash((ids[2], labels[2])),
                                                        sample_hash((ids[3], labels[3]))]}])
    dataset = ds.NumpySlicesDataset((ids, labels), ["ids", "label"], shuffle=False)
    dataset = dataset.filter(KeepUnlisted(tmp_path), input_columns=["ids", "label"]).batch(2)
    assert [row[1].tolist() for row in dataset.create_tuple_iterator(output_numpy=True)] == [[0, 1], [4, 5]]
