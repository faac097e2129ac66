"""`ms-exporter peak-flops`: a matrix multiply's FLOPs per second on this machine's MindSpore device, measured.

Where no datasheet figure applies (a CPU, a device without a preset), the best rate of MindSpore's own matmul is a
practical peak: MFU against it says how much of what this device does at its best the training gets (docs/mfu.md).
"""

from __future__ import annotations

import time

DTYPES = ("float32", "float16", "bfloat16")  # what --dtype accepts


def measure_matmul_flops(
    size: int = 1024, dtype: str = "float32", rounds: int = 5, round_seconds: float = 0.3
) -> float:
    """The best of `rounds` rounds of square `size` matmuls (2 * size**3 FLOPs each) on MindSpore's current device,
    each round at least `round_seconds` long and ended by reading the result (the device is done then). The best
    round, not the mean: on a shared machine the others ran beside someone else's work."""
    import mindspore as ms
    import numpy as np
    from mindspore import ops

    rng = np.random.default_rng(0)
    kind = getattr(ms, dtype)
    a = ms.Tensor(rng.standard_normal((size, size), dtype=np.float32)).astype(kind)
    b = ms.Tensor(rng.standard_normal((size, size), dtype=np.float32)).astype(kind)
    ops.matmul(a, b).asnumpy()  # the first call compiles and allocates
    flops = 2.0 * size**3
    best = 0.0
    for _ in range(rounds):
        count = 0
        began = time.perf_counter()
        while True:
            for _ in range(4):
                out = ops.matmul(a, b)
            count += 4
            out.asnumpy()
            elapsed = time.perf_counter() - began
            if elapsed >= round_seconds:
                break
        best = max(best, flops * count / elapsed)
    return best
