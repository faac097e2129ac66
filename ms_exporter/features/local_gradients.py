"""Each rank's own gradient norm before the all-reduce, against the rank's own history (docs/sdc.md#local-gradients).

A corruption of a local gradient (a flipped bit between the backward pass and the all-reduce, or a wrong result of
the backward pass itself) reaches every replica identically through the reducer: the replicas' weights and optimizer
state stay equal and no checksum sees it. The norm of the rank's own gradients does: a flip that raises an element by
orders of magnitude raises the norm far above the rank's history, and above its replicas' norms at the same step
(`ms_exporter.core.analysis.replicas.local_gradient_outliers`, on the `/debug/checksums` pages).
"""

from __future__ import annotations

import collections
import math
import statistics
from collections.abc import Callable
from typing import Any

import numpy as np

# The loop API's own key in its run view: the step's local gradient norm (step_end(local_grad_norm=...)).
RUN_VIEW_KEY = "ms_exporter_local_grad_norm"
WARMUP_STEPS = 16  # steps of history before a norm is judged
HISTORY_STEPS = 128  # the rank's last norms that were not outliers


class LocalGradientCheck:
    """`read(step)` at each step's end: the norm, and whether it is an outlier (not finite, or more than `factor`
    times the median of the rank's last accepted norms). An outlier stays out of the history, so a corruption that
    persists stays flagged."""

    def __init__(self, source: Callable[[], float], factor: float) -> None:
        self._source = source
        self._factor = factor
        self._history: collections.deque[float] = collections.deque(maxlen=HISTORY_STEPS)
        self.outliers = 0
        self.last: float = math.nan
        self.last_outlier: tuple[int, float, float] | None = None  # (step, norm, median of the history)

    def read(self, step: int) -> float:
        value = self.last = float(self._source())
        if math.isnan(value) and not self._history and self.outliers == 0:
            return value  # the cell has not measured a step yet
        history = self._history
        median = statistics.median(history) if len(history) >= WARMUP_STEPS else math.nan
        if not math.isfinite(value) or (median > 0 and value > self._factor * median):
            self.outliers += 1
            self.last_outlier = (step, value, median)
        else:
            history.append(value)
        return value

    @property
    def limit(self) -> float:
        """The norm above which a step is an outlier now (inf until the history is warm)."""
        history = self._history
        if len(history) < WARMUP_STEPS:
            return math.inf
        median = statistics.median(history)
        return self._factor * median if median > 0 else math.inf


class LimitWriter:
    """Writes the rank's limit into the train cell's Parameter when it moved by more than 1%: in place where MindSpore
    reads tensors in place (its CPU target), else by `ops.assign`."""

    def __init__(self, parameter: Any) -> None:
        self._parameter = parameter
        self._written = math.inf

    def write(self, limit: float) -> None:
        written = self._written
        if limit == written or (math.isfinite(written) and abs(limit - written) <= 0.01 * written):
            return
        self._written = limit
        from ms_exporter.core.device.device_reductions import reads_in_place

        if reads_in_place():
            np.asarray(self._parameter.asnumpy()).reshape(-1)[0] = limit
            return
        import mindspore as ms
        from mindspore import ops

        ops.assign(self._parameter, ms.Tensor(np.full(1, limit, np.float32)))
