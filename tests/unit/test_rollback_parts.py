"""actions.rollback's parts: the health score, what a divergence is, the loop guard, the kept states and the
poisoned-batch list (the whole action runs in tests/integration/test_rollback.py)."""

from __future__ import annotations

import logging
import math
import os
import threading
import time
from pathlib import Path
from typing import Any

import mindspore as ms
import numpy as np
import pytest
from mindspore import Tensor, nn, ops

from ms_exporter.actions.good_state import GoodStates
from ms_exporter.actions.health import HealthScore, hottest_accelerator
from ms_exporter.actions.rollback import LoopGuard, divergence_of
from ms_exporter.actions.skipped_batches import (
    KeepUnlisted,
    SkipListedSamples,
    SkippedBatches,
    batch_identity,
    sample_hash,
)
from ms_exporter.config import load_config
from ms_exporter.core import catalogue
from ms_exporter.core.store import MetricStore

NAN = math.nan


def test_health_is_the_worst_of_its_terms() -> None:
    health = HealthScore(span=2, grad_high=10, grad_exploding=100, memory_growth_limit=0.3)
    assert health.observe(2.0, 2.0, NAN, NAN).score == 1.0  # nothing known against it
    health.observe(2.0, 2.0, NAN, NAN)
    rising = health.observe(2.0, 2.5, 55.0, 0.15)  # smoothed +25% over the span: half way to 0
    assert (rising.loss, rising.grad, rising.memory) == (pytest.approx(0.5), pytest.approx(0.5), pytest.approx(0.5))
    assert health.observe(2.0, 2.5, 1000.0, 0.0).score == 0.0  # past the exploding norm
    assert health.observe(math.inf, 2.5, 1.0, 0.0).score == 0.0
    worn = health.observe(2.0, 2.5, 1.0, 0.3)
    assert worn.score == 0.0 and worn.replica_score > 0  # memory growth is left out of the replicas' decision


def test_a_hot_accelerator_lowers_the_health_and_only_this_ranks_score() -> None:
    health = HealthScore(span=2, grad_high=10, grad_exploding=100, memory_growth_limit=0.3, hot_celsius=85)
    assert health.observe(2.0, 2.0, NAN, NAN, 84.0).hardware == 1.0
    warm = health.observe(2.0, 2.0, NAN, NAN, 92.5)  # half way from 85 °C to 100 °C
    assert warm.hardware == pytest.approx(0.5) and warm.score == pytest.approx(0.5)
    assert warm.replica_score == 1.0  # one rank's device is not the replicas' business
    assert health.observe(2.0, 2.0, NAN, NAN, 101.0).score == 0.0
    assert health.observe(2.0, 2.0, NAN, NAN).hardware == 1.0  # no accelerator read: no evidence against


def test_the_hottest_accelerator_leaves_the_host_out() -> None:
    store = MetricStore()
    temperature = store.register(catalogue.DEVICE_TEMPERATURE)
    assert math.isnan(hottest_accelerator(store))
    temperature.series(device="host").value = 99.0  # a CPU's own limits: not the accelerators' term
    assert math.isnan(hottest_accelerator(store))
    temperature.series(device="npu0").value = 70.0
    temperature.series(device="npu1").value = 88.0
    assert hottest_accelerator(store) == 88.0


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
    states.finished(wait=60)  # a file is written in the background
    kept = states._kept[0]
    assert [s.step for s in states._kept] == [2, 3]
    pid = os.getpid()
    assert sorted(p.name for p in tmp_path.glob("*.npz")) == (
        [f"good-run-rank0-pid{pid}-step000000000002-2.npz", f"good-run-rank0-pid{pid}-step000000000003-3.npz"]
        if storage == "disk"
        else []
    )
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


def test_a_device_copy_does_not_change_when_the_parameter_trains_on(tmp_path: Path) -> None:
    """A good state in memory is a copy in memory of its own: on CPU, where asnumpy shares a Parameter's memory, a
    copy that shared it would follow the training."""
    ms.set_context(mode=ms.PYNATIVE_MODE)
    net = nn.Dense(3, 2)
    optimizer = nn.Adam(net.trainable_params(), 0.1)
    train = nn.TrainOneStepCell(nn.WithLossCell(net, nn.MSELoss()), optimizer)
    states = GoodStates("memory", 2**30, tmp_path, max_kept=1)
    states.bind(train)
    x, y = Tensor(np.ones((4, 3), np.float32)), Tensor(np.zeros((4, 2), np.float32))
    train(x, y)
    state = states.capture(1)
    assert state.tensors is not None and state.path is None and state.written.is_set()
    at_capture = [p.asnumpy().copy() for p in states._parameters]
    for _ in range(3):
        train(x, y)
    moved = [not np.array_equal(p.asnumpy(), v) for p, v in zip(states._parameters, at_capture)]
    assert sum(moved) >= 4, moved  # weight, bias, both moments of each, the step
    for name, parameter, copy, value in zip(states.names, states._parameters, state.tensors, at_capture):
        assert copy.dtype == parameter.dtype and copy.shape == parameter.shape, name
        np.testing.assert_array_equal(copy.asnumpy(), value, err_msg=name)
    states.close()


def _bfloat16_bits() -> np.ndarray:
    # 1, -0, the smallest subnormal, the smallest normal, the largest finite, -inf, a NaN with a payload, pi's bits
    return np.array([0x3F80, 0x8000, 0x0001, 0x0080, 0x7F7F, 0xFF80, 0x7FC5, 0x4049], np.uint16)


def _bits_of(tensor: Tensor) -> np.ndarray:
    return np.array(tensor.asnumpy().view(np.uint16), copy=True)


@pytest.mark.parametrize("storage", ["memory", "disk"])
def test_a_bfloat16_parameter_comes_back_bit_for_bit(storage: str, tmp_path: Path) -> None:
    from mindspore import Parameter
    from mindspore.common import np_dtype

    ms.set_context(mode=ms.PYNATIVE_MODE)
    net = nn.Cell()
    net.w = Parameter(Tensor(_bfloat16_bits().view(np_dtype.bfloat16)), name="w")
    assert net.w.dtype == ms.bfloat16
    states = GoodStates(storage, 2**30, tmp_path, max_kept=1)
    states.bind(net)
    state = states.capture(1)
    net.w.copy_(Tensor(np.zeros(8, np.float32)).astype(ms.bfloat16))  # Assign has no bfloat16 kernel on CPU
    assert not _bits_of(net.w).any()
    if storage == "memory":
        assert state.tensors is not None and state.tensors[0].dtype == ms.bfloat16  # kept as bfloat16, no widening
    else:
        assert [s.error for s in states.finished(wait=60)] == [None]
        assert state.path is not None
        with np.load(state.path) as saved:  # the raw bits, and the dtype they are
            assert saved["p0"].dtype == np.uint16 and list(saved["dtypes"]) == ["BFloat16"]
            np.testing.assert_array_equal(saved["p0"], _bfloat16_bits())
    assert states.restore_newest() is state
    assert net.w.dtype == ms.bfloat16
    np.testing.assert_array_equal(_bits_of(net.w), _bfloat16_bits())
    states.close()


def test_without_numpys_bfloat16_a_bfloat16_parameter_still_comes_back_from_disk(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Where MindSpore's numpy bfloat16 type is missing (a numpy of another major version), the device copy is
    widened to float32 and the file holds float32: a restore casts it back, every number bit for bit (a NaN comes
    back a NaN, its payload not kept)."""
    from mindspore import Parameter
    from mindspore.common import np_dtype

    from ms_exporter.actions import good_state

    ms.set_context(mode=ms.PYNATIVE_MODE)
    net = nn.Cell()
    net.w = Parameter(Tensor(_bfloat16_bits().view(np_dtype.bfloat16)), name="w")
    monkeypatch.setattr(good_state, "_numpy_bfloat16", lambda: None)
    states = GoodStates("disk", 2**30, tmp_path, max_kept=1)
    states.bind(net)
    state = states.capture(1)
    assert [s.error for s in states.finished(wait=60)] == [None] and state.path is not None
    with np.load(state.path) as saved:
        assert saved["p0"].dtype == np.float32 and list(saved["dtypes"]) == ["BFloat16"]
    net.w.copy_(Tensor(np.zeros(8, np.float32)).astype(ms.bfloat16))
    assert states.restore_newest() is state and net.w.dtype == ms.bfloat16
    restored, nan = _bits_of(net.w), 6
    np.testing.assert_array_equal(np.delete(restored, nan), np.delete(_bfloat16_bits(), nan))
    assert restored[nan] & 0x7F80 == 0x7F80 and restored[nan] & 0x007F  # a NaN
    states.close()


def _gate_writes(monkeypatch: pytest.MonkeyPatch) -> tuple[threading.Event, threading.Event]:
    """Writes from now on start, then wait for the gate: (started, gate)."""
    from ms_exporter.actions import good_state

    started, gate = threading.Event(), threading.Event()
    write = good_state._write_npz

    def gated(*arguments: Any) -> None:
        started.set()
        gate.wait(60)
        write(*arguments)

    monkeypatch.setattr(good_state, "_write_npz", gated)
    return started, gate


def test_a_restore_waits_for_the_state_still_being_written(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    net, states = _dense_states(tmp_path)
    x = Tensor(np.ones((1, 3), np.float32))
    states.capture(10)
    states.finished(wait=60)
    for parameter in net.trainable_params():
        ops.assign(parameter, parameter * 3)
    at_20 = net(x).asnumpy().copy()
    started, gate = _gate_writes(monkeypatch)
    state = states.capture(20)  # returns while the file is being written
    assert started.wait(60) and not state.written.is_set() and states.newest is state
    for parameter in net.trainable_params():
        ops.assign(parameter, parameter * 5)
    opens = threading.Timer(0.3, gate.set)  # a restore that did not wait would find no file and take step 10's
    opens.start()
    restored = states.restore_newest()
    opens.join()
    assert restored is state and states.kept_steps == [10, 20]
    np.testing.assert_array_equal(net(x).asnumpy(), at_20)
    assert [s.step for s in states.finished()] == [20]  # reported once, kept
    states.close()


def test_a_write_that_takes_too_long_gives_way_to_the_state_before(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    ms.set_context(mode=ms.PYNATIVE_MODE)
    net = nn.Dense(3, 2)
    states = GoodStates("disk", 0, tmp_path, max_kept=2, write_wait=0.05)
    states.bind(net)
    x = Tensor(np.ones((1, 3), np.float32))
    states.capture(10)
    states.finished(wait=60)
    at_10 = net(x).asnumpy().copy()
    for parameter in net.trainable_params():
        ops.assign(parameter, parameter * 3)
    started, gate = _gate_writes(monkeypatch)
    late = states.capture(20)
    assert started.wait(60)
    with caplog.at_level(logging.WARNING, logger="ms_exporter"):
        assert states.restore_newest() is not late
    np.testing.assert_array_equal(net(x).asnumpy(), at_10)
    assert any(
        "step 20 is still being written after 0.05 s; trying the one of step 10" in r.getMessage()
        for r in caplog.records
    )
    gate.set()
    assert states.finished(wait=60) == [late] and late.error is None and states.kept_steps == [10, 20]
    states.close()
    assert list(tmp_path.iterdir()) == []


def test_a_write_that_fails_keeps_nothing_and_leaves_no_temporary(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from ms_exporter.actions import good_state

    net, states = _dense_states(tmp_path)
    states.capture(10)
    states.finished(wait=60)
    write = good_state._write_npz

    def full(file: Any, arrays: Any, dtypes: Any) -> None:
        file.write(b"half an archive")
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(good_state, "_write_npz", full)
    failed = states.capture(20)
    [ended] = states.finished(wait=60)
    assert ended is failed and isinstance(failed.error, OSError) and failed.error.errno == 28
    assert states.kept_steps == [10] and states.newest is not failed
    kept = states._kept[0].path
    assert kept is not None and list(tmp_path.iterdir()) == [kept]  # no temporary
    monkeypatch.setattr(good_state, "_write_npz", write)
    states.capture(30)  # the next keep writes as before
    assert [s.error for s in states.finished(wait=60)] == [None] and states.kept_steps == [10, 30]
    states.close()
    assert list(tmp_path.iterdir()) == []


class _RunContext:
    def __init__(self, cb_params: dict[str, Any]) -> None:
        self.cb_params = cb_params

    def original_args(self) -> dict[str, Any]:
        return self.cb_params

    def request_stop(self) -> None:
        raise AssertionError("nothing here stops the training")


def test_a_write_that_failed_before_the_step_looked_is_a_keep_that_failed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The background write can fail (a full disk) before the training thread looks at the state it just took:
    that is a keep that failed, tried again at the next step and switched off after 3, never a state kept."""
    from ms_exporter.actions import good_state
    from ms_exporter.actions.runner import ActionRunner
    from tests.support.samples import sample

    def full(file: Any, arrays: Any, dtypes: Any) -> None:
        raise OSError(28, "No space left on device")

    start = good_state.GoodStates._start_write

    def ended_before_capture_returns(self: GoodStates, step: int, copies: list[Any]) -> Any:
        state = start(self, step, copies)
        state.written.wait(60)
        return state

    monkeypatch.setattr(good_state, "_write_npz", full)
    monkeypatch.setattr(good_state.GoodStates, "_start_write", ended_before_capture_returns)
    rollback = {"enable": True, "storage": "disk", "good_every": 5, "quiet_steps": 1, "min_health": 0}
    store = MetricStore()
    runner = ActionRunner(load_config({"save_dir": str(tmp_path), "actions": {"rollback": rollback}}), store)
    cb_params: dict[str, Any] = {"train_network": nn.Dense(2, 2), "cur_step_num": 0}
    runner.on_train_begin(cb_params)
    for step in range(1, 11):
        cb_params["cur_step_num"] = step
        runner.act(sample(step), _RunContext(cb_params))
    errors = {dict(s.labels)["component"]: s.value for s in store.series_of(catalogue.ERRORS)}
    assert errors["actions.rollback.keep"] == 3  # steps 5, 6 and 7, then switched off
    assert store.value_of(catalogue.LAST_GOOD_STEP) == 0  # none kept (the gauge starts at 0)
    assert list(tmp_path.glob("good-states/*")) == []
    runner.close()


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
    SkippedBatches(tmp_path).append(
        [{"sample_hashes": [sample_hash((ids[2], labels[2])), sample_hash((ids[3], labels[3]))]}]
    )
    dataset = ds.NumpySlicesDataset((ids, labels), ["ids", "label"], shuffle=False)
    dataset = dataset.filter(KeepUnlisted(tmp_path), input_columns=["ids", "label"]).batch(2)
    assert [row[1].tolist() for row in dataset.create_tuple_iterator(output_numpy=True)] == [[0, 1], [4, 5]]


# -- actions that fail alone (docs/reliability.md) ----------------------------------------------------------------


def _dense_states(directory: Path, max_kept: int = 2) -> tuple[nn.Cell, GoodStates]:
    ms.set_context(mode=ms.PYNATIVE_MODE)
    net = nn.Dense(3, 2)
    states = GoodStates("disk", 0, directory, max_kept=max_kept)
    states.bind(net)
    return net, states


def test_a_good_state_that_cannot_be_read_is_removed_and_the_one_before_restored(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    net, states = _dense_states(tmp_path)
    x = Tensor(np.ones((1, 3), np.float32))
    states.capture(10)
    at_10 = net(x).asnumpy().copy()
    for parameter in net.trainable_params():
        ops.assign(parameter, parameter * 3)
    newest = states.capture(20)
    states.finished(wait=60)
    assert newest.path is not None
    newest.path.write_bytes(newest.path.read_bytes()[:100])  # truncated, as by a full disk or a killed copy
    for parameter in net.trainable_params():
        ops.assign(parameter, parameter * 5)
    with caplog.at_level(logging.WARNING, logger="ms_exporter"):
        restored = states.restore_newest()
    assert restored is not None and restored.step == 10
    np.testing.assert_array_equal(net(x).asnumpy(), at_10)
    assert not newest.path.exists() and states.kept_steps == [10]
    [said] = [r.getMessage() for r in caplog.records if "cannot be read back" in r.getMessage()]
    assert "step 20" in said and "trying the one of step 10" in said
    restored.path.write_bytes(b"")  # and when none can be read: None, nothing written
    assert states.restore_newest() is None and states.kept_steps == []


def test_good_states_and_the_list_replace_planted_links_never_follow_them(tmp_path: Path) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    victims = {name: outside / name for name in ("state", "partial", "list", "lock", "list-partial")}
    for victim in victims.values():
        victim.write_bytes(b"the training user's file")
    directory = tmp_path / "good-states"
    directory.mkdir()
    net, states = _dense_states(directory)
    pid = os.getpid()
    final = directory / f"good-run-rank0-pid{pid}-step000000000001-1.npz"
    final.symlink_to(victims["state"])
    (directory / "good-step000000000001-1.npz.partial").symlink_to(victims["partial"])  # an older version's name
    (tmp_path / "skipped-batches.json").symlink_to(victims["list"])
    (tmp_path / "skipped-batches.json.lock").symlink_to(victims["lock"])
    (tmp_path / f"skipped-batches.json.{pid}.partial").symlink_to(victims["list-partial"])
    states.capture(1)
    assert [s.error for s in states.finished(wait=60)] == [None]
    assert [victims[n].read_bytes() for n in ("state", "partial")] == [b"the training user's file"] * 2
    assert final.is_file() and not final.is_symlink()  # the link was replaced by the state
    assert SkippedBatches(tmp_path).append([{"step": 1}]) == 1  # the linked list is moved aside, a new one begins
    assert SkippedBatches(tmp_path).read() == [{"step": 1}]
    for victim in victims.values():
        assert victim.read_bytes() == b"the training user's file", victim
    assert list(tmp_path.glob("skipped-batches.json.unusable-*")) != []


def test_a_corrupt_list_is_moved_aside_and_a_new_one_started(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    path = tmp_path / "skipped-batches.json"
    path.write_text('{"version": 1, "batches": [{"step": 3}')  # torn
    with caplog.at_level(logging.WARNING, logger="ms_exporter"):
        assert SkippedBatches(tmp_path).append([{"step": 7}]) == 1
    assert SkippedBatches(tmp_path).read() == [{"step": 7}]
    [aside] = tmp_path.glob("skipped-batches.json.unusable-*-corrupt")
    assert aside.read_text() == '{"version": 1, "batches": [{"step": 3}'  # kept for a look
    [said] = [r.getMessage() for r in caplog.records if "moved aside" in r.getMessage()]
    assert str(path) in said and "not valid JSON" in said


@pytest.mark.parametrize("helper", ["SkipListedSamples", "KeepUnlisted"])
def test_the_dataset_helpers_name_a_corrupt_list_and_what_is_wrong(
    helper: str, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    path = tmp_path / "skipped-batches.json"
    path.write_text("{not json")

    def make() -> object:
        return (
            SkipListedSamples([(np.zeros(2),)], tmp_path) if helper == "SkipListedSamples" else KeepUnlisted(tmp_path)
        )

    with pytest.raises(ValueError, match=f"{path}: not a skipped-batches list \\(not valid JSON"):
        make()
    samples = [(np.full(2, i, dtype=np.int32),) for i in range(3)]
    SkippedBatches(tmp_path).append([{"sample_hashes": [sample_hash(samples[1])]}])  # moved aside, listed anew
    made = make()
    path.write_text("[]")  # a later pass that finds it broken keeps what it had, and says so
    os.utime(path, ns=(1, 1))
    with caplog.at_level(logging.WARNING, logger="ms_exporter"):
        if isinstance(made, SkipListedSamples):
            made._source = samples
            assert [int(s[0][0]) for s in made] == [0, 2]
        else:
            assert isinstance(made, KeepUnlisted)
            assert [made(*s) for s in samples] == [True, False, True]
    assert any("still left out" in r.getMessage() and str(path) in r.getMessage() for r in caplog.records)


def test_leftovers_of_earlier_processes_of_this_run_and_rank_are_removed_at_the_start(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    from ms_exporter.actions.runner import ActionRunner
    from ms_exporter.core.store import MetricStore

    config = load_config(
        {"save_dir": str(tmp_path), "run_id": "job7", "actions": {"rollback": {"enable": True, "storage": "disk"}}}
    )
    states = tmp_path / "good-states"
    states.mkdir()
    old = 1_000_000_000  # long before this process started
    pid = os.getpid()
    gone = [
        states / "good-job7-rank0-pid99999-step000000000100-1.npz",  # a killed process of this run and rank
        states / ".good-job7-rank0-pid99999-step000000000200-2.npz.k3j_x9.partial",
        states / f"good-job7-rank0-pid{pid}-step000000000300-1.npz",  # this pid, but older than this process
        states / "good-step000000000100-1.npz.partial",  # a temporary named by an older version
        tmp_path / "skipped-batches.json.4242.partial",
        tmp_path / ".skipped-batches.json.ab_12x.partial",
    ]
    stay = [
        states / "good-job7-rank1-pid99999-step000000000100-1.npz",  # another rank
        states / "good-job8-rank0-pid99999-step000000000100-1.npz",  # another run
        states / "good-step000000000100-1.npz",  # no rank in its name: whose it is cannot be told
        tmp_path / ".skipped-batches.json.live_1.partial",  # a live rank's append, younger than this process
        tmp_path / "skipped-batches.json",
    ]
    for path in (*gone, *stay):
        path.write_bytes(b"x")
        if path.name != ".skipped-batches.json.live_1.partial":
            os.utime(path, (old, old))
    runner = ActionRunner(config, MetricStore())
    with caplog.at_level(logging.WARNING, logger="ms_exporter"):
        runner.on_train_begin({"train_network": nn.Dense(2, 2), "cur_step_num": 0})
    assert [p.name for p in gone if p.exists()] == []
    assert [p.name for p in stay if not p.exists()] == []
    [said] = [r.getMessage() for r in caplog.records if "left behind" in r.getMessage()]
    assert f"removed {len(gone)} files" in said
    runner.close()


def test_the_runner_reports_a_backed_off_learning_rate_through_the_learning_rate_probe_it_is_given() -> None:
    from ms_exporter.actions.runner import ActionRunner
    from ms_exporter.core.store import MetricStore
    from ms_exporter.probes.learning_rate import LearningRateProbe
    from ms_exporter.probes.loss import LossProbe

    store = MetricStore()
    probe = LearningRateProbe(store)
    runner = ActionRunner(
        load_config({"actions": {"lr_backoff": {"enable": True}}}), store, followers=[LossProbe(store, 5), probe]
    )
    assert runner._lr_probe is probe
    runner.close()


def test_a_keep_due_while_the_state_before_is_being_written_waits_for_the_next_quiet_step_not_for_the_disk(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from ms_exporter.actions.runner import ActionRunner
    from tests.support.samples import sample

    started, gate = _gate_writes(monkeypatch)
    rollback = {"enable": True, "storage": "disk", "good_every": 2, "quiet_steps": 1, "min_health": 0}
    store = MetricStore()
    runner = ActionRunner(load_config({"save_dir": str(tmp_path), "actions": {"rollback": rollback}}), store)
    cb_params: dict[str, Any] = {"train_network": nn.Dense(2, 2), "cur_step_num": 0}
    runner.on_train_begin(cb_params)
    try:
        for step in range(1, 7):  # step 2 keeps; its write hangs at the gate; 4 and 6 come due meanwhile
            cb_params["cur_step_num"] = step
            began = time.perf_counter()
            runner.act(sample(step), _RunContext(cb_params))
            assert time.perf_counter() - began < 30  # a keep that waited would sit at the gate for 60 s
        assert started.wait(30) and store.value_of(catalogue.LAST_GOOD_STEP) == 0  # still being written
        gate.set()
        for step in range(7, 10):
            cb_params["cur_step_num"] = step
            runner.act(sample(step), _RunContext(cb_params))
        deadline = time.monotonic() + 60
        while store.value_of(catalogue.LAST_GOOD_STEP) < 8 and time.monotonic() < deadline:
            cb_params["cur_step_num"] = step = step + 1
            runner.act(sample(step), _RunContext(cb_params))
        assert store.value_of(catalogue.LAST_GOOD_STEP) >= 8  # keeping went on once the write ended
        errors = {dict(s.labels)["component"]: s.value for s in store.series_of(catalogue.ERRORS)}
        assert errors["actions.rollback.keep"] == 0  # a postponed keep is no failure
    finally:
        gate.set()
        runner.close()
