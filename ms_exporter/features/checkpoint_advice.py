"""The checkpoint interval a run should use, advised from its own failures, save time and failure cost
(docs/failslow.md#checkpoint-interval). Part of the goodput feature: it reads the run state and the time ledger.

| name | type | labels | unit |
|---|---|---|---|
| mindspore_train_checkpoint_save_seconds | gauge | | seconds (once this process saved) |
| mindspore_train_checkpoint_interval_seconds | gauge | | seconds (once it saved twice) |
| mindspore_train_mtbf_seconds | gauge | | seconds (once the run restarted) |
| mindspore_train_failure_cost_seconds | gauge | | seconds (once the run restarted) |
| mindspore_train_checkpoint_interval_advised_seconds | gauge | bound | seconds (restarted and saved) |
| mindspore_train_checkpoint_interval_goodput_loss_ratio | gauge | | 1 (and saved twice) |
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from ms_exporter.core import catalogue as c
from ms_exporter.core.analysis.checkpoint_interval import Advice, advise
from ms_exporter.core.analysis.ledger import INDEX, TimeLedger
from ms_exporter.core.store import MetricStore

_STARTUP, _COMPILE = INDEX[c.STARTUP], INDEX[c.COMPILE]


class CheckpointAdvisor:
    """refresh(run_seconds) after each save of the run state (the goodput saver's thread): the run's failures are
    its restarts, its exposure its wall time so far (every process), the save time and the current interval this
    process's saves (the ledger's `saves`), and a failure's cost the time from the previous process's last state
    save to this process's start (detection, rescheduling) plus this process's start-up and compilation. Each
    series appears once what it needs was seen; none is made up before."""

    def __init__(
        self, store: MetricStore, ledger: TimeLedger, restarts: int, previous_saved: float | None, started: float
    ) -> None:
        self._store = store
        self._ledger = ledger
        self._restarts = restarts
        # Unix time of this process's start less the previous process's last save: the failure's dead time.
        self._dead = max(0.0, started - previous_saved) if restarts and previous_saved is not None else None
        self._series: dict[str, Any] = {}
        self.advice: Advice | None = None

    def refresh(self, run_seconds: Sequence[float]) -> None:
        saves = self._ledger.saves
        save, current = saves.mean_save, saves.interval
        if not math.isnan(save):
            self._set("save", c.CHECKPOINT_SAVE_SECONDS, save)
        if not math.isnan(current):
            self._set("current", c.CHECKPOINT_INTERVAL, current)
        if not self._restarts or self._dead is None:
            return
        seconds = self._ledger.seconds()
        cost = self._dead + seconds[_STARTUP] + seconds[_COMPILE]
        exposure = sum(run_seconds)
        self._set("mtbf", c.MTBF, exposure / self._restarts)
        self._set("cost", c.FAILURE_COST, cost)
        if math.isnan(save):
            return
        advice = self.advice = advise(exposure, self._restarts, save, cost, None if math.isnan(current) else current)
        if advice is None:
            return
        for bound, value in zip(c.ADVISED_BOUNDS, (advice.interval, advice.low, advice.high)):
            self._set(bound, c.CHECKPOINT_INTERVAL_ADVISED, value, bound=bound)
        if advice.loss is not None:
            self._set("loss", c.CHECKPOINT_GOODPUT_LOSS, advice.loss)

    def _set(self, key: str, family: c.MetricFamily, value: float, **labels: str) -> None:
        series = self._series.get(key)
        if series is None:
            series = self._series[key] = self._store.register(family).series(**labels)
        series.value = value
