"""The reductions every per-layer feature reads through: equal to the host's arithmetic, one transfer, and the bit
sums' one-ulp property for every dtype training uses."""

from __future__ import annotations

import mindspore as ms
import numpy as np
import pytest

from ms_exporter.core.device import device_reductions as d
from ms_exporter.features.fingerprint import fingerprint
from tests.support.transfers import Transfers, count_transfers

TRAINING_DTYPES = ("float32", "float16", "bfloat16")
VIEWS_DTYPES = pytest.mark.skipif(
    not d.views_dtypes(), reason="this MindSpore has no Tensor.view(dtype): the bits are read on the host"
)


@pytest.fixture
def transfers(monkeypatch: pytest.MonkeyPatch) -> Transfers:
    return count_transfers(monkeypatch)


def bits_of(values: np.ndarray, dtype: str) -> np.ndarray:
    """The bit patterns of `values` (float32 on the host) once stored as `dtype`, as unsigned integers."""
    if dtype == "float32":
        return values.astype(np.float32).view(np.uint32).astype(np.int64)
    if dtype == "float16":
        return values.astype(np.float16).view(np.uint16).astype(np.int64)
    return values.astype(np.float32).view(np.uint32).astype(np.int64) >> 16  # values are exact bfloat16s


def signed_bits(values: np.ndarray, dtype: str) -> np.ndarray:
    """The bit patterns read as signed integers of the dtype's width, as the device reads them."""
    unsigned = bits_of(values, dtype)
    width = 32 if dtype == "float32" else 16
    return np.where(unsigned >= 2 ** (width - 1), unsigned - 2**width, unsigned)


def from_bits(bits: np.ndarray, dtype: str) -> np.ndarray:
    if dtype == "float32":
        return bits.astype(np.uint32).view(np.float32)
    if dtype == "float16":
        return bits.astype(np.uint16).view(np.float16).astype(np.float32)
    return (bits.astype(np.uint32) << 16).view(np.float32)


def modular(total: int) -> int:
    """An exact bit sum as the fingerprint keeps it: modulo 2^32 (words of up to 32 bits)."""
    return int(total) % 2**32


def parameter(values: np.ndarray, dtype: str, name: str) -> ms.Parameter:
    tensor = ms.Tensor(values.astype(np.float32))
    return ms.Parameter(tensor.astype(getattr(ms, dtype)), name=name)


def exact_values(rng: np.random.Generator, shape: tuple[int, ...], dtype: str) -> np.ndarray:
    """Random float32 values that `dtype` holds exactly (so the host knows the device's bits)."""
    values = rng.normal(0, 0.05, shape).astype(np.float32)
    if dtype == "bfloat16":  # its upper half, truncated
        return from_bits(values.view(np.uint32).astype(np.int64) >> 16, dtype)
    return from_bits(bits_of(values, dtype), dtype)


@pytest.mark.parametrize("in_place", [True, False], ids=["in place", "compiled"])
@pytest.mark.parametrize("dtype", TRAINING_DTYPES)
def test_one_unit_in_the_last_place_anywhere_changes_its_tensors_sum_and_the_fingerprint(
    dtype: str, in_place: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(d, "read_in_place", in_place)
    rng = np.random.default_rng(7)
    shapes = ((33, 17), (1000,), (4, 5, 6))
    values = [exact_values(rng, shape, dtype) for shape in shapes]
    parameters = [parameter(v, dtype, f"w{i}") for i, v in enumerate(values)]
    sums = d.bit_sums(parameters)
    assert sums.tolist() == [modular(signed_bits(v, dtype).sum()) for v in values]
    before = fingerprint(parameters)
    for _ in range(40):
        which = int(rng.integers(len(shapes)))
        position = int(rng.integers(values[which].size))
        step = int(rng.choice([-1, 1]))
        moved = values[which].copy().reshape(-1)
        moved[position] = from_bits(bits_of(moved[position : position + 1], dtype) + step, dtype)[0]
        assert moved[position] != values[which].reshape(-1)[position]
        changed = list(parameters)
        changed[which] = parameter(moved.reshape(values[which].shape), dtype, f"w{which}")
        new_sums = d.bit_sums(changed)
        assert new_sums[which] == modular(sums[which] + step)  # one unit: the neighbouring float's bit pattern
        assert np.array_equal(np.delete(new_sums, which), np.delete(sums, which))
        assert fingerprint(changed) != before


def test_equal_bits_give_equal_fingerprints_and_order_is_part_of_it() -> None:
    rng = np.random.default_rng(1)
    values = [rng.normal(size=shape).astype(np.float32) for shape in ((64, 64), (64,), (100, 8))]
    parameters = [parameter(v, "float32", f"p{i}") for i, v in enumerate(values)]
    same = [parameter(v.copy(), "float32", f"q{i}") for i, v in enumerate(values)]
    assert fingerprint(parameters) == fingerprint(same)
    assert fingerprint(parameters[::-1]) != fingerprint(parameters)


@VIEWS_DTYPES
def test_the_fingerprint_makes_one_transfer_of_8_bytes_a_tensor(transfers: Transfers) -> None:
    parameters = [parameter(np.ones((512, 512)), "float32", f"p{i}") for i in range(5)]
    transfers.clear()  # making a Parameter reads its value
    fingerprint(parameters)
    assert (transfers.calls, transfers.bytes) == (1, 5 * 8)


@pytest.mark.parametrize("dtype", TRAINING_DTYPES)
def test_norms_moments_and_histograms_equal_the_hosts_arithmetic(dtype: str, transfers: Transfers) -> None:
    rng = np.random.default_rng(3)
    values = [exact_values(rng, shape, dtype) for shape in ((200, 30), (77,))]
    parameters = [parameter(v, dtype, f"p{i}") for i, v in enumerate(values)]
    host = [v.astype(np.float64) for v in values]
    transfers.clear()  # making a Parameter reads its value
    assert d.norms(parameters) == pytest.approx([np.linalg.norm(v) for v in host], rel=1e-5)
    rows = d.moments(parameters)
    assert rows[:, 0] == pytest.approx([v.mean() for v in host], rel=1e-4, abs=1e-6)
    assert rows[:, 1] == pytest.approx([v.std() for v in host], rel=1e-4)
    rows = d.histograms(parameters, 16)
    for row, v in zip(rows, host):
        assert row[d.HIST_MIN] == v.min() and row[d.HIST_MAX] == v.max() and row[d.HIST_COUNT] == v.size
        assert row[d.HIST_SUM] == pytest.approx(v.sum(), rel=1e-4, abs=1e-4)
        counts = row[d.HISTOGRAM_HEAD :]
        assert counts.sum() == v.size
        assert np.abs(counts - np.histogram(v, 16)[0]).sum() <= 2  # a value on a bin edge may round either way
    # Compiling reads constants MindSpore folds; after that, each reduction is one read, whatever the tensor count.
    transfers.clear()
    d.norms(parameters), d.moments(parameters), d.histograms(parameters, 16)
    assert (transfers.calls, transfers.bytes) == (3, 4 * (2 + 2 * 3 + 2 * (5 + 16)))


@pytest.mark.parametrize(
    ("shape", "dtype", "drawn_values"),
    [
        ((300, 400), "float32", 163 * 400),  # whole rows: as many as fit in HISTOGRAM_SAMPLE
        ((300, 400), "bfloat16", 163 * 400),  # widened first where the device gathers no bfloat16
        ((2, 70_000), "float32", d.HISTOGRAM_SAMPLE),  # a row larger than the sample: positions
        ((70_000,), "float16", d.HISTOGRAM_SAMPLE),  # a vector: its rows are single values
    ],
)
def test_a_large_tensors_histogram_is_the_drawn_values_scaled_to_its_size(
    shape: tuple[int, ...], dtype: str, drawn_values: int, transfers: Transfers
) -> None:
    values = exact_values(np.random.default_rng(4), shape, dtype)
    drawn = d.drawn_positions(shape)
    assert drawn.size == drawn_values and np.unique(drawn).size == drawn.size and drawn.max() < values.size
    sample = values.reshape(-1)[drawn].astype(np.float64)
    tensor = parameter(values, dtype, "big")
    d.histograms([tensor], 16)  # compiles
    transfers.clear()
    row = d.histograms([tensor], 16)[0]
    assert (transfers.calls, transfers.bytes) == (1, 4 * (5 + 16))
    scale = values.size / drawn.size
    assert (row[d.HIST_MIN], row[d.HIST_MAX]) == (sample.min(), sample.max())
    assert row[d.HIST_COUNT] == pytest.approx(values.size)
    assert row[d.HIST_SUM] == pytest.approx(sample.sum() * scale, abs=1e-5 * np.abs(sample).sum() * scale)
    expected = np.histogram(sample, 16, range=(sample.min(), sample.max()))[0] * scale
    assert np.abs(row[d.HISTOGRAM_HEAD :] - expected).sum() <= 2 * scale  # a value on a bin edge may round either way


def test_a_histogram_counts_non_finite_values_out() -> None:
    values = np.array([1.0, 2.0, np.inf, np.nan, 3.0], np.float32)
    row = d.histograms([parameter(values, "float32", "p")], 4)[0]
    assert (row[d.HIST_MIN], row[d.HIST_MAX], row[d.HIST_COUNT], row[d.HIST_SUM]) == (1.0, 3.0, 3.0, 6.0)
    assert row[d.HISTOGRAM_HEAD :].sum() == 3


@pytest.mark.parametrize("dtype", TRAINING_DTYPES)
def test_gathered_values_are_the_tensors_own_at_those_positions(dtype: str, transfers: Transfers) -> None:
    rng = np.random.default_rng(5)
    values = [exact_values(rng, shape, dtype) for shape in ((50, 40), (9,))]
    parameters = [parameter(v, dtype, f"p{i}") for i, v in enumerate(values)]
    positions = [np.sort(rng.choice(v.size, size=min(v.size, 25), replace=False)).astype(np.int32) for v in values]
    where = [d.positions_in(v.shape, p) for v, p in zip(values, positions)]
    transfers.clear()  # making a Parameter reads its value
    picked = d.gathered(parameters, where)
    expected = np.concatenate([v.reshape(-1)[p] for v, p in zip(values, positions)])
    assert np.array_equal(picked, expected)
    assert (transfers.calls, transfers.bytes) == (1, 4 * (25 + 9))


def test_compiling_a_histogram_reads_nothing_of_the_tensors_size(transfers: Transfers) -> None:
    """MindSpore folds a full_like/ones_like of a tensor into a host constant of its size when it compiles: at the
    first sampled step of a large embedding that would be gigabytes."""
    fresh = parameter(np.random.default_rng(2).normal(size=(1000, 1000)).astype(np.float32), "float32", "big")
    transfers.clear()
    d.histograms([fresh], 64)  # the first call compiles
    assert transfers.bytes < 4096


def test_tensors_past_a_bucket_are_reduced_in_several_calls_and_still_read_once(
    monkeypatch: pytest.MonkeyPatch, transfers: Transfers
) -> None:
    """A call's intermediates live together: a bucket bounds them, and the buckets' results join on the device."""
    monkeypatch.setattr(d, "BUCKET_VALUES", 1000)
    rng = np.random.default_rng(4)
    values = [exact_values(rng, shape, "float32") for shape in ((30, 20), (700,), (1500,), (5,))]
    parameters = [parameter(v, "float32", f"p{i}") for i, v in enumerate(values)]
    host = [v.astype(np.float64) for v in values]
    d.norms(parameters), d.bit_sums(parameters), d.moments(parameters), d.histograms(parameters, 8)
    positions = [d.positions_in(v.shape, np.arange(min(v.size, 7))) for v in values]
    d.gathered(parameters, positions)
    assert d.bit_sums(parameters).tolist() == [modular(signed_bits(v, "float32").sum()) for v in values]
    transfers.clear()
    assert d.norms(parameters) == pytest.approx([np.linalg.norm(v) for v in host], rel=1e-5)
    assert d.moments(parameters)[:, 0] == pytest.approx([v.mean() for v in host], rel=1e-4, abs=1e-6)
    assert d.histograms(parameters, 8)[:, d.HIST_COUNT].tolist() == [v.size for v in values]
    picked = d.gathered(parameters, positions)
    assert np.array_equal(picked, np.concatenate([v.reshape(-1)[:7] for v in values]))
    assert transfers.calls == 4


@VIEWS_DTYPES
def test_the_cpus_float64_way_of_adding_the_bits_equals_the_integer_way(monkeypatch: pytest.MonkeyPatch) -> None:
    """On CPU the bits are added by a float64 matrix-vector product (exact below 2^53); accelerators add int64s."""
    rng = np.random.default_rng(9)
    parameters = [
        parameter(exact_values(rng, shape, "float32"), "float32", f"p{i}") for i, shape in enumerate(((64, 300), (77,)))
    ]
    monkeypatch.setattr(d, "read_in_place", False)  # compiled, as on a device
    monkeypatch.setattr(d, "_EXACT_COLUMNS", 0)  # every tensor the integer way
    integer_way = d._Compiled(d._bit_sums_body)
    words = [d.bit_words(p) for p in parameters]
    exact = [int(signed_bits(p.asnumpy(), "float32").sum()) for p in parameters]
    assert d.to_host(integer_way(*words)).tolist() == exact
    monkeypatch.setattr(d, "_EXACT_COLUMNS", 1 << 21)
    assert d.bit_sums(parameters).tolist() == [modular(s) for s in exact]


@pytest.mark.parametrize("dtype", TRAINING_DTYPES)
def test_reading_in_place_gives_the_compiled_reductions_numbers(dtype: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """On MindSpore's CPU target the weight norms and bit sums read the tensors' own memory (no copy) with numpy:
    the same bit sums exactly, the same square sums to float32 rounding; a dtype numpy has no arithmetic for runs
    compiled."""
    rng = np.random.default_rng(11)
    values = [exact_values(rng, shape, dtype) for shape in ((300, 70), (70,), (3, 4, 5))]
    parameters = [parameter(v, dtype, f"p{i}") for i, v in enumerate(values)]
    monkeypatch.setattr(d, "read_in_place", False)
    compiled = d.square_sums(parameters), d.bit_sums(parameters)
    monkeypatch.setattr(d, "read_in_place", True)
    in_place = d.square_sums(parameters), d.bit_sums(parameters)
    assert in_place[0] == pytest.approx(compiled[0], rel=1e-5)
    assert in_place[1].tolist() == compiled[1].tolist() == [modular(signed_bits(v, dtype).sum()) for v in values]
    arrays = d._in_place(parameters, ("Float32",))
    if dtype == "float32":
        assert arrays is not None and all(np.shares_memory(a, p.asnumpy()) for a, p in zip(arrays, parameters))
    else:
        assert arrays is None


@pytest.mark.parametrize("dtype", ["float32", "float16"])
def test_histograms_and_gathers_in_place_give_the_compiled_numbers(dtype: str, monkeypatch: pytest.MonkeyPatch) -> None:
    rng = np.random.default_rng(12)
    values = [exact_values(rng, shape, dtype) for shape in ((300, 400), (2, 70_000), (70,), (3, 4, 5))]
    values[2][5] = np.inf  # left out of the histogram's sums and counts either way
    parameters = [parameter(v, dtype, f"p{i}") for i, v in enumerate(values)]
    where = [d.positions_in(v.shape, d.fixed_positions(v.size, 50, seed=i)) for i, v in enumerate(values)]
    results = {}
    for in_place in (False, True):
        monkeypatch.setattr(d, "read_in_place", in_place)
        results[in_place] = d.histograms(parameters, 16), d.gathered(parameters, where)
    (compiled_rows, compiled_picked), (rows, picked) = results[False], results[True]
    assert np.array_equal(picked, compiled_picked)
    head = slice(0, d.HISTOGRAM_HEAD)
    assert np.array_equal(rows[:, : d.HIST_SUM], compiled_rows[:, : d.HIST_SUM])  # min, max, count: exact
    assert rows[:, d.HIST_SUM : head.stop] == pytest.approx(
        compiled_rows[:, d.HIST_SUM : head.stop], rel=1e-4, abs=1e-3
    )
    for row, compiled_row, v in zip(rows, compiled_rows, values):
        scale = v.size / d.drawn_positions(v.shape).size
        assert np.abs(row[head.stop :] - compiled_row[head.stop :]).sum() <= 2 * scale  # a value on a bin edge
