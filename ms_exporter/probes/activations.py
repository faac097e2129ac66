"""Optional (`activations.enable`): statistics of selected layers' outputs every `activations.every_n_steps` steps."""

from __future__ import annotations

import logging
import math
import re
from typing import Any

from ms_exporter.config import MonitorConfig
from ms_exporter.config.sections import ActivationsConfig
from ms_exporter.core import catalogue
from ms_exporter.core.cb_params import NETWORK, batch_of, sink_mode_of, step_of, train_network_of
from ms_exporter.core.compat import zip_strict
from ms_exporter.core.part import PartContext
from ms_exporter.core.probe import Probe
from ms_exporter.core.registry import ProbeEntry
from ms_exporter.core.store import MetricStore
from ms_exporter.probes.grad_norm import _warn_if_nothing_matches
from ms_exporter.probes.layernorm import spread_evenly

logger = logging.getLogger("ms_exporter")

# Why a layer's statistics can be missing after a measured step, by mode.
_MISSING = {
    "graph": "its statistics were not computed in the measured step: its parent calls it some other way than "
    "through the attribute the monitor's wrapper took (a plain Python list, an alias), or, in dataset sink mode, "
    "the sink's graph was compiled before training began (Model.build)",
    "pynative": "its forward hook did not run in the measured step: MindSpore runs no hooks inside a cell or "
    "function compiled with ms.jit; it is not hooked again",
}


def _whole_loop_graph(cb_params: Any) -> bool:
    """Whether the train network runs as one graph over a whole sink (dataset sink mode on a device; on a CPU
    MindSpore falls back to a step at a time): then no second graph can be switched to between steps."""
    import mindspore as ms

    return sink_mode_of(cb_params) and str(ms.get_context("device_target")) != "CPU"


class ActivationsProbe(Probe):
    """Mean, std, max |x| (of the finite values) and the shares of zeros and of non-finite values of each selected
    layer's output, at every `every_n_steps`-th step.

    How depends on the mode (docs/activations.md): in GRAPH mode the selected cells are wrapped and the measured
    steps run a second compiled graph that also reduces their outputs; in PYNATIVE mode forward hooks are registered
    for the measured step only. Either way the step path in between costs one comparison, and at the measured step's
    end the training thread stacks every layer's statistics on the device and reads them in one transfer (6 float32
    a layer, whatever the outputs' sizes). Layers: the cells whose names `layers` matches (from the
    start; none given: the network's top-level cells but its loss), at most `max_layers` of them, spread evenly
    over the model's depth.

    | name | type | labels | unit |
    |---|---|---|---|
    | mindspore_train_layer_activation_mean | gauge | layer | the output's units |
    | mindspore_train_layer_activation_std | gauge | layer | the output's units |
    | mindspore_train_layer_activation_abs_max | gauge | layer | the output's units |
    | mindspore_train_layer_activation_zero_ratio | gauge | layer | ratio |
    | mindspore_train_layer_activation_nonfinite_ratio | gauge | layer | ratio |
    """

    name = "activations"

    def __init__(self, store: MetricStore, config: ActivationsConfig) -> None:
        self._config = config
        self._mean = store.register(catalogue.LAYER_ACTIVATION_MEAN)
        self._std = store.register(catalogue.LAYER_ACTIVATION_STD)
        self._abs_max = store.register(catalogue.LAYER_ACTIVATION_ABS_MAX)
        self._zero = store.register(catalogue.LAYER_ACTIVATION_ZERO_RATIO)
        self._nonfinite = store.register(catalogue.LAYER_ACTIVATION_NONFINITE_RATIO)
        self._collector: Any = None  # cells.activation_stats.MeasuredGraph or OutputHooks
        self._mode = "graph"
        self._layers: list[str] = []
        self._wrapped: list[tuple[dict[str, Any], list[Any]]] = []  # (parents, wrappers): put back at train end
        self._known: dict[int, Any] = {}  # every wrapper made, by its cell's id: the same one at the next train call
        self._cb_params: Any = None
        self._compile_ahead = False
        self._next_step = config.every_n_steps  # the next measured step
        self._due = config.every_n_steps - 1  # the next step end that has something to do
        self._warned: set[str] = set()

    # -- lifecycle -------------------------------------------------------------------------------------------------
    def on_train_begin(self, cb_params: Any) -> None:
        import mindspore as ms

        from ms_exporter.cells import activation_stats as cells

        self._release()
        train_network = train_network_of(cb_params)
        backbone = cells.backbone_of(cb_params.get(NETWORK), train_network)
        if backbone is None:
            self._warn_once("no network", "ms_exporter: activations: MindSpore named no network; nothing measured")
            return
        named = cells.named_cells(backbone)
        selected = self._select([(name, cell) for name, cell, _, _ in named], cells.is_loss)
        self._layers = [name for name, _ in selected]
        if not selected:
            return
        self._mode = "graph" if ms.get_context("mode") == ms.GRAPH_MODE else "pynative"
        if self._mode == "graph":
            if train_network is None:
                self._warn_once("no train network", "ms_exporter: activations: no train network; nothing measured")
                return
            parents = {name: (parent, attribute) for name, _, parent, attribute in named}
            wrappers = cells.wrap(parents, selected, self._known)
            self._wrapped.append((parents, wrappers))
            always = _whole_loop_graph(cb_params)
            self._collector = cells.MeasuredGraph(train_network, wrappers, always=always)
            self._compile_ahead = not always
        else:
            self._collector = cells.OutputHooks(selected)
            self._compile_ahead = False
        self._cb_params = cb_params
        step = step_of(cb_params)
        self._schedule(step)
        if self._compile_ahead:
            self._due = step + 1  # the first step's end compiles the other graph

    def on_step_end(self, step: int, outputs: Any) -> None:
        if step < self._due:  # every step but the measured ones and the one before each
            return
        collector = self._collector
        if collector is None:
            self._due = 1 << 62
            return
        if self._compile_ahead:
            self._compile_ahead = False
            # Still the first step's compile time (the callback moves out of it after the parts' step end): the
            # graph the first step did not run is compiled now, not inside a later step, which would look slow.
            collector.compile_ahead(batch_of(self._cb_params))
        if (collector.armed or collector.always) and step >= self._next_step:
            self._export(collector.statistics())
        self._schedule(step)

    def on_train_end(self, step: int, completed: bool) -> None:
        self._release()

    def close(self) -> None:
        self._release()

    # -- internals -------------------------------------------------------------------------------------------------
    def _select(self, named: list[tuple[str, Any]], is_loss: Any) -> list[tuple[str, Any]]:
        patterns = self._config.layers
        if patterns:
            compiled = [re.compile(pattern) for pattern in patterns]
            names: dict[str, list[int]] = {name: [] for name, _ in named}
            for pattern, regex in zip_strict(patterns, compiled):
                _warn_if_nothing_matches(pattern, regex, names, [], setting="activations.layers")
            chosen = [(name, cell) for name, cell in named if any(regex.match(name) for regex in compiled)]
        else:
            chosen = [(name, cell) for name, cell in named if "." not in name and not is_loss(cell)]
        watched = spread_evenly(chosen, self._config.max_layers)
        if len(watched) < len(chosen):
            logger.info(
                "ms_exporter: activations.layers matches %d cells; watching %d spread over the model's depth "
                "(activations.max_layers): %s",
                len(chosen),
                len(watched),
                ", ".join(name for name, _ in watched),
            )
        return watched

    def _schedule(self, step: int) -> None:
        """After `step` (or at train begin): the next measured step, armed now when it is the next one."""
        every = self._config.every_n_steps
        self._next_step = (step // every + 1) * every
        collector = self._collector
        if collector is None:
            return
        if collector.always:
            self._due = self._next_step
        elif self._next_step == step + 1:
            collector.arm()
            self._due = self._next_step
        else:
            collector.disarm()
            self._due = self._next_step - 1

    def _export(self, statistics: dict[str, Any]) -> None:
        from ms_exporter.cells.activation_stats import ABS_MAX, COUNT, MEAN, NONFINITE_RATIO, STD, ZERO_RATIO

        missing = []
        for layer in self._layers:
            values = statistics.get(layer)
            if values is None or not values[COUNT] > 0:
                missing.append(layer)
                continue
            nonfinite = float(values[NONFINITE_RATIO])
            some_finite = nonfinite < 1.0
            # Without a finite value there is no mean, std or max |x| to give: NaN, not the 0 the reduction left.
            self._mean.series(layer=layer).value = float(values[MEAN]) if some_finite else math.nan
            self._std.series(layer=layer).value = float(values[STD]) if some_finite else math.nan
            self._abs_max.series(layer=layer).value = float(values[ABS_MAX]) if some_finite else math.nan
            self._zero.series(layer=layer).value = float(values[ZERO_RATIO])
            self._nonfinite.series(layer=layer).value = nonfinite
        if missing:
            self._warn_once(
                "missing " + self._mode,
                "ms_exporter: activations: no statistics for %s (%s); %s",
                ", ".join(missing),
                self._mode.upper(),
                _MISSING[self._mode],
            )
            if self._collector is not None:
                self._collector.drop(missing)

    def _release(self) -> None:
        """Let go of this training call's collector: graphs switched back, hooks removed, the network's cells put
        back where the wrappers stood (the network is as it was given between training calls)."""
        if self._collector is not None:
            self._collector.close()
        self._collector = None
        if self._wrapped:
            from ms_exporter.cells.activation_stats import unwrap

            for parents, wrappers in self._wrapped:
                unwrap(parents, wrappers)
            self._wrapped = []
        self._cb_params = None
        self._compile_ahead = False
        self._due = 1 << 62

    def _warn_once(self, key: str, message: str, *args: Any) -> None:
        if key not in self._warned:
            self._warned.add(key)
            logger.warning(message, *args)


def build(context: PartContext) -> list[Probe]:
    config: MonitorConfig = context.config
    return [ActivationsProbe(context.store, config.activations)] if config.activations.enable else []


PART = ProbeEntry("activations", build, (), order=150)
