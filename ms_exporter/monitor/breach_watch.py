"""warn_on_value: one WARNING per breach episode and a counter of episodes per metric."""

from __future__ import annotations

import logging
from collections.abc import Mapping

from ms_exporter.config import Bound
from ms_exporter.monitor.store import MetricStore, Series

logger = logging.getLogger("ms_exporter")

BREACHES_METRIC = "mindspore_train_threshold_breaches_total"

# warn_on_value key -> the family it watches.
WATCHED_FAMILIES = {
    "loss": "mindspore_train_loss",
    "loss_smoothed": "mindspore_train_loss_smoothed",
    "tokens_per_second": "mindspore_train_tokens_per_second",
    "samples_per_second": "mindspore_train_samples_per_second",
    "memory_growth_ratio": "mindspore_train_memory_growth_ratio",
    "grad_norm": "mindspore_train_grad_norm",
    "layernorm_scale_drift_ratio": "mindspore_train_layernorm_scale_drift_ratio",
}
# Checked by the memory sampler thread rather than at step end.
SLOW_KEYS = frozenset({"memory_growth_ratio"})
# Throughput starts low while graphs compile: lower bounds wait for warm-up.
_NEEDS_WARMUP = frozenset({"tokens_per_second", "samples_per_second"})


class _Watch:
    def __init__(self, key: str, bound: Bound, family_name: str, counter: Series, warmup_steps: int) -> None:
        self.key = key
        self.bound = bound
        self.family_name = family_name
        self.counter = counter
        self.warmup_steps = warmup_steps if key in _NEEDS_WARMUP else 0
        self.in_breach: dict[tuple[tuple[str, str], ...], bool] = {}


class ThresholdWatcher:
    """An episode starts when a value crosses its bound and ends when it comes back; only the start counts."""

    def __init__(self, store: MetricStore, bounds: Mapping[str, Bound], warmup_steps: int) -> None:
        self._store = store
        family = store.counter(BREACHES_METRIC, "warn_on_value breach episodes, by metric.")
        self._step_watches: list[_Watch] = []
        self._slow_watches: list[_Watch] = []
        for key, bound in bounds.items():
            watch = _Watch(key, bound, WATCHED_FAMILIES[key], family.series(metric=key), warmup_steps)
            (self._slow_watches if key in SLOW_KEYS else self._step_watches).append(watch)
        # Series lists per family, rebuilt only when the store's set of series changed: the step path then
        # neither takes a family lock nor copies a list.
        self._series: dict[str, list[Series]] = {}
        self._version = -1

    def check_step(self, steps_done: int) -> None:
        for watch in self._step_watches:
            if steps_done >= watch.warmup_steps:
                self._check(watch)

    def check_slow(self) -> None:
        for watch in self._slow_watches:
            self._check(watch)

    def _check(self, watch: _Watch) -> None:
        if self._version != self._store.version:
            self._version = self._store.version
            self._series.clear()
        watched = self._series.get(watch.family_name)
        if watched is None:
            family = self._store.get(watch.family_name)
            watched = [s for s in family.children() if isinstance(s, Series)] if family is not None else []
            self._series[watch.family_name] = watched
        for series in watched:
            breached = watch.bound.breached(series.value)
            was = watch.in_breach.get(series.labels, False)
            if breached and not was:
                watch.counter.value += 1
                where = "".join(f" {k}={v}" for k, v in series.labels)
                logger.warning("ms_exporter: %s%s = %.6g breaches its threshold (%s %s%.6g); warning once until "
                               "it comes back", watch.key, where, series.value, watch.bound.direction,
                               "|value| " if watch.bound.absolute else "", watch.bound.value)
            watch.in_breach[series.labels] = breached
