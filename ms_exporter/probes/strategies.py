"""Your own measurements, as the first source article writes them: strategies (docs/strategies.md).

A strategy is any object with `on_step_end(metrics, cb_params)` that returns a mapping of numbers (or None):
`metrics` is the step's {step, epoch, loss, lr, step_time, samples, tokens, timestamp}, `cb_params` the run's
MindSpore callback parameters. `Strategy` is a base class with the hooks and the settings; the article's own
classes, which subclass nothing of ours, run unchanged.

Each strategy becomes a probe (StrategyProbe): it is called for every `every_n_steps`-th step as the step is
published (about once a second, on the training thread: the step itself never waits for it), its failures are
counted under `component="strategy.<name>"` and switch it off after repeated failures like a built-in probe's,
and its time is counted in mindspore_exporter_strategy_seconds_total{strategy}. Every number it returns is a gauge:
a key that names one of its declared `families` is written there, any other key `k` to
`mindspore_train_user_<name>_<k>` (catalogue.USER_PREFIX; `name` is the strategy's `name`, by default its class name in
snake case without a trailing "Strategy"). Its gauges are per-step columns too, so they reach TensorBoard and W&B
as well as /metrics, OTLP and JSON Lines.
"""

from __future__ import annotations

import re
import time
from collections.abc import Mapping
from typing import Any

from ms_exporter.config import ConfigError
from ms_exporter.core import catalogue
from ms_exporter.core.catalogue import MetricFamily
from ms_exporter.core.import_path import load_object
from ms_exporter.core.part import PartContext
from ms_exporter.core.probe import Probe
from ms_exporter.core.sample import StepSample
from ms_exporter.core.store import Series

_NOT_A_NAME = re.compile(r"[^a-z0-9_]+")


class Strategy:
    """A measurement of your own: subclass it, or write any class with the same `on_step_end`.

    `name` (the metric prefix and the `strategy` label) defaults to the class name in snake case without a trailing
    "Strategy"; `families` declares metric families a returned key may name; `every_n_steps` thins the calls.
    """

    name: str | None = None
    families: tuple[MetricFamily, ...] = ()
    every_n_steps: int = 1

    def __init__(self, config: Mapping[str, Any] | None = None) -> None:
        self.config = dict(config or {})

    def on_train_begin(self, cb_params: Any) -> None:
        """Once, when training begins: resolve what is fixed for the run."""

    def on_step_end(self, metrics: dict[str, Any], cb_params: Any) -> Mapping[str, Any] | None:
        """One step: return {key: number} to export, or None."""
        return None

    def on_train_end(self, cb_params: Any) -> None:
        """Once, when training ends."""


def strategy_name(strategy: Any) -> str:
    """The strategy's own `name`, else its class name in snake case without a trailing "Strategy"."""
    given = getattr(strategy, "name", None)
    if isinstance(given, str) and given:
        return _metric_part(given)
    words = re.sub(r"(?<=[a-z0-9])(?=[A-Z])", "_", type(strategy).__name__)
    return _metric_part(re.sub(r"_?strategy$", "", words.lower()) or "strategy")


def _metric_part(text: str) -> str:
    return _NOT_A_NAME.sub("_", text.lower()).strip("_") or "value"


class StrategyProbe(Probe):
    """One strategy as a probe (module docstring)."""

    def __init__(self, strategy: Any, context: PartContext, every_n_steps: int | None = None) -> None:
        if not callable(getattr(strategy, "on_step_end", None)):
            raise TypeError(f"{type(strategy).__name__} has no on_step_end(metrics, cb_params)")
        self.strategy = strategy
        self.label = strategy_name(strategy)
        self.name = f"strategy.{self.label}"
        every = every_n_steps if every_n_steps is not None else getattr(strategy, "every_n_steps", 1)
        self._every = max(1, int(every))
        self._store = context.store
        self._declared = {family.name: family for family in getattr(strategy, "families", ()) or ()}
        self._gauges: dict[str, Series] = {}
        self._seconds = context.store.register(catalogue.STRATEGY_SECONDS).series(strategy=self.label)
        self._cb_params: Any = None

    def on_train_begin(self, cb_params: Any) -> None:
        self._cb_params = cb_params  # MindSpore hands every hook the same object, updated in place
        begin = getattr(self.strategy, "on_train_begin", None)
        if callable(begin):
            self._timed(begin, cb_params)

    def on_step(self, sample: StepSample) -> None:
        if sample.step % self._every:
            return
        learning_rate = self._store.series_of(catalogue.LEARNING_RATE)  # the LR probe's, once it has one
        metrics = {
            "step": sample.step,
            "epoch": sample.epoch,
            "loss": sample.loss,
            "lr": learning_rate[0].value if learning_rate else None,
            "step_time": sample.duration,
            "samples": sample.samples,
            "tokens": sample.tokens,
            "timestamp": time.time_ns(),
        }
        returned = self._timed(self.strategy.on_step_end, metrics, self._cb_params)
        if returned is None:
            return
        if not isinstance(returned, Mapping):
            raise TypeError(
                f"{type(self.strategy).__name__}.on_step_end returned {type(returned).__name__}, not a dict"
            )
        for key, value in returned.items():
            number = _number(value)
            if number is not None:
                self._gauge(str(key)).value = number

    def on_train_end(self, step: int, completed: bool) -> None:
        end = getattr(self.strategy, "on_train_end", None)
        if callable(end):
            self._timed(end, self._cb_params)

    def _timed(self, call: Any, *args: Any) -> Any:
        began = time.perf_counter()
        try:
            return call(*args)
        finally:
            self._seconds.value += time.perf_counter() - began

    def _gauge(self, key: str) -> Series:
        gauge = self._gauges.get(key)
        if gauge is None:
            family = self._declared.get(key) or MetricFamily(
                f"{catalogue.USER_PREFIX}{self.label}_{_metric_part(key)}",
                "gauge",
                f"{key!r} as {type(self.strategy).__name__}.on_step_end returned it (docs/strategies.md).",
                "1",
            )
            gauge = self._gauges[key] = self._store.register(family).series()
            self._store.add_step_column(family)
        return gauge


def _number(value: Any) -> float | None:
    """A returned value as a float; None for what is not a number (a string, a list): those are not exported."""
    if isinstance(value, bool):
        return float(value)
    try:
        number = float(value)  # int, float, numpy scalars, 0-d arrays and Tensors
    except (TypeError, ValueError):
        return None
    return number  # a NaN stays NaN: the strategy said the number is not a number


def build(context: PartContext) -> list[Probe]:
    """The configured strategies (`monitor_config.strategies` entries with an import path), each its own probe."""
    probes: list[Probe] = []
    for index, spec in enumerate(context.config.strategies):
        try:
            strategy = load_object(spec["name"])(dict(spec.get("config") or {}))
            probes.append(StrategyProbe(strategy, context, spec.get("every_n_steps")))
        except Exception as exc:  # the user's class, built from the user's config: a configuration problem
            raise ConfigError(
                [f"monitor_config.strategies[{index}]: {spec['name']}(config) failed: {type(exc).__name__}: {exc}"]
            ) from exc
    return probes
