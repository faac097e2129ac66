"""The latest evaluation's metrics (Model.fit with a valid_dataset, or Model.eval inside training)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ms_exporter.core import catalogue
from ms_exporter.core.part import PartContext
from ms_exporter.core.probe import Probe
from ms_exporter.core.registry import ProbeEntry
from ms_exporter.core.store import MetricStore


class EvalProbe(Probe):
    """| mindspore_train_eval_metric | gauge | name | the metric's own unit |"""

    name = "eval"

    def __init__(self, store: MetricStore) -> None:
        self._family = store.register(catalogue.EVAL_METRIC)

    def on_eval(self, step: int, results: Mapping[str, Any]) -> None:
        for name, value in results.items():
            number = _number(value)
            if number is not None:
                self._family.series(name=str(name)).value = number


def _number(value: Any) -> float | None:
    try:
        return float(value)
    except (TypeError, ValueError):  # a confusion matrix or a dict: not one number, so not a gauge
        return None


def build(context: PartContext) -> list[Probe]:
    return [EvalProbe(context.store)]


PART = ProbeEntry("eval", build, ("eval",), order=170)
