"""Optional (`weight_norm: true`): L2 norm of the watched layers' weights at sampled steps."""

from __future__ import annotations

import math
from collections import deque
from typing import Any

from ms_exporter.config import GradNormConfig, MonitorConfig
from ms_exporter.core import catalogue
from ms_exporter.core.cb_params import step_of, trained_weights_of
from ms_exporter.core.device.device_reductions import square_sums
from ms_exporter.core.part import PartContext
from ms_exporter.core.probe import Probe
from ms_exporter.core.registry import ProbeEntry
from ms_exporter.core.sample import StepSample
from ms_exporter.core.store import MetricStore
from ms_exporter.probes.grad_norm import LayerIndex


class WeightNormProbe(Probe):
    """Watches the layers that `grad_norm.layers` names, every `grad_norm.every_n_steps` steps: one compiled
    reduction over their weights on the device, one transfer of 4 bytes per weight tensor.

    | name | type | labels | unit |
    |---|---|---|---|
    | mindspore_train_weight_norm | gauge | layer | L2 norm |
    """

    name = "weight_norm"

    def __init__(self, store: MetricStore, config: GradNormConfig) -> None:
        self._config = config
        self._family = store.register(catalogue.WEIGHT_NORM)
        self._layers: list[tuple[str, list[Any]]] = []
        self._pending: deque[tuple[int, list[tuple[str, float]]]] = deque()  # read, not yet published
        self._next_step = 0

    def on_train_begin(self, cb_params: Any) -> None:
        parameters = trained_weights_of(cb_params)
        # The same watched layers as the gradient norms, under the same cap.
        index = LayerIndex(
            [p.name for p in parameters], self._config.layers, self._config.max_series - self._config.top_k
        )
        self._layers = [(layer, [parameters[i] for i in index.layers[layer]]) for layer in index.watched]
        self._next_step = step_of(cb_params) + self._config.every_n_steps
        self._pending.clear()

    def on_step_end(self, step: int, outputs: Any) -> None:
        """Read as the step ends, on the training thread: read at publication, about once a second, the samples
        published together would all read the newest weights."""
        if step < self._next_step:
            return
        self._next_step = step + self._config.every_n_steps
        squares = square_sums([parameter for _, parameters in self._layers for parameter in parameters]).tolist()
        norms = []
        start = 0
        for layer, parameters in self._layers:
            norms.append((layer, math.sqrt(sum(squares[start : start + len(parameters)]))))
            start += len(parameters)
        self._pending.append((step, norms))  # exported when the step is published, in order with the others

    def on_step(self, sample: StepSample) -> None:
        while self._pending and self._pending[0][0] <= sample.step:
            _, norms = self._pending.popleft()
            for layer, norm in norms:
                self._family.series(layer=layer).value = norm


def build(context: PartContext) -> list[Probe]:
    config: MonitorConfig = context.config
    return [WeightNormProbe(context.store, config.grad_norm)] if config.weight_norm else []


PART = ProbeEntry("weight_norm", build, (), order=120)
