"""Optional (`update_ratio.enable`): how far each layer's weights moved between two samples, ||w - w_before|| / ||w||.

The TensorBoard article's "parameter update size", and its closing lesson: the loss fell while the
classification head barely moved (its learning rate was too small for it). A layer's ratio far under the other
layers' is that head; `MindSporeTrainingLayerFrozen` compares each exported layer with the rank's median.
"""

from __future__ import annotations

import zlib
from collections import deque
from typing import Any

import numpy as np

from ms_exporter.config import MonitorConfig, UpdateRatioConfig
from ms_exporter.core import catalogue
from ms_exporter.core.cb_params import step_of, trained_weights_of
from ms_exporter.core.compat import zip_strict
from ms_exporter.core.device.device_reductions import fixed_positions, gathered, positions_in
from ms_exporter.core.part import PartContext
from ms_exporter.core.probe import Probe
from ms_exporter.core.registry import ProbeEntry
from ms_exporter.core.sample import StepSample
from ms_exporter.core.store import MetricStore
from ms_exporter.probes.grad_norm import LayerIndex


class UpdateRatioProbe(Probe):
    """Every `update_ratio.every_n_steps` steps, as the step ends, reads every trainable weight at `sketch_size`
    fixed random positions (drawn once per weight at train begin, the same on every rank and every restart), on the
    device, one compiled gather for all weights and one transfer; compares them with the values the sample before
    read there. The ratios are exported when that step is published. Exported: the `update_ratio.layers` layers,
    the `top_k` layers that moved least and the `top_k` that moved most (a series that falls out of those goes
    stale), and the median of all layers.

    A tensor's movement and size are estimated from its positions, each scaled by its size over the positions
    read (a layer adds its tensors' estimates): the ratio's relative error is about 1 / sqrt(2 x sketch_size)
    for a tensor whose values move alike (docs/update-ratio.md has it measured); a tensor of at most
    `sketch_size` values is read whole, and its ratio is exact. The host keeps `sketch_size` float32 values per
    tensor between samples, whatever the model's size. A layer whose weights read all zero has no ratio.

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
        self._sketch: Sketch | None = None
        self._index: LayerIndex | None = None
        self._before: np.ndarray | None = None
        self._extremes: set[str] = set()
        self._pending: deque[tuple[int, np.ndarray, np.ndarray]] = deque()  # sampled, not yet published
        self._next_step = 0

    def on_train_begin(self, cb_params: Any) -> None:
        parameters = [p for p in trained_weights_of(cb_params) if int(p.size) > 0 and len(p.shape) > 0]
        self._sketch = Sketch(parameters, self._config.sketch_size)
        self._index = LayerIndex(
            [p.name for p in parameters], self._config.layers, self._config.max_series - 2 * self._config.top_k
        )
        self._before = None  # a new training call compares from its own first sample
        self._pending.clear()
        self._next_step = step_of(cb_params)

    def on_step_end(self, step: int, outputs: Any) -> None:
        """Read as the step ends, on the training thread: read at publication, about once a second, two samples
        published together would read the same weights."""
        if step < self._next_step or self._index is None or self._sketch is None:
            return
        every = self._config.every_n_steps
        self._next_step = (step // every + 1) * every
        now = self._sketch.read()
        before, self._before = self._before, now
        if before is None:
            return  # the first sample: nothing to compare with yet
        moved, size = self._sketch.norms(now - before), self._sketch.norms(now)
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


class Sketch:
    """Fixed random positions of each tensor, kept on the device, and the values there read in one transfer."""

    def __init__(self, parameters: list[Any], size: int) -> None:
        self._parameters = parameters
        counts = []
        self._positions = []
        for parameter in parameters:
            total = int(parameter.size)
            # Seeded by the name: the same positions on every replica and after a restart.
            chosen = fixed_positions(total, size, seed=zlib.crc32(str(parameter.name).encode()))
            self._positions.append(positions_in(parameter.shape, chosen))
            counts.append(len(chosen))
        self._starts = np.cumsum([0, *counts[:-1]]).astype(np.intp)
        # Each tensor's size over the positions read: what turns the positions' sum of squares into the tensor's.
        self._scale = np.asarray([int(p.size) for p in parameters], np.float64) / np.maximum(counts, 1)

    def read(self) -> np.ndarray:
        """The values at every tensor's positions now, concatenated (a host array of its own)."""
        return np.array(gathered(self._parameters, self._positions), dtype=np.float32)

    def norms(self, values: np.ndarray) -> np.ndarray:
        """Each tensor's estimated L2 norm, from its positions' part of `values`."""
        if not len(values):
            return np.zeros(0)
        squares = np.add.reduceat(np.square(values, dtype=np.float64), self._starts)
        result: np.ndarray = np.sqrt(squares * self._scale)
        return result


def build(context: PartContext) -> list[Probe]:
    config: MonitorConfig = context.config
    return [UpdateRatioProbe(context.store, config.update_ratio)] if config.update_ratio.enable else []


PART = ProbeEntry("update_ratio", build, (), order=130)
