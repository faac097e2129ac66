"""Your own measurements, as the strategy-container article writes them: strategies (docs/strategies.md).

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
as well as /metrics, OTLP and JSON Lines. What it may add is bounded: MAX_KEYS keys of its own, numbers only; the
rest is dropped and counted (StrategyProbe). Whatever it raises, a BaseException included, is its failure unless a
signal raised it (monitor/isolation.py); whatever its construction raises is a ConfigError.
"""

from __future__ import annotations

import logging
import math
import operator
import re
import time
from collections.abc import Mapping
from typing import Any

from ms_exporter.config import ConfigError
from ms_exporter.core import catalogue
from ms_exporter.core.catalogue import MetricFamily
from ms_exporter.core.import_path import load_class
from ms_exporter.core.part import PartContext
from ms_exporter.core.probe import Probe
from ms_exporter.core.registry import ProbeEntry
from ms_exporter.core.sample import StepSample
from ms_exporter.core.store import Series

logger = logging.getLogger("ms_exporter")

_NOT_A_NAME = re.compile(r"[^a-z0-9_]+")

# A strategy's own keys get a series each up to this many (its declared `families` besides): a strategy whose keys
# change every step would otherwise add series, step columns and JSON Lines bytes without end (50 new keys a step
# made 14,650 series and 61 MB by step 300, and slowed each step with every column so far).
MAX_KEYS = 32
MAX_KEY_LENGTH = 100  # characters of a key: the metric name is built from it
MAX_EVERY = 10**9
# mindspore_exporter_strategy_dropped_total's reasons, and what each means for the log.
KEYS = "keys"
VALUE = "value"
_WHY = {
    KEYS: f"a strategy exports at most {MAX_KEYS} keys of its own (the first it returns), each at most "
    f"{MAX_KEY_LENGTH} characters; declare the families it needs or split it",
    VALUE: "only numbers are exported (not text, lists or complex numbers; not an integer beyond a float's range)",
}
_NUMERIC_KINDS = ("b", "i", "u", "f")  # numpy dtype kinds that are numbers


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
    """One strategy as a probe (module docstring).

    Its series are bounded: the first MAX_KEYS keys it returns (besides its declared `families`) get a gauge and a
    step column each, a later new key is dropped; only numbers are exported. What is dropped is counted in
    mindspore_exporter_strategy_dropped_total{strategy, reason} and logged once per reason.
    """

    def __init__(self, strategy: Any, context: PartContext, every_n_steps: int | None = None) -> None:
        try:  # the user's object: a property or a __getattr__ of its own may raise anything
            if not callable(getattr(strategy, "on_step_end", None)):
                kind = type(strategy).__name__
                raise ConfigError([f"strategies: {kind} has no on_step_end(metrics, cb_params) (docs/strategies.md)"])
            label = strategy_name(strategy)
            every = every_n_steps if every_n_steps is not None else getattr(strategy, "every_n_steps", 1)
            declared = {family.name: family for family in getattr(strategy, "families", ()) or ()}
        except ConfigError:
            raise
        except BaseException as exc:
            raise ConfigError(
                [f"strategies: {type(strategy).__name__} cannot be read: {type(exc).__name__}: {exc}"]
            ) from exc
        self.strategy = strategy
        self.label = label
        self.name = f"strategy.{label}"
        self._every = _every(every, strategy)
        self._store = context.store
        self._declared = declared
        self._gauges: dict[str, Series] = {}
        self._own_keys = 0  # keys with a gauge of their own (not a declared family): at most MAX_KEYS
        self._seconds = context.store.register(catalogue.STRATEGY_SECONDS).series(strategy=label)
        self._dropped = context.store.register(catalogue.STRATEGY_DROPPED)
        self._warned: set[str] = set()
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
            if number is None:
                self._drop(VALUE, f"{key!s:.100}={type(value).__name__}")
                continue
            name = key if isinstance(key, str) else str(key)
            gauge = self._gauges.get(name)
            if gauge is None and (gauge := self._gauge(name)) is None:
                self._drop(KEYS, f"{name:.100}")
                continue
            gauge.value = number

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

    def _gauge(self, key: str) -> Series | None:
        """A new key's gauge and step column; None when the key is over the bound (MAX_KEYS, MAX_KEY_LENGTH)."""
        family = self._declared.get(key)
        if family is None:
            if self._own_keys >= MAX_KEYS or len(key) > MAX_KEY_LENGTH:
                return None
            self._own_keys += 1
            family = MetricFamily(
                f"{catalogue.USER_PREFIX}{self.label}_{_metric_part(key)}",
                "gauge",
                f"{key!r} as {type(self.strategy).__name__}.on_step_end returned it (docs/strategies.md).",
                "1",
            )
        gauge = self._gauges[key] = self._store.register(family).series()
        self._store.add_step_column(family)
        return gauge

    def _drop(self, reason: str, what: str) -> None:
        self._dropped.series(strategy=self.label, reason=reason).value += 1
        if reason not in self._warned:
            self._warned.add(reason)
            logger.warning(
                "ms_exporter: strategy %s returned %s, which is not exported: %s (counted in %s{reason=%r} from now "
                "on, without further warnings; docs/strategies.md)",
                self.label,
                what,
                _WHY[reason],
                catalogue.STRATEGY_DROPPED.name,
                reason,
            )


def _every(value: Any, strategy: Any) -> int:
    """every_n_steps as a whole number of steps from 1; ConfigError for anything else (nan, 0, "10", True)."""
    if value is None:
        return 1
    if isinstance(value, float) and math.isfinite(value) and value.is_integer():
        value = int(value)
    try:
        every = operator.index(value) if not isinstance(value, bool) else 0
    except TypeError:
        every = 0
    if not 1 <= every <= MAX_EVERY:
        raise ConfigError(
            [
                f"strategies: {type(strategy).__name__}.every_n_steps must be a whole number of steps from 1 to "
                f"{MAX_EVERY}, got {value!r:.100}"
            ]
        )
    return every


def _number(value: Any) -> float | None:
    """A returned value as a float; None for what is not a number (a string, a list, a complex) and for a number
    beyond a float's range (10**400): those are dropped, each on its own."""
    if type(value) is float:  # the common case first: no attribute lookups on the way
        return value
    if isinstance(value, bool):
        return float(value)
    if isinstance(value, (str, bytes, bytearray)):
        return None  # float("1.5") would read text as a number: the docs promise numbers only
    kind = getattr(getattr(value, "dtype", None), "kind", None)
    if isinstance(kind, str) and kind not in _NUMERIC_KINDS:
        return None  # a numpy value of text, objects, dates or complex numbers
    try:
        return float(value)  # int, float, numpy scalars, 0-d arrays and Tensors; a NaN stays NaN
    except (TypeError, ValueError, OverflowError):
        return None


def build(context: PartContext) -> list[Probe]:
    """The configured strategies (`monitor_config.strategies` entries with an import path), each its own probe."""
    probes: list[Probe] = []
    for index, spec in enumerate(context.config.strategies):
        where = f"monitor_config.strategies[{index}]"
        try:
            kind = load_class(spec["name"], "on_step_end")
        except ValueError as exc:  # checked when the config was read; the module may have changed since
            raise ConfigError([f"{where}: {exc}"]) from None
        try:
            strategy = kind(dict(spec.get("config") or {}))
        except BaseException as exc:  # the user's class, built from the user's config: a configuration problem
            raise ConfigError(
                [f"{where}: {spec['name']}(config) failed: {type(exc).__name__}: {str(exc)[:300]}"]
            ) from exc
        try:
            probes.append(StrategyProbe(strategy, context, spec.get("every_n_steps")))
        except ConfigError as exc:
            raise ConfigError([f"{where}: {problem}" for problem in exc.problems]) from None
    return probes


PART = ProbeEntry("strategies", build, order=190)
