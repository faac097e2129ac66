"""Gradient norms from the real training step: global, per watched layer and the top-k layers."""

from __future__ import annotations

import difflib
import logging
import math
import re
from typing import Any

import numpy as np

from ms_exporter.config import GradNormConfig, MonitorConfig
from ms_exporter.core import catalogue
from ms_exporter.core.cb_params import optimizer_of, step_of, train_network_of
from ms_exporter.core.compat import zip_strict
from ms_exporter.core.device.device_reductions import norms as device_norms
from ms_exporter.core.part import PartContext
from ms_exporter.core.probe import Probe
from ms_exporter.core.registry import ProbeEntry
from ms_exporter.core.sample import StepSample, read_scalar, to_numpy
from ms_exporter.core.store import MetricStore, Series

logger = logging.getLogger("ms_exporter")

# 1e-4 to 1e4 in half-decades: vanishing and exploding gradients both land in a bucket of their own.
NORM_BUCKETS = tuple(10.0 ** (k / 2) for k in range(-8, 9))


def _warn_if_nothing_matches(
    pattern: str,
    regex: re.Pattern[str],
    layers: dict[str, list[int]],
    names: list[str],
    setting: str = "grad_norm.layers",
) -> None:
    """A grad_norm.layers pattern that matches no layer (nor parameter) is named once at train begin, with the nearest
    layer names (the strategy-container article's `encoder.layer.11` matches nothing in most models, and nothing else
    would say so). `setting`: the key the pattern came from (activations.layers says the same of cells)."""
    if any(regex.match(layer) for layer in layers) or any(regex.match(name) for name in names):
        return
    nearest = difflib.get_close_matches(pattern, list(layers), n=3, cutoff=0.4) or list(layers)[:3]
    logger.warning(
        "ms_exporter: %s pattern %r matches no layer of this model; nearest layer names: %s "
        "(a pattern is a regular expression matched at the start of a layer or parameter name)",
        setting,
        pattern,
        ", ".join(nearest) or "none",
    )


def layer_of(parameter_name: str) -> str:
    """The cell that owns a parameter: `encoder.layers.0.norm1.gamma` -> `encoder.layers.0.norm1`."""
    head, _, _ = parameter_name.rpartition(".")
    return head or parameter_name


class LayerIndex:
    """Parameter positions grouped by layer, with the layers that the user's regexes watch."""

    def __init__(self, parameter_names: list[str], patterns: tuple[str, ...], max_watched: int) -> None:
        self.names = parameter_names
        self.layers: dict[str, list[int]] = {}
        for index, name in enumerate(parameter_names):
            self.layers.setdefault(layer_of(name), []).append(index)
        self.layer_names = list(self.layers)
        # Parameter position -> layer position, so that one bincount sums the squares of every layer.
        self._layer_of_parameter = np.zeros(len(parameter_names), dtype=np.intp)
        for position, members in enumerate(self.layers.values()):
            self._layer_of_parameter[members] = position
        compiled = [re.compile(p) for p in patterns]
        if parameter_names:
            for pattern, regex in zip_strict(patterns, compiled):
                _warn_if_nothing_matches(pattern, regex, self.layers, parameter_names)
        watched = [
            layer
            for layer, members in self.layers.items()
            if any(c.match(layer) or any(c.match(parameter_names[i]) for i in members) for c in compiled)
        ]
        if len(watched) > max_watched:
            logger.warning(
                "ms_exporter: grad_norm.layers matches %d layers; watching the first %d (max_series)",
                len(watched),
                max_watched,
            )
        self.watched = watched[:max_watched]
        layer_position = {layer: i for i, layer in enumerate(self.layer_names)}
        self.watched_positions = np.asarray([layer_position[layer] for layer in self.watched], dtype=np.intp)
        others = np.ones(len(self.layer_names), dtype=bool)
        others[self.watched_positions] = False
        self.other_positions = np.flatnonzero(others)

    def layer_norms(self, parameter_norms: np.ndarray) -> np.ndarray:
        """One norm per layer, in `layer_names` order."""
        squares = np.square(parameter_norms.astype(np.float64))
        return np.sqrt(np.bincount(self._layer_of_parameter, weights=squares, minlength=len(self.layer_names)))


class GradNormProbe(Probe):
    """Reads norms that the train cell computed in-graph; device-to-host only every `every_n_steps` steps.

    Sources, by what the train cell returns (see ms_exporter.core.output_layout): a global norm item
    (GradNormTrainOneStepCell, MindSpore Transformers' cells), per-parameter norms (GradNormTrainOneStepCell, the
    7-tuple), or the gradients themselves (`return_grad=True`: norms computed on the host at sampled steps only).

    | name | type | labels | unit |
    |---|---|---|---|
    | mindspore_train_grad_norm | gauge | | L2 norm |
    | mindspore_train_grad_norm_distribution | histogram | | L2 norm, buckets 1e-4 .. 1e4 |
    | mindspore_train_grad_norm_clipped_total | counter | | sampled steps above the clip threshold |
    | mindspore_train_layer_grad_norm | gauge | layer | L2 norm |
    | mindspore_train_layer_grad_zero_total | counter | layer | sampled steps with an exactly zero norm |
    """

    name = "grad_norm"

    def __init__(self, store: MetricStore, config: GradNormConfig) -> None:
        self._config = config
        self._store = store
        self._norm = store.register(catalogue.GRAD_NORM)
        self._distribution = store.register(catalogue.GRAD_NORM_DISTRIBUTION)
        self._layer_norm = store.register(catalogue.LAYER_GRAD_NORM)
        self._layer_zero = store.register(catalogue.LAYER_GRAD_ZERO)
        self._clipped: Series | None = None
        self._clip: float | None = None
        self._index: LayerIndex | None = None
        self._top: set[str] = set()
        self._next_step = config.every_n_steps
        self._warned_no_source = False

    def on_train_begin(self, cb_params: Any) -> None:
        train_network = train_network_of(cb_params)
        weights = getattr(train_network, "weights", None)
        if weights is None:
            optimizer = optimizer_of(cb_params)
            weights = getattr(optimizer, "parameters", None)
        names = [p.name for p in weights] if weights is not None else []
        self._index = LayerIndex(names, self._config.layers, self._config.max_series - self._config.top_k)
        for layer in self._index.watched:
            self._layer_zero.series(layer=layer)
        self._clip = self._config.clip if self._config.clip is not None else getattr(train_network, "clip_norm", None)
        from ms_exporter.cells.train_cells import GradNormTrainOneStepCell

        if isinstance(train_network, GradNormTrainOneStepCell):
            # The cell measures exactly the steps the monitor wants.
            train_network.every_n_steps = self._config.every_n_steps
        if self._clip is not None and self._clipped is None:
            self._clipped = self._store.register(catalogue.GRAD_NORM_CLIPPED).series()
        step = step_of(cb_params)
        every = self._config.every_n_steps
        self._next_step = (step // every + 1) * every

    def on_step(self, sample: StepSample) -> None:
        layout, outputs = sample.layout, sample.outputs
        # The cell measured this step: read it, whatever the step number. Either way the next sample is due
        # after this step (else the step after a measured one would look for a norm and find none).
        if not layout.measured_by_cell and sample.step < self._next_step:
            return
        every = self._config.every_n_steps
        self._next_step = (sample.step // every + 1) * every
        parameter_norms = None
        global_norm = None
        if layout.parameter_norms is not None:
            parameter_norms = _vector(outputs[layout.parameter_norms], self._index)
        if layout.global_norm is not None:
            global_norm = read_scalar(outputs[layout.global_norm])
        elif layout.grads is not None:
            parameter_norms = self._norms_from_grads(outputs[layout.grads])
        if global_norm is None and parameter_norms is not None:
            global_norm = math.sqrt(float(np.square(parameter_norms.astype(np.float64)).sum()))
        if global_norm is None:
            if not self._warned_no_source:
                self._warned_no_source = True
                # Once, as a warning: the TensorBoard article counts the gradient norm as a must-see, and a plain
                # Model(network, loss_fn, optimizer) hands the callback none (its train cell computes gradients
                # inside the compiled step). Computing them again here would cost a second backward pass per
                # measured step; the cell measures them in the step itself.
                logger.warning(
                    "ms_exporter: the train cell reports no gradient norm, so %s is not exported. Build the model as "
                    "Model(ms_exporter.GradNormTrainOneStepCell(nn.WithLossCell(network, loss_fn), optimizer)) to "
                    "get it (docs/getting-started.md, 'Gradient norms'), or in a loop of your own hand the gradients "
                    "over: monitor.step_end(loss, grads=grads); grad_norm.enable: false silences this",
                    catalogue.GRAD_NORM.name,
                )
            return
        self._norm.series().value = global_norm
        self._distribution.histogram().observe(global_norm)
        if self._clipped is not None and self._clip is not None and global_norm > self._clip:
            self._clipped.value += 1
        if parameter_norms is not None and self._index is not None:
            self._export_layers(self._index, self._index.layer_norms(parameter_norms))

    def _norms_from_grads(self, grads: dict[str, Any]) -> np.ndarray | None:
        """One compiled reduction over the gradients where they are, one transfer of a norm per gradient."""
        if self._index is None:
            return None
        position = {name: i for i, name in enumerate(self._index.names)}
        known = [
            (position[name], grad) for name, grad in grads.items() if name in position and hasattr(grad, "asnumpy")
        ]
        result = np.zeros(len(self._index.names))
        if known:
            result[[i for i, _ in known]] = device_norms([grad for _, grad in known])
        return result

    def _export_layers(self, index: LayerIndex, norms: np.ndarray) -> None:
        for layer, value in zip_strict(index.watched, norms[index.watched_positions].tolist()):
            self._layer_norm.series(layer=layer).value = value
            if value == 0.0:
                self._layer_zero.series(layer=layer).value += 1
        top: set[str] = set()
        k = min(self._config.top_k, len(index.other_positions))
        if k:
            others = norms[index.other_positions]
            best = index.other_positions[np.argpartition(others, len(others) - k)[-k:]]
            for position, value in zip_strict(best.tolist(), norms[best].tolist()):
                layer = index.layer_names[position]
                top.add(layer)
                self._layer_norm.series(layer=layer).value = value
        for layer in self._top - top:
            self._layer_norm.remove(layer=layer)  # fell out of the top k: its series goes stale
        self._top = top


def _vector(value: Any, index: LayerIndex | None) -> np.ndarray | None:
    array = to_numpy(value)
    if array is None or index is None:
        return None
    array = array.reshape(-1)
    # Local norms that do not line up with the parameters cannot be named: use only the global norm then.
    return array if len(array) == len(index.names) else None


def build(context: PartContext) -> list[Probe]:
    config: MonitorConfig = context.config
    return [GradNormProbe(context.store, config.grad_norm)] if config.grad_norm.enable else []


PART = ProbeEntry("grad_norm", build, (), order=110)
