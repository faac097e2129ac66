"""Statistics of many tensors reduced where the tensors live, by one compiled MindSpore function, into one small
tensor that crosses to the host in one transfer.

Every per-layer feature (weight and gradient norms, update ratios, LayerNorm statistics, fingerprints, histograms)
reads its tensors through one of these: the bytes that reach the host per sample are a few per tensor, whatever the
tensors' sizes, and the host does no arithmetic over parameters. Each reduction takes every tensor as an argument
of its own: MindSpore's compiler takes a tuple argument for a constant and would compile again at every call.
MindSpore compiles a reduction at its first call and again only when the tensors' shapes or dtypes change.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

# Where the values of a histogram row sit (HISTOGRAM_HEAD numbers, then one count per bin).
HIST_MIN, HIST_MAX, HIST_COUNT, HIST_SUM, HIST_SUM_SQUARES = range(5)
HISTOGRAM_HEAD = 5
# A tensor of more values is histogrammed from at most this many values at fixed random places (its counts and sums
# scaled to its size): a histogram is a picture of the distribution, and the whole of a large tensor would cost a pass
# and several tensor-sized intermediates on the device for it.
HISTOGRAM_SAMPLE = 1 << 16
# Widest rows the CPU's exact float64 bit sums take: a row's sum stays under 2^53.
_EXACT_COLUMNS = 1 << 21


# Tensors reduced by one call at most, in values: a call's intermediates (a float32 widening, squares, masks) live
# together on the device, so a bucket bounds them to a few hundred MB however large the model (a larger tensor is a
# bucket of its own). The buckets' results are joined on the device: still one transfer.
BUCKET_VALUES = 1 << 24


class _Compiled:
    """A reduction body compiled with ms.jit on first use (MindSpore imported then, not at import)."""

    def __init__(self, make: Callable[[], Callable[..., Any]]) -> None:
        self._make = make
        self._compiled: Callable[..., Any] | None = None
        self._lock = threading.Lock()

    def __call__(self, *arguments: Any) -> Any:
        if self._compiled is None:
            with self._lock:
                if self._compiled is None:
                    import mindspore as ms

                    self._compiled = ms.jit(self._make())
        return self._compiled(*arguments)

    def over(self, arguments: Sequence[Any], per: int = 1) -> Any:
        """The reduction over buckets of consecutive tensors (`per` arguments a tensor, its size read from the first),
        joined along the first axis on the device. The buckets fall the same way at every sample, so each bucket's
        shapes compile once."""
        buckets: list[list[Any]] = []
        current: list[Any] = []
        values = 0
        for start in range(0, len(arguments), per):
            size = int(arguments[start].size)
            if current and values + size > BUCKET_VALUES:
                buckets.append(current)
                current, values = [], 0
            current.extend(arguments[start : start + per])
            values += size
        if current:
            buckets.append(current)
        results = [self(*bucket) for bucket in buckets]
        if len(results) == 1:
            return results[0]
        from mindspore import ops

        return ops.cat(results)


def _square_sums_body() -> Callable[..., Any]:
    import mindspore as ms
    from mindspore import ops

    float32 = ms.float32

    def square_sums(*tensors: Any) -> Any:
        sums = []
        for t in tensors:
            x = t.astype(float32)
            columns = x.shape[-1] if len(x.shape) > 1 else 1
            # Rows summed by a matrix-vector product, then the rows: MindSpore's CPU ReduceSum runs about 5x slower
            # than its matmul over the same values (150 ms against 30 ms for 25 M on 2 cores), and a device's
            # matrix unit sums as well as its reduction does. x * x: MindSpore's CPU Square is slower (16 ms against
            # 13 ms for 25 M).
            rows = ops.matmul((x * x).reshape(-1, columns), ops.ones((columns, 1), float32))
            sums.append(rows.sum())
        return ops.stack(sums)

    return square_sums


def _moments_body() -> Callable[..., Any]:
    import mindspore as ms
    from mindspore import ops

    float32 = ms.float32

    def moments(*tensors: Any) -> Any:
        rows = []
        for t in tensors:
            x = t.astype(float32).reshape(-1)
            # Around the first value: values near 1 with a spread of 1e-5 differ from it exactly (Sterbenz), and the
            # mean of those differences keeps digits a float32 mean of the values themselves would round away. The
            # host adds the two in float64.
            shift = x[0]
            offset = ops.mean(x - shift)
            centred = x - shift - offset  # the spread in a second pass: no E[x^2] - E[x]^2 cancellation
            rows.append(ops.stack([shift, offset, ops.sqrt(ops.mean(centred * centred))]))
        return ops.stack(rows)

    return moments


def _gathered_body() -> Callable[..., Any]:
    import mindspore as ms
    from mindspore import ops

    int32 = ms.int32

    def gathered(*pairs: Any) -> Any:
        # pairs: a tensor's bit words, its positions as index rows (positions_in), the next tensor's words, ...
        # Gathered as words (every backend gathers integers; MindSpore's CPU gathers no bfloat16) and decoded on the
        # host, where only the gathered values are. gather_nd, not a gather from a reshape: the reshape of a
        # Parameter inside a graph copies it (39 ms for six of 16.7 M values against 1.7 ms).
        picked = [ops.gather_nd(pairs[i], pairs[i + 1]).astype(int32) for i in range(0, len(pairs), 2)]
        return ops.cat(picked)

    return gathered


def _bit_sums_body() -> Callable[..., Any]:
    import mindspore as ms
    from mindspore import ops

    float64, int64 = ms.float64, ms.int64
    on_cpu = ms.get_context("device_target") == "CPU"

    def bit_sums(*words: Any) -> Any:
        # Integer addition: exact, and the same whatever order the device adds in (a float sum is neither).
        sums = []
        for w in words:
            columns = w.shape[-1] if len(w.shape) > 1 else 1
            if on_cpu and columns <= _EXACT_COLUMNS:
                # MindSpore's CPU int64 ReduceSum runs about 5x slower than a float64 matrix-vector product, which is
                # as exact here: every partial sum is an integer under 2^53 (columns x 2^31), so no addition rounds;
                # the rows' sums are then added as integers. Accelerators add the integers directly.
                rows = ops.matmul(w.astype(float64).reshape(-1, columns), ops.ones((columns, 1), float64))
                sums.append(rows.astype(int64).sum())
            else:
                sums.append(ops.sum(w.astype(int64)))
        return ops.stack(sums)

    return bit_sums


def _histograms_body(bins: int) -> Callable[..., Any]:
    import mindspore as ms
    from mindspore import ops

    float32, int32 = ms.float32, ms.int32
    gathers_bfloat16 = ms.get_context("device_target") != "CPU"  # MindSpore's CPU Gather has no bfloat16 kernel

    def histograms(*pairs: Any) -> Any:
        # pairs: a tensor, what to draw it from (an empty index: all of it; a vector: rows of its first axis; index
        # rows: positions), the next tensor, ...
        rows = []
        for i in range(0, len(pairs), 2):
            t, drawn = pairs[i], pairs[i + 1]
            if drawn.shape[0] > 0 and not gathers_bfloat16 and t.dtype == ms.bfloat16:
                t = t.astype(float32)  # MindSpore's CPU gathers no bfloat16: widened first
            if drawn.shape[0] == 0:
                x = t.astype(float32).reshape(-1)
            elif len(drawn.shape) == 1:  # no reshape of the tensor itself: it would copy it
                x = ops.gather(t, drawn, 0).astype(float32).reshape(-1)
            else:
                x = ops.gather_nd(t, drawn).astype(float32)
            finite = ops.isfinite(x)
            kept = ops.select(finite, x, ops.zeros_like(x))
            # Scalars, not full_like/ones_like: MindSpore's compiler folds those into host arrays of the tensor's
            # size when it compiles.
            low = ops.where(finite, x, 3.0e38).min()
            high = ops.where(finite, x, -3.0e38).max()
            weight = finite.astype(float32)  # a non-finite value weighs 0 in whichever bin it lands
            width = ops.maximum(high - low, 1e-30)
            position = ops.clip(ops.floor((kept - low) / width * bins).astype(int32), 0, bins - 1)
            counts = ops.unsorted_segment_sum(weight, position, bins)
            head = ops.stack([low, high, weight.sum(), kept.sum(), (kept * kept).sum()])
            rows.append(ops.cat([head, counts]))
        return ops.stack(rows)

    return histograms


def _gathered_values_body() -> Callable[..., Any]:
    import mindspore as ms
    from mindspore import ops

    float32 = ms.float32
    gathers_bfloat16 = ms.get_context("device_target") != "CPU"

    def gathered_values(*pairs: Any) -> Any:
        # Where MindSpore cannot view the bits as integers: the values themselves, bfloat16 widened first on CPU.
        picked = []
        for i in range(0, len(pairs), 2):
            t = pairs[i] if gathers_bfloat16 or pairs[i].dtype != ms.bfloat16 else pairs[i].astype(float32)
            picked.append(ops.gather_nd(t, pairs[i + 1]).astype(float32))
        return ops.cat(picked)

    return gathered_values


_square_sums = _Compiled(_square_sums_body)
_gathered_values = _Compiled(_gathered_values_body)
_moments = _Compiled(_moments_body)
_gathered = _Compiled(_gathered_body)
_bit_sums = _Compiled(_bit_sums_body)
_histograms: dict[int, _Compiled] = {}


def to_host(value: Any) -> np.ndarray:
    """The one transfer of a reduction's result."""
    return np.asarray(value.asnumpy())


# Whether a reduction reads tensors in place where MindSpore runs on the host's CPU: None decides by the device target
# (the benchmarks and the transfer-counting tests set False, to run and count what an accelerator runs).
read_in_place: bool | None = None


def reads_in_place() -> bool:
    """Whether reductions read tensors in place on the host (MindSpore's CPU target, unless `read_in_place` says)."""
    global read_in_place
    if read_in_place is None:
        import mindspore as ms

        read_in_place = ms.get_context("device_target") == "CPU"
    return read_in_place


def _in_place(tensors: Sequence[Any], dtypes: tuple[str, ...]) -> list[np.ndarray] | None:
    """The tensors' own memory as flat numpy arrays where it is host memory, None where a reduction must run compiled
    (an accelerator, or a dtype not in `dtypes`). On MindSpore's CPU target `asnumpy` is a view of the tensor's memory,
    not a copy (also of a Parameter a compiled graph updates), and numpy's one pass over it runs 2x to 4x faster than
    MindSpore's CPU kernels (a float32 dot: 4 ms for 25 M values against 10-15 ms; int64 bit sums: 14 ms against
    20 ms), which on the demo model also spend most of their time launching: 85 small tensors cost 6 ms compiled."""
    arrays = _host_arrays(tensors, dtypes)
    return None if arrays is None else [np.ravel(a) for a in arrays]  # a view of a contiguous array


def _host_arrays(tensors: Sequence[Any], dtypes: tuple[str, ...]) -> list[np.ndarray] | None:
    """`_in_place`'s arrays in their tensors' shapes."""
    if not reads_in_place() or any(str(t.dtype) not in dtypes for t in tensors):
        return None
    return [np.asarray(t.asnumpy()) for t in tensors]


def square_sums(tensors: Sequence[Any]) -> np.ndarray:
    """Each tensor's sum of squares (float32 on the device, widened on the device from float16/bfloat16)."""
    if not tensors:
        return np.zeros(0)
    arrays = _in_place(tensors, ("Float32",))
    if arrays is not None:
        return np.array([np.dot(a, a) for a in arrays], np.float64)  # float32 BLAS: no float64 copy of the weights
    return to_host(_square_sums.over(tensors)).astype(np.float64)


def norms(tensors: Sequence[Any]) -> np.ndarray:
    """Each tensor's L2 norm."""
    result: np.ndarray = np.sqrt(square_sums(tensors))
    return result


def norms_on_device(tensors: Sequence[Any]) -> Any:
    """Each tensor's L2 norm as one device tensor, not yet read: for a step's outputs, read when published."""
    if not tensors:
        return None
    from mindspore import ops

    return ops.sqrt(_square_sums.over(tensors))


def moments(tensors: Sequence[Any]) -> np.ndarray:
    """One row per tensor: its mean and standard deviation."""
    if not tensors:
        return np.zeros((0, 2))
    rows = to_host(_moments.over(tensors)).astype(np.float64).reshape(len(tensors), 3)
    return np.stack([rows[:, 0] + rows[:, 1], rows[:, 2]], axis=1)


def fixed_positions(total: int, count: int, seed: int) -> np.ndarray:
    """`count` distinct flat positions of `total`, sorted, the same for the same seed (all of them where `total` is at
    most `count`): the positions a sketch or a drawn histogram reads at every sample."""
    if total <= count:
        return np.arange(total)
    return np.sort(np.random.default_rng(seed).choice(total, size=count, replace=False))


def positions_in(shape: Sequence[int], flat: np.ndarray) -> Any:
    """Flat positions of a tensor of `shape` as the device tensor of index rows `gathered` takes."""
    from mindspore import Tensor

    rows = np.stack(np.unravel_index(np.asarray(flat, np.int64), tuple(shape)), axis=1)
    return Tensor(rows.astype(np.int32 if int(np.prod(shape)) < 2**31 else np.int64))


def gathered(tensors: Sequence[Any], positions: Sequence[Any]) -> np.ndarray:
    """The values at `positions` (one `positions_in` tensor per tensor), concatenated, as float32."""
    if not tensors:
        return np.zeros(0, np.float32)
    arrays = _host_arrays(tensors, ("Float32", "Float16")) if all(len(t.shape) for t in tensors) else None
    if arrays is not None:
        picked = [a[tuple(np.asarray(where.asnumpy()).T)] for a, where in zip(arrays, positions)]
        values: np.ndarray = np.concatenate(picked).astype(np.float32)
        return values
    if not views_dtypes():
        pairs = [item for tensor, where in zip(tensors, positions) for item in (tensor, where)]
        return to_host(_gathered_values.over(pairs, per=2)).astype(np.float32)
    pairs = [item for tensor, where in zip(tensors, positions) for item in (bit_words(tensor), where)]
    words = to_host(_gathered.over(pairs, per=2))
    decoded = []
    start = 0
    for tensor, where in zip(tensors, positions):
        end = start + int(where.shape[0])
        decoded.append(_decode(words[start:end], str(tensor.dtype)))
        start = end
    return np.concatenate(decoded)


def _decode(words: np.ndarray, dtype: str) -> np.ndarray:
    """float32 values from bit words widened to int32 on the device."""
    if dtype == "Float32":
        return words.astype(np.int32).view(np.float32)
    if dtype == "Float16":
        return words.astype(np.int16).view(np.float16).astype(np.float32)
    if dtype == "BFloat16":  # the upper half of a float32
        return (words.astype(np.uint32) << 16).view(np.float32)
    return words.astype(np.float32)


def bit_words(tensor: Any) -> Any:
    """The tensor's bits as integers of its own width (a view where MindSpore can make one, not a widening copy):
    float32 -> int32, float16 and bfloat16 -> int16. Taken outside the compiled function: MindSpore's compiler does
    not infer a dtype view."""
    import mindspore as ms

    words = {
        ms.float32: ms.int32,
        ms.float16: ms.int16,
        ms.bfloat16: ms.int16,
        ms.float64: ms.int64,
    }.get(tensor.dtype, tensor.dtype)  # integers and booleans are summed as they are
    return tensor if tensor.dtype == words else tensor.view(words)


def views_dtypes() -> bool:
    """Whether this MindSpore reinterprets a tensor's bits as another dtype (`Tensor.view(dtype)`; 2.7 has only
    `view(shape)`)."""
    global _VIEWS_DTYPES
    if _VIEWS_DTYPES is None:
        import mindspore as ms

        try:
            ms.Tensor(np.zeros(1, np.float32)).view(ms.int32)
            _VIEWS_DTYPES = True
        except (TypeError, ValueError, RuntimeError):
            _VIEWS_DTYPES = False
    return _VIEWS_DTYPES


_VIEWS_DTYPES: bool | None = None


def _host_bit_sums(tensors: Sequence[Any]) -> np.ndarray:
    """The same sums on the host: in place on MindSpore's CPU target (`reads_in_place`), from copies where MindSpore
    cannot view the bits on the device (the tensors cross to the host whole). Words of up to 32 bits are added in
    int32, which wraps: the sum modulo 2^32 with no widening (4 ms for 25 M values on this CPU, against 14 ms added in
    int64). bfloat16 is widened to float32 first, exactly: its bits are the upper half of the float32's."""
    import mindspore as ms

    sums = []
    for tensor in tensors:
        if tensor.dtype == ms.bfloat16:
            words = (np.asarray(tensor.astype(ms.float32).asnumpy()).view(np.uint32) >> 16).astype(np.uint16)
            words = words.view(np.int16)
        else:
            values = np.ascontiguousarray(tensor.asnumpy())
            words = values.view({1: np.int8, 2: np.int16, 4: np.int32, 8: np.int64}[values.dtype.itemsize])
        wide = words.dtype.itemsize == 8
        sums.append(int(np.add.reduce(words.reshape(-1), dtype=np.int64 if wide else np.int32)))
    return _modular(np.asarray(sums, np.int64), tensors)


def _modular(sums: np.ndarray, tensors: Sequence[Any]) -> np.ndarray:
    """Exact integer sums as the fingerprint keeps them: modulo 2^32 for words of up to 32 bits (in [0, 2^32)); a
    64-bit word's sum as int64 holds it (modulo 2^64)."""
    narrow = np.asarray([int(t.itemsize) < 8 for t in tensors], bool)
    return np.where(narrow, sums % (1 << 32), sums).astype(np.int64)


def bit_sums(tensors: Sequence[Any]) -> np.ndarray:
    """Each tensor's bit patterns added as integers of its own width, exactly modulo 2^32 (2^64 for 64-bit words):
    a change of any one element, by one unit in the last place or by any amount, changes its tensor's sum (the change
    of a word is less than the modulus), and equal bits give equal sums on every device and either way: compiled,
    the device adds in int64 and the host takes the remainder; in place, numpy adds in the words' width."""
    if not tensors:
        return np.zeros(0, np.int64)
    if reads_in_place() or not views_dtypes():
        return _host_bit_sums(tensors)
    return _modular(to_host(_bit_sums.over([bit_words(t) for t in tensors])).astype(np.int64), tensors)


def histograms(tensors: Sequence[Any], bins: int) -> np.ndarray:
    """One row per tensor: min, max, count, sum and sum of squares of its finite values, then `bins` counts of equal
    bins between that min and max. Only these numbers reach the host. A tensor of more than HISTOGRAM_SAMPLE values
    is drawn from at most that many values at fixed random places (`drawn_positions`, the same at every call): its
    min and max are the drawn values', its count, sums and bin counts are scaled to its size."""
    if not tensors:
        return np.zeros((0, HISTOGRAM_HEAD + bins))
    compiled = _histograms.get(bins)
    if compiled is None:
        compiled = _histograms[bins] = _Compiled(lambda: _histograms_body(bins))
    draws = [_draw(tuple(tensor.shape)) for tensor in tensors]
    arrays = _host_arrays(tensors, ("Float32", "Float16"))
    if arrays is not None:
        rows: np.ndarray = np.stack([_host_histogram(_drawn_values(a), bins) for a in arrays])
    else:
        pairs = [item for tensor, (where, _) in zip(tensors, draws) for item in (tensor, where)]
        rows = to_host(compiled.over(pairs, per=2)).astype(np.float64).reshape(len(tensors), HISTOGRAM_HEAD + bins)
    for row, tensor, (_, count) in zip(rows, tensors, draws):
        if count < int(tensor.size):
            row[HIST_COUNT:] *= int(tensor.size) / count
    return rows


def _drawn_values(array: np.ndarray) -> np.ndarray:
    """The values a histogram of `array` (a tensor's memory, in place) reads, as float32: the same as the device's."""
    if array.size <= HISTOGRAM_SAMPLE:
        return np.ravel(array).astype(np.float32)
    rows = _drawn_rows(array.shape)
    drawn = array[rows] if rows is not None else np.ravel(array)[drawn_positions(array.shape)]
    return np.ravel(drawn).astype(np.float32)


def _host_histogram(values: np.ndarray, bins: int) -> np.ndarray:
    """The compiled body's row (min, max, count, sum, sum of squares of the finite values, then the bin counts),
    from the drawn values in host memory, with the body's float32 bin arithmetic."""
    finite = values[np.isfinite(values)]
    row = np.zeros(HISTOGRAM_HEAD + bins)
    if not finite.size:
        row[HIST_MIN], row[HIST_MAX] = 3.0e38, -3.0e38  # what the body's masked min and max give
        return row
    low, high = finite.min(), finite.max()
    width = np.float32(max(float(high) - float(low), 1e-30))
    position = np.clip(np.floor((finite - low) / width * np.float32(bins)).astype(np.int64), 0, bins - 1)
    row[:HISTOGRAM_HEAD] = (low, high, finite.size, finite.sum(dtype=np.float64), np.dot(finite, finite))
    row[HISTOGRAM_HEAD:] = np.bincount(position, minlength=bins)
    return row


def _drawn_rows(shape: tuple[int, ...]) -> np.ndarray | None:
    """The rows of the first axis a tensor of `shape` is drawn from, None where it is drawn by positions (a row of
    more than HISTOGRAM_SAMPLE values) or taken whole. Whole rows because a row is contiguous: every device gathers
    rows at the speed of memory (MindSpore's CPU gathers 65,536 values as rows in a tenth of the time it gathers
    them one by one), and the rows are a random sample of the tensor's rows."""
    size = int(np.prod(shape))
    if size <= HISTOGRAM_SAMPLE or size // shape[0] > HISTOGRAM_SAMPLE:
        return None
    return fixed_positions(shape[0], HISTOGRAM_SAMPLE // (size // shape[0]), seed=size)


def drawn_positions(shape: Sequence[int]) -> np.ndarray:
    """The flat positions a histogram of a tensor of `shape` reads: all of them up to HISTOGRAM_SAMPLE values, whole
    random rows of the first axis where a row holds at most that many, else that many random positions."""
    shape = tuple(int(n) for n in shape)
    size = int(np.prod(shape))
    if size <= HISTOGRAM_SAMPLE:
        return np.arange(size)
    rows = _drawn_rows(shape)
    if rows is None:
        return fixed_positions(size, HISTOGRAM_SAMPLE, seed=size)
    width = size // shape[0]
    return (rows[:, None] * width + np.arange(width)).reshape(-1)


_draws: dict[tuple[int, ...], tuple[Any, int]] = {}


def _draw(shape: tuple[int, ...]) -> tuple[Any, int]:
    """What a tensor of `shape` is drawn from, kept on the device (see the body), and how many values that is."""
    size = int(np.prod(shape))
    key = shape if size > HISTOGRAM_SAMPLE else ()
    draw = _draws.get(key)
    if draw is None:
        from mindspore import Tensor

        if size <= HISTOGRAM_SAMPLE:
            draw = (Tensor(np.zeros((0, 1), np.int32)), size)
        else:
            rows = _drawn_rows(shape)
            if rows is None:
                draw = (positions_in(shape, fixed_positions(size, HISTOGRAM_SAMPLE, seed=size)), HISTOGRAM_SAMPLE)
            else:
                draw = (Tensor(rows.astype(np.int32)), len(rows) * (size // shape[0]))
        _draws[key] = draw
    return draw


def _stacked_body() -> Callable[..., Any]:
    from mindspore import ops

    def stacked(*tensors: Any) -> Any:
        return ops.stack(tensors)

    return stacked


_stacked = _Compiled(_stacked_body)


def stacked(tensors: Sequence[Any]) -> np.ndarray:
    """Tensors of one shape and dtype (small ones: per-layer statistics vectors, Parameters among them) stacked on the
    device and read in one transfer: row i is tensors[i], in their own dtype."""
    if not tensors:
        return np.zeros(0)
    return to_host(_stacked.over(tensors))
