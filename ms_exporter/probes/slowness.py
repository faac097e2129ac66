"""Fail-slow: this rank's own work per step, its individual slowness score, and the step a slowdown began."""

from __future__ import annotations

import logging
import math
from typing import Any

from ms_exporter.config import MonitorConfig
from ms_exporter.core import catalogue
from ms_exporter.core.analysis.replicas import parallel_groups, read_layout
from ms_exporter.core.analysis.slowness import SCORE_WEIGHT, SETTLING_STEPS, SlownessDetector
from ms_exporter.core.part import PartContext
from ms_exporter.core.probe import Probe
from ms_exporter.core.ranks import RankInfo
from ms_exporter.core.registry import ProbeEntry
from ms_exporter.core.sample import StepSample
from ms_exporter.core.store import MetricStore

logger = logging.getLogger("ms_exporter")


class SlownessProbe(Probe):
    """Feeds core/analysis/slowness.py's detector one step at a time: own work is the step's data wait, the host
    time of other callbacks' hooks, checkpoints and evaluations in its cycle, and, in the loop API, the time the loop
    marked up to its collective; the cycle is all of those and the step. The score is the detector's, or lower where
    a device of the rank runs under the clock it was seen at (its clock over its best): the one slowdown inside a
    compiled step a host-side monitor can attribute.
    The first SETTLING_STEPS steps of each training call are not judged, nor are steps of a sink (one call, many
    steps: no step of its own). The series appear once the detector has its baseline.

    | name | type | labels | unit |
    |---|---|---|---|
    | mindspore_train_own_work_seconds | gauge | | seconds |
    | mindspore_train_clean_cycle_seconds | gauge | | seconds |
    | mindspore_train_slowness_score | gauge | | 1 |
    | mindspore_train_failslow | gauge | | 1 |
    | mindspore_train_failslow_onset_step | gauge | | steps (once a slowdown was flagged) |
    | mindspore_train_failslow_size_ratio | gauge | | 1 (once a slowdown was flagged) |
    | mindspore_train_failslow_onsets_total | counter | | slowdowns |
    | mindspore_train_failslow_seconds_total | counter | | seconds |
    | mindspore_train_parallel_group_info | gauge =1 | kind, group | node; stage, replica where the layout says |
    """

    name = "slowness"

    def __init__(self, store: MetricStore, rank: RankInfo | None = None, model_parallel: int | None = None) -> None:
        self._store = store
        self._rank = rank
        self._model_parallel = model_parallel
        self._grouped = False
        self._detector = SlownessDetector()
        self._settling = SETTLING_STEPS
        self._own = math.nan
        self._series: dict[str, Any] = {}
        self._best_clock: dict[Any, float] = {}  # each device's highest clock seen (its labels -> hertz)
        self.clock_ratio = 1.0  # the slowest device's clock over its best: 1 where no reader gives clocks

    def on_train_begin(self, cb_params: Any) -> None:
        self._settling = SETTLING_STEPS
        if not self._grouped and self._rank is not None:
            self._grouped = True  # the parallel context is set by the first training call, and kept
            self.publish_groups(
                self._rank, parallel_groups(self._rank.rank, read_layout(self._rank.world_size), self._model_parallel)
            )

    def publish_groups(self, rank: RankInfo, groups: dict[str, str]) -> None:
        """The groups a slowdown of this rank may be part of (the rules and `top` name a group whose every rank is
        flagged): its node, and the layout's."""
        info = self._store.register(catalogue.PARALLEL_GROUP_INFO)
        for kind, group in {"node": rank.node, **groups}.items():
            info.series(kind=kind, group=group).value = 1.0

    def on_step(self, sample: StepSample) -> None:
        wait = sample.data_wait
        if wait is None or sample.steps != 1:
            return
        if self._settling > 0:
            self._settling -= 1
            return
        own = wait + sample.hooks + sample.own_compute
        onset = self._detector.observe(sample.step, own, wait + sample.hooks + sample.duration)
        self._own = own if math.isnan(self._own) else self._own + SCORE_WEIGHT * (own - self._own)
        if not self._detector.warm:
            return
        if not self._series:
            self._bind()
        self._publish()
        if onset is not None:
            self._series["onsets"].value += 1
            logger.warning(
                "fail-slow: this rank's own work per step rose by %.0f%% of its clean cycle from step %d "
                "(flagged at step %d; docs/failslow.md)",
                100 * onset.size,
                onset.step,
                onset.flagged_at,
            )

    def _clock(self) -> float:
        """The slowest of the rank's devices, as its compute clock now over the highest it was seen at (the hardware
        readers write mindspore_train_device_clock_hertz every hardware.interval): a throttled device slows a
        compiled step on this rank where its own work shows nothing."""
        ratio = 1.0
        for clock in self._store.series_of(catalogue.DEVICE_CLOCK):
            now = clock.value
            if not now > 0:  # NaN or 0: no reading
                continue
            best = self._best_clock.get(clock.labels, 0.0)
            if now > best:
                self._best_clock[clock.labels] = best = now
            ratio = min(ratio, now / best)
        self.clock_ratio = ratio
        return ratio

    def _bind(self) -> None:
        store = self._store
        self._series = {
            "own": store.register(catalogue.OWN_WORK).series(),
            "cycle": store.register(catalogue.CLEAN_CYCLE).series(),
            "score": store.register(catalogue.SLOWNESS_SCORE).series(),
            "flagged": store.register(catalogue.FAILSLOW).series(),
            "onsets": store.register(catalogue.FAILSLOW_ONSETS).series(),
            "seconds": store.register(catalogue.FAILSLOW_SECONDS).series(),
        }

    def _publish(self) -> None:
        detector, series = self._detector, self._series
        series["own"].value = self._own
        series["cycle"].value = detector.baseline_cycle
        series["score"].value = min(detector.score, self._clock())
        series["flagged"].value = 1.0 if detector.flagged else 0.0
        series["seconds"].value = detector.lost_seconds
        if detector.onset_step >= 0:
            if "onset" not in series:
                series["onset"] = self._store.register(catalogue.FAILSLOW_ONSET_STEP).series()
                series["size"] = self._store.register(catalogue.FAILSLOW_SIZE).series()
            series["onset"].value = float(detector.onset_step)
            series["size"].value = detector.size


def build(context: PartContext) -> list[Probe]:
    config: MonitorConfig = context.config
    if not config.failslow.enable:
        return []
    return [SlownessProbe(context.store, context.rank, config.divergence.model_parallel)]


PART = ProbeEntry("slowness", build, (), order=70)
