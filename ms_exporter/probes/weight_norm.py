"""Optional (`weight_norm: true`): L2 norm of the watched layers' weights at sampled steps."""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from ms_exporter.config import GradNormConfig
from ms_exporter.core import catalogue
from ms_exporter.core.cb_params import optimizer_of, step_of, train_network_of
from ms_exporter.core.probe import Probe
from ms_exporter.core.sample import StepSample, to_numpy
from ms_exporter.core.store import MetricStore
from ms_exporter.probes.grad_norm import LayerIndex


class WeightNormProbe(Probe):
    """Watches the layers that `grad_norm.layers` names, every `grad_norm.every_n_steps` steps.

    | name | type | labels | unit |
    |---|---|---|---|
    | mindspore_train_weight_norm | gauge | layer | L2 norm |
    """

    name = "weight_norm"

    def __init__(self, store: MetricStore, config: GradNormConfig) -> None:
        self._config = config
        self._family = store.register(catalogue.WEIGHT_NORM)
        self._layers: list[tuple[str, list[Any]]] = []
        self._next_step = 0

    def on_train_begin(self, cb_params: Any) -> None:
        # Model(GradNormTrainOneStepCell(...)) leaves cb_params.optimizer empty: the cell's weights are the same.
        weights = getattr(train_network_of(cb_params), "weights", None)
        if weights is None:
            weights = getattr(optimizer_of(cb_params), "parameters", None)
        parameters = list(weights or [])
        # The same watched layers as the gradient norms, under the same cap.
        index = LayerIndex(
            [p.name for p in parameters], self._config.layers, self._config.max_series - self._config.top_k
        )
        self._layers = [(layer, [parameters[i] for i in index.layers[layer]]) for layer in index.watched]
        self._next_step = step_of(cb_params) + self._config.every_n_steps

    def on_step(self, sample: StepSample) -> None:
        if sample.step < self._next_step:
            return
        self._next_step = sample.step + self._config.every_n_steps
        for layer, parameters in self._layers:
            total = 0.0
            for parameter in parameters:
                values = to_numpy(parameter)
                if values is not None:
                    total += float(np.square(values.astype(np.float64)).sum())
            self._family.series(layer=layer).value = math.sqrt(total)
