"""warn_on_value: one WARNING per breach episode and a counter of episodes per metric."""

from __future__ import annotations

import logging
from collections.abc import Mapping

from ms_exporter.config import Bound
from ms_exporter.core import catalogue
from ms_exporter.core.catalogue import WATCHABLE, MetricFamily
from ms_exporter.core.store import MetricStore, Series

logger = logging.getLogger("ms_exporter")


class _Watch:
    def __init__(self, key: str, bound: Bound, family: MetricFamily, counter: Series, warmup_steps: int) -> None:
        self.key = key
        self.bound = bound
        self.family = family
        self.counter = counter
        self.warmup_steps = warmup_steps if WATCHABLE[key].after_warmup else 0
        self.in_breach: dict[tuple[tuple[str, str], ...], bool] = {}


class ThresholdWatcher:
    """An episode starts when a value crosses its bound and ends when it comes back; only the start counts."""

    def __init__(self, store: MetricStore, bounds: Mapping[str, Bound], warmup_steps: int) -> None:
        self._store = store
        family = store.register(catalogue.BREACHES)
        self._step_watches: list[_Watch] = []
        self._slow_watches: list[_Watch] = []
        for key, bound in bounds.items():
            watch = _Watch(key, bound, WATCHABLE[key].family, family.series(metric=key), warmup_steps)
            (self._slow_watches if WATCHABLE[key].slow else self._step_watches).append(watch)

    def check_step(self, steps_done: int) -> None:
        for watch in self._step_watches:
            if steps_done >= watch.warmup_steps:
                self._check(watch)

    def check_slow(self) -> None:
        for watch in self._slow_watches:
            self._check(watch)

    def _check(self, watch: _Watch) -> None:
        for series in self._store.series_of(watch.family):
            breached = watch.bound.breached(series.value)
            was = watch.in_breach.get(series.labels, False)
            if breached and not was:
                watch.counter.value += 1
                where = "".join(f" {k}={v}" for k, v in series.labels)
                logger.warning(
                    "ms_exporter: %s%s = %.6g breaches its threshold (%s %s%.6g); warning once until it comes back",
                    watch.key,
                    where,
                    series.value,
                    watch.bound.direction,
                    "|value| " if watch.bound.absolute else "",
                    watch.bound.value,
                )
            watch.in_breach[series.labels] = breached
