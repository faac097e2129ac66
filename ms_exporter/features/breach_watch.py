"""warn_on_value: one WARNING per breach episode and a counter of episodes per metric.

Two habits the monitor_config article asks of a threshold so that it does not flood the log: nothing is watched during
a warm-up (`warn_warmup_steps`, loss included: "loss is high while it warms up ... train a few tens of steps
first"), and a value that crosses its bound back and forth is one episode until it has stayed inside for
CALM_CHECKS checks in a row.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping

from ms_exporter.config import Bound
from ms_exporter.core import catalogue
from ms_exporter.core.catalogue import WATCHABLE, MetricFamily
from ms_exporter.core.store import MetricStore, Series

logger = logging.getLogger("ms_exporter")

# Checks in a row (steps, or samples of a slow metric) inside its bound that end a breach episode.
CALM_CHECKS = 10


class _Watch:
    def __init__(
        self, key: str, bound: Bound, family: MetricFamily, counter: Series, warmup_steps: int, watch_after: int
    ) -> None:
        self.key = key
        self.bound = bound
        self.family = family
        self.counter = counter
        self.warmup_steps = max(watch_after, warmup_steps if WATCHABLE[key].after_warmup else 0)
        # series labels -> checks in a row inside the bound since its episode began; absent: no episode
        self.calm: dict[tuple[tuple[str, str], ...], int] = {}


class ThresholdWatcher:
    """An episode starts when a value crosses its bound and ends when it comes back; only the start counts."""

    def __init__(
        self, store: MetricStore, bounds: Mapping[str, Bound], warmup_steps: int, watch_after: int = 0
    ) -> None:
        """`warmup_steps`: the run's warm-up, for the throughput bounds; `watch_after`: steps before any bound."""
        self._store = store
        family = store.register(catalogue.BREACHES)
        self._step_watches: list[_Watch] = []
        self._slow_watches: list[_Watch] = []
        self._steps_done = 0
        for key, bound in bounds.items():
            watch = _Watch(key, bound, WATCHABLE[key].family, family.series(metric=key), warmup_steps, watch_after)
            (self._slow_watches if WATCHABLE[key].slow else self._step_watches).append(watch)

    def check_step(self, steps_done: int) -> None:
        self._steps_done = steps_done
        for watch in self._step_watches:
            if steps_done >= watch.warmup_steps:
                self._check(watch)

    def check_slow(self) -> None:
        """A slow metric (memory, sampled on its own thread) is watched once the steps are past its warm-up."""
        for watch in self._slow_watches:
            if self._steps_done >= watch.warmup_steps:
                self._check(watch)

    def _check(self, watch: _Watch) -> None:
        for series in self._store.series_of(watch.family):
            breached = watch.bound.breached(series.value)
            calm = watch.calm.get(series.labels)
            if calm is not None:  # in an episode: it ends after CALM_CHECKS checks in a row inside the bound
                calm = 0 if breached else calm + 1
                if calm >= CALM_CHECKS:
                    del watch.calm[series.labels]
                else:
                    watch.calm[series.labels] = calm
                continue
            if breached:
                watch.calm[series.labels] = 0
                watch.counter.value += 1
                where = "".join(f" {k}={v}" for k, v in series.labels)
                logger.warning(
                    "ms_exporter: %s%s = %.6g breaches its threshold (%s %s%.6g); warning once until it has stayed "
                    "inside for %d checks",
                    watch.key,
                    where,
                    series.value,
                    watch.bound.direction,
                    "|value| " if watch.bound.absolute else "",
                    watch.bound.value,
                    CALM_CHECKS,
                )
