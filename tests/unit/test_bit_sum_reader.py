"""A reader of bit sums at every step: the same sums as device_reductions.bit_sums, whatever moved in memory."""

from __future__ import annotations

import mindspore as ms
import numpy as np
import pytest

from ms_exporter.core.device import device_reductions as d
from ms_exporter.core.device.bit_sum_reader import SMALL_VALUES, BitSumReader


def tensors() -> list[ms.Parameter]:
    """Small and large tensors of the dtypes a train network holds, and an empty one."""
    rng = np.random.default_rng(7)
    arrays = [
        rng.normal(size=(64, 64)).astype(np.float32),  # small: at the buffer's limit
        rng.normal(size=(SMALL_VALUES + 1,)).astype(np.float32),  # large
        rng.normal(size=(7,)).astype(np.float16),
        rng.normal(size=(300, 30)).astype(np.float16),
        np.arange(5, dtype=np.int32),  # a step counter
        rng.normal(size=(3,)).astype(np.float64),
        np.zeros((0,), np.float32),
        np.array([True, False, True]),
    ]
    return [ms.Parameter(ms.Tensor(a), name=f"p{i}") for i, a in enumerate(arrays)]


@pytest.fixture(autouse=True)
def in_place(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(d, "read_in_place", True)


def test_sums_equal_bit_sums_and_follow_the_memory_the_training_writes() -> None:
    params = tensors()
    reader = BitSumReader(params)
    assert reader.sums().tolist() == d.bit_sums(params).tolist()
    for position, param in enumerate(params[:4]):  # as the optimizer writes: in place, the memory stays put
        words = np.asarray(param.asnumpy()).reshape(-1).view(np.int32 if param.dtype == ms.float32 else np.int16)
        before = reader.sums()
        words[-1] ^= 1  # one unit in the last place
        after = reader.sums()
        assert after.tolist() == d.bit_sums(params).tolist()
        assert [i for i in range(len(params)) if before[i] != after[i]] == [position]


def test_a_tensor_given_new_memory_is_read_where_it_now_is() -> None:
    params = tensors()
    reader = BitSumReader(params)
    reader.sums()
    for param in (params[0], params[1]):  # set_data and load_param_into_net give a Parameter new memory
        param.set_data(ms.Tensor(np.full(param.shape, 0.5, np.float32)))
        assert reader.sums().tolist() == d.bit_sums(params).tolist()
    params[3].assign_value(ms.Tensor(np.ones(params[3].shape, np.float16)))
    assert reader.sums().tolist() == d.bit_sums(params).tolist()


def test_bfloat16_is_read_the_way_bit_sums_reads_it() -> None:
    """numpy has no bfloat16: such a list is read by bit_sums every time (a widening copy on the CPU target)."""
    params = [*tensors()[:2], ms.Parameter(ms.Tensor(np.ones(9, np.float32)).astype(ms.bfloat16), name="b")]
    assert BitSumReader(params).sums().tolist() == d.bit_sums(params).tolist()


def test_an_accelerator_reads_through_the_compiled_reduction(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(d, "read_in_place", False)
    params = [p for p in tensors() if p.size]
    assert BitSumReader(params).sums().tolist() == d.bit_sums(params).tolist()
