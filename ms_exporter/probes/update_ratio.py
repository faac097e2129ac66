"""Optional (`update_ratio.enable`): how far each layer's weights moved between two samples, ||w - w_before|| / ||w||.

The second source article's "parameter update size", and its closing lesson: the loss fell while the
classification head barely moved (its learning rate was too small for it). A layer's ratio far under the other
layers' is that head; `MindSporeTrainingLayerFrozen` compares each exported layer with the rank's median.
"""

from __future__ import annotations

import math
from collections import deque
from typing import Any

import numpy as np

from ms_exporter.config import UpdateRatioConfig
from ms_exporter.core import catalogue
from ms_exporter.core.cb_params import step_of, trained_weights_of
from ms_exporter.core.compat import zip_strict
from ms_exporter.core.probe import Probe
from ms_exporter.core.sample import StepSample, to_numpy
from ms_exporter.core.store import MetricStore
from ms_exporter.probes.grad_norm import LayerIndex


class UpdateRatioProbe(Probe):
    """Every `update_ratio.every_n_steps` steps, as the step ends, copies every trainable weight to the host and
    compares it with the copy of the sample before; the ratios are exported when that step is published. Exported:
    the `update_ratio.layers` layers, the `top_k` layers that moved least and the `top_k` that moved most (a series
    that falls out of those goes stale), and the median of all layers.

    The host holds one float32 copy of the trainable weights between samples (what the ratio needs); a layer whose
    weights are all zero has no ratio.

    | name | type | labels | unit |
    |---|---|---|---|
    | mindspore_train_layer_update_ratio | gauge | layer | ratio |
    | mindspore_train_update_ratio_median | gauge | | ratio |
    """

    name = "update_ratio"

    def __init__(self, store: MetricStore, config: UpdateRatioConfig) -> None:
        self._config = config
        self._ratio = store.register(catalogue.LAYER_UPDATE_RATIO)
        self._median = store.register(catalogue.UPDATE_RATIO_MEDIAN)
        self._parameters: list[Any] = []
        self._index: LayerIndex | None = None
        self._before: list[np.ndarray | None] = []
        self._extremes: set[str] = set()
        self._pending: deque[tuple[int, np.ndarray, np.ndarray]] = deque()  # sampled, not yet published
        self._next_step = 0

    def on_train_begin(self, cb_params: Any) -> None:
        self._parameters = trained_weights_of(cb_params)
        self._index = LayerIndex(
            [p.name for p in self._parameters], self._config.layers, self._config.max_series - 2 * self._config.top_k
        )
        self._before = []  # a new training call compares from its own first sample
        self._pending.clear()
        self._next_step = step_of(cb_params)

    def on_step_end(self, step: int, outputs: Any) -> None:
        """The copy is taken as the step ends, on the training thread: read at publication, about once a second,
        two samples published together would read the same weights."""
        if step < self._next_step or self._index is None:
            return
        every = self._config.every_n_steps
        self._next_step = (step // every + 1) * every
        now = [_copy(parameter) for parameter in self._parameters]
        before, self._before = self._before, now
        if len(before) != len(now):
            return  # the first sample: nothing to compare with yet
        moved = np.zeros(len(now))
        size = np.zeros(len(now))
        for position, (new, old) in enumerate(zip_strict(now, before)):
            if new is None or old is None or new.shape != old.shape:
                continue
            moved[position] = _norm(new - old)
            size[position] = _norm(new)
        # Exported when the step is published, in step order with the other probes' numbers.
        self._pending.append((step, self._index.layer_norms(moved), self._index.layer_norms(size)))

    def on_step(self, sample: StepSample) -> None:
        while self._pending and self._pending[0][0] <= sample.step and self._index is not None:
            _, moved, size = self._pending.popleft()
            self._export(self._index, moved, size)

    def _export(self, index: LayerIndex, moved: np.ndarray, size: np.ndarray) -> None:
        known = size > 0
        ratios = np.divide(moved, size, out=np.zeros_like(moved), where=known)
        if known.any():
            self._median.series().value = float(np.median(ratios[known]))
        for layer, position in zip_strict(index.watched, index.watched_positions.tolist()):
            if known[position]:
                self._ratio.series(layer=layer).value = float(ratios[position])
        others = index.other_positions[known[index.other_positions]]
        k = min(self._config.top_k, len(others))
        extremes: set[str] = set()
        if k:
            order = others[np.argsort(ratios[others], kind="stable")]
            for position in (*order[:k].tolist(), *order[-k:].tolist()):
                layer = index.layer_names[position]
                extremes.add(layer)
                self._ratio.series(layer=layer).value = float(ratios[position])
        for layer in self._extremes - extremes:
            self._ratio.remove(layer=layer)  # no longer among the least or most moved: its series goes stale
        self._extremes = extremes


def _copy(parameter: Any) -> np.ndarray | None:
    """The weight's values now, as a float32 array of the host's own (a CPU Parameter's asnumpy shares memory with
    it: the next step would change the copy kept for comparison)."""
    values = to_numpy(parameter)
    if values is None:
        return None
    return np.array(values, dtype=np.float32, copy=True)


def _norm(values: np.ndarray) -> float:
    return math.sqrt(float(np.square(values, dtype=np.float64).sum()))
