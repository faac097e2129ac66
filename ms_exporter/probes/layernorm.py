"""LayerNorm scale (gamma) statistics and their drift, read from the parameters at sampled steps."""

from __future__ import annotations

import logging
from collections import deque
from typing import Any

from ms_exporter.config import LayerNormConfig, MonitorConfig
from ms_exporter.core import catalogue
from ms_exporter.core.cb_params import network_of, step_of
from ms_exporter.core.compat import zip_strict
from ms_exporter.core.device.device_reductions import moments
from ms_exporter.core.part import PartContext
from ms_exporter.core.probe import Probe
from ms_exporter.core.registry import ProbeEntry
from ms_exporter.core.sample import StepSample
from ms_exporter.core.store import MetricStore, Series
from ms_exporter.probes.grad_norm import layer_of

logger = logging.getLogger("ms_exporter")


def find_layernorm_scales(network: Any) -> list[tuple[str, Any]]:
    """(layer name, gamma Parameter) for every LayerNorm-like cell: nn.LayerNorm and cells named *LayerNorm/*RMSNorm."""
    found = []
    seen = set()
    for _, cell in network.cells_and_names():
        kind = type(cell).__name__
        if not (kind.endswith("LayerNorm") or kind.endswith("RMSNorm")):
            continue
        gamma = getattr(cell, "gamma", None)
        if gamma is None:
            gamma = getattr(cell, "weight", None)
        name = getattr(gamma, "name", None)
        if name is None or name in seen:
            continue
        seen.add(name)
        found.append((layer_of(name), gamma))
    return found


def spread_evenly(items: list[Any], limit: int) -> list[Any]:
    """At most `limit` of `items`, evenly spaced over them with the first and the last included (in order)."""
    if len(items) <= limit:
        return list(items)
    if limit == 1:
        return [items[-1]]
    last = len(items) - 1
    return [items[round(i * last / (limit - 1))] for i in range(limit)]


class _Scale:
    """One watched scale: its series (mean, std, drift) appear with its first sample, none before (a 0 would be
    read as a measured mean)."""

    def __init__(self, layer: str, parameter: Any) -> None:
        self.layer = layer
        self.parameter = parameter
        self.series: tuple[Series, Series, Series] | None = None
        self.history: deque[tuple[int, float]] = deque()


class LayerNormProbe(Probe):
    """Every `every_n_steps` steps from the first, on the training thread (a parameter read must not race the
    optimizer): the scales' mean and std reduced on the device in one compiled call, one transfer.

    Drift = (mean now - mean `window` steps ago) / |mean then|, using the oldest sample inside the window.
    A model with more than `max_layers` scales has `max_layers` of them watched, spread evenly over its depth.

    | name | type | labels | unit |
    |---|---|---|---|
    | mindspore_train_layernorm_scale_mean | gauge | layer | gamma units |
    | mindspore_train_layernorm_scale_std | gauge | layer | gamma units |
    | mindspore_train_layernorm_scale_drift_ratio | gauge | layer | ratio (0.3 = moved 30%) |
    """

    name = "layernorm"

    def __init__(self, store: MetricStore, config: LayerNormConfig) -> None:
        self._config = config
        self._mean = store.register(catalogue.LAYERNORM_MEAN)
        self._std = store.register(catalogue.LAYERNORM_STD)
        self._drift = store.register(catalogue.LAYERNORM_DRIFT)
        self._scales: list[_Scale] = []
        self._next_step = 0

    def on_train_begin(self, cb_params: Any) -> None:
        network = network_of(cb_params)
        known = {scale.layer: scale for scale in self._scales}
        self._scales = []
        found = find_layernorm_scales(network) if network is not None else []
        watched = spread_evenly(found, self._config.max_layers)
        if len(watched) < len(found):
            logger.info(
                "ms_exporter: the model has %d LayerNorm scales; watching %d spread over its depth "
                "(layernorm.max_layers), from %s to %s",
                len(found),
                len(watched),
                watched[0][0],
                watched[-1][0],
            )
        for layer, gamma in watched:
            scale = known.get(layer) or _Scale(layer, gamma)
            scale.parameter = gamma
            self._scales.append(scale)
        # The first sample is the first step's: one taken here would run a compiled reduction before the first step,
        # and a graph run installs MindSpore's own SIGINT handler, which answers a Ctrl-C with SIGTERM where Python's
        # KeyboardInterrupt would have ended the run (tests/integration/test_strategies.py).
        self._next_step = step_of(cb_params)

    def on_step(self, sample: StepSample) -> None:
        if sample.step >= self._next_step:
            self._next_step = sample.step + self._config.every_n_steps
            self.sample(sample.step)

    def sample(self, step: int) -> None:
        """Mean and std of every watched scale, reduced on the device in one compiled call, one transfer."""
        if not self._scales:
            return
        window = self._config.window
        rows = moments([scale.parameter for scale in self._scales]).tolist()
        for scale, (mean, std) in zip_strict(self._scales, rows):
            if scale.series is None:
                layer = scale.layer
                scale.series = (
                    self._mean.series(layer=layer),
                    self._std.series(layer=layer),
                    self._drift.series(layer=layer),
                )
            mean_series, std_series, drift_series = scale.series
            mean_series.value = mean
            std_series.value = std
            history = scale.history
            history.append((step, mean))
            while len(history) > 1 and history[1][0] <= step - window:
                history.popleft()
            then = history[0][1]
            drift_series.value = (mean - then) / abs(then) if then != 0 else 0.0


def build(context: PartContext) -> list[Probe]:
    config: MonitorConfig = context.config
    return [LayerNormProbe(context.store, config.layernorm)] if config.layernorm.enable else []


PART = ProbeEntry("layernorm", build, (), order=140)
