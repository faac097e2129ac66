"""The series budget: what a rank exposes under `series_profile: large_job` (docs/scaling.md, "Very large jobs").

Under `full` (the default) every rank exposes everything. Under `large_job` the ranks in `detail_ranks` still do;
every other rank exposes only the families an alert or recording rule of deploy/prometheus/rules reads, and of a
histogram among them only its `_sum` and `_count` (no rule reads a bucket). The per-layer families that rules read
(update ratios, LayerNorm drift) stay with the detail ranks: replicas hold the same layers, so those alerts fire
from a detail rank that holds them (a replica group, or rank 0 in pure data parallelism).

The filter runs where the store is read (the Prometheus collector at scrape time, the pushgateway through the same
collector, the OTLP reader on its interval): the training thread writes every series as before and pays nothing.
The families come from the rules themselves (rule_series.py, generated), so the budget cannot drift from them.
"""

from __future__ import annotations

import weakref
from collections.abc import Iterable, Iterator
from typing import cast

from ms_exporter.config.vocabulary import FULL_PROFILE, LARGE_JOB_PROFILE
from ms_exporter.core import catalogue
from ms_exporter.core.catalogue import MetricType
from ms_exporter.core.store import FamilySnapshot, HistogramSeries, MetricStore
from ms_exporter.sinks.shared.rule_series import RULE_SERIES

# Families rules read that only detail ranks keep: one series per layer, the same on every replica of a layer.
# MindSporeTrainingLayerFrozen (update ratios) and MindSporeTrainingLayerNormDrift fire from the detail ranks.
DETAIL_ONLY_RULE_FAMILIES = frozenset(
    family.name for family in (catalogue.LAYER_UPDATE_RATIO, catalogue.UPDATE_RATIO_MEDIAN, catalogue.LAYERNORM_DRIFT)
)
# What every rank keeps under large_job: each other family an alert or a recording rule reads (rule_series.py is
# written from the rendered rules by `make generate`: a new alert's families are kept without a hand edit).
EVERY_RANK = frozenset(RULE_SERIES) - DETAIL_ONLY_RULE_FAMILIES

# A histogram kept without its buckets is exposed as what it then is: a summary of `_sum` and `_count` only (an
# OpenMetrics histogram must have a +Inf bucket; a summary without quantiles is valid). The series names are the
# histogram's, so the rules read them unchanged.
SUM_AND_COUNT = cast(MetricType, "summary")


class _SumAndCount(HistogramSeries):
    """A copy of one histogram series as its count and sum: `cumulative()` has no buckets."""

    __slots__ = ()

    def cumulative(self) -> tuple[list[tuple[float, int]], int, float]:
        return [], self.counts[0], self.sum


def _sum_and_count(child: HistogramSeries) -> _SumAndCount:
    copy = _SumAndCount(child.labels, ())
    buckets, count, total = child.cumulative()  # one read of the writer's counts: count and sum as one scrape
    copy.counts[0] = count
    copy.sum = total
    return copy


class SeriesBudget:
    """Which families one rank exposes; `detail` ranks (and every rank under `full`) expose all of them."""

    def __init__(self, detail: bool) -> None:
        self.detail = detail

    def keeps(self, name: str) -> bool:
        return self.detail or name in EVERY_RANK

    def kept(self, families: Iterable[FamilySnapshot]) -> Iterator[FamilySnapshot]:
        """The families this rank exposes, histograms of a non-detail rank as their sum and count."""
        for family in families:
            if self.detail:
                yield family
            elif family.name not in EVERY_RANK:
                continue
            elif family.kind == "histogram":
                children = [_sum_and_count(c) for c in family.children if isinstance(c, HistogramSeries)]
                yield FamilySnapshot(family.name, SUM_AND_COUNT, family.help, list(children))
            else:
                yield family


FULL = SeriesBudget(detail=True)
_ATTACHED: weakref.WeakKeyDictionary[MetricStore, SeriesBudget] = weakref.WeakKeyDictionary()


def budget_for(profile: str, detail_ranks: Iterable[int], rank: int) -> SeriesBudget:
    """The budget of `rank` under a configuration's `series_profile` and `detail_ranks`."""
    if profile == FULL_PROFILE:
        return FULL
    if profile != LARGE_JOB_PROFILE:  # the config's check allows only these two
        raise ValueError(f"unknown series_profile {profile!r}")
    return SeriesBudget(detail=rank in set(detail_ranks))


def attach(store: MetricStore, profile: str, detail_ranks: Iterable[int], rank: int) -> SeriesBudget:
    """Give `store`'s readers this rank's budget (at construction, before any reader starts)."""
    budget = budget_for(profile, detail_ranks, rank)
    _ATTACHED[store] = budget
    return budget


def of(store: MetricStore) -> SeriesBudget:
    """The budget attached to `store`; everything when none was (a store built outside the monitor)."""
    return _ATTACHED.get(store, FULL)


def kept(store: MetricStore, families: Iterable[FamilySnapshot]) -> Iterator[FamilySnapshot]:
    """`families` of `store` as its budget exposes them (the collector's and the OTLP reader's one call)."""
    return of(store).kept(families)
