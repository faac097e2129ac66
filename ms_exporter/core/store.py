"""The one in-process store of current values that probes write and sinks read.

The training thread only assigns numbers to pre-bound series objects (an attribute write, no lock, no
formatting). Each series has a single writer; readers (the Prometheus collector at scrape time, the JSONL
writer, later the OTLP reader) copy values at their own pace. Creating or removing a series is rare and takes
the family's lock so that a reader never iterates a dict that changes size.
"""

from __future__ import annotations

import bisect
import math
import threading
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import cast

from ms_exporter.core.catalogue import MetricFamily, MetricType

Labels = tuple[tuple[str, str], ...]


class Series:
    """One gauge or counter time series: `value` is written by exactly one thread."""

    __slots__ = ("labels", "value")

    def __init__(self, labels: Labels, value: float = 0.0) -> None:
        self.labels = labels
        self.value = value


class ReadSeries(Series):
    """A gauge whose value is computed when a reader asks (the time spent in the current phase): the writer
    then only keeps its own state, and a scrape sees the value as of the scrape."""

    __slots__ = ("_read",)

    def __init__(self, labels: Labels, read: Callable[[], float]) -> None:  # noqa: PLW0231 - no value to set
        self.labels = labels
        self._read = read

    @property
    def value(self) -> float:  # type: ignore[override]  # read only: its writer is `read`
        return self._read()


class HistogramSeries:
    """One histogram time series with fixed upper bounds (the +Inf bucket is implicit)."""

    __slots__ = ("labels", "bounds", "counts", "sum")

    def __init__(self, labels: Labels, bounds: tuple[float, ...]) -> None:
        self.labels = labels
        self.bounds = bounds
        self.counts = [0] * (len(bounds) + 1)
        self.sum = 0.0

    def observe(self, value: float, count: int = 1) -> None:
        """Record `count` observations of `value` (a sink of n steps is n steps of the mean duration)."""
        self.counts[bisect.bisect_left(self.bounds, value)] += count
        self.sum += value * count

    def cumulative(self) -> tuple[list[tuple[float, int]], int, float]:
        """Cumulative buckets, count and sum; the count is derived from the buckets so they always agree."""
        counts = list(self.counts)
        total = 0
        buckets = []
        for bound, count in zip((*self.bounds, math.inf), counts):
            total += count
            buckets.append((bound, total))
        return buckets, total, self.sum


class Family:
    """A named metric with its series; label names may differ between the series of one family."""

    def __init__(
        self,
        name: str,
        kind: MetricType,
        help_text: str,
        buckets: Sequence[float] = (),
        on_new_series: Callable[[], None] | None = None,
    ) -> None:
        self.name = name
        self._on_new_series = on_new_series
        self.kind = kind
        self.help = help_text
        self.buckets = tuple(sorted(buckets))
        self._children: dict[Labels, Series | HistogramSeries] = {}
        self._lock = threading.Lock()

    def series(self, **labels: str) -> Series:
        """The gauge/counter series with these labels, created on first use."""
        # The kind is fixed per family, so a gauge/counter family only ever holds Series.
        return cast(Series, self._child(labels))

    def histogram(self, **labels: str) -> HistogramSeries:
        return cast(HistogramSeries, self._child(labels))

    def bind(self, read: Callable[[], float], **labels: str) -> Series:
        """A gauge series whose value `read()` gives at each reading (it replaces one with the same labels)."""
        key = tuple(labels.items())
        child = ReadSeries(key, read)
        with self._lock:
            self._children[key] = child
        if self._on_new_series is not None:
            self._on_new_series()
        return child

    def _child(self, labels: dict[str, str]) -> Series | HistogramSeries:
        key = tuple(labels.items())
        child = self._children.get(key)
        if child is None:
            with self._lock:
                child = self._children.get(key)
                if child is None:
                    child = HistogramSeries(key, self.buckets) if self.kind == "histogram" else Series(key)
                    self._children[key] = child
                    if self._on_new_series is not None:
                        self._on_new_series()
        return child

    def remove(self, **labels: str) -> None:
        with self._lock:
            removed = self._children.pop(tuple(labels.items()), None)
        if removed is not None and self._on_new_series is not None:
            self._on_new_series()  # readers that cache series lists must drop this one too

    def children(self) -> list[Series | HistogramSeries]:
        with self._lock:
            return list(self._children.values())


@dataclass(frozen=True)
class FamilySnapshot:
    name: str
    kind: MetricType
    help: str
    children: list[Series | HistogramSeries]


class MetricStore:
    """All families of one monitor, plus the labels every series carries (`rank`, `project`)."""

    def __init__(self, constant_labels: Labels = ()) -> None:
        self.constant_labels = constant_labels
        self._families: dict[str, Family] = {}
        self._lock = threading.Lock()
        # Bumped whenever a series appears or goes, so readers that cache series lists know to rebuild them.
        self.version = 0
        self._readers_cache: dict[str, tuple[int, tuple[Series, ...]]] = {}
        # Families besides catalogue.JSONL_STEP_COLUMNS that every step record carries (a user's strategy's).
        self.step_columns: tuple[MetricFamily, ...] = ()

    def _bump(self) -> None:
        self.version += 1

    def add_step_column(self, spec: MetricFamily) -> None:
        """Make `spec` a per-step column of the JSON Lines, TensorBoard and W&B records from now on."""
        with self._lock:
            if spec not in self.step_columns:
                self.step_columns = (*self.step_columns, spec)
        self._bump()

    def register(self, spec: MetricFamily) -> Family:
        """The family a catalogue entry describes, created on first use (the way probes and sinks register)."""
        return self._family(spec.name, spec.type, spec.help, spec.buckets)

    def _family(self, name: str, kind: MetricType, help_text: str, buckets: Sequence[float] = ()) -> Family:
        with self._lock:
            family = self._families.get(name)
            if family is None:
                family = Family(name, kind, help_text, buckets, self._bump)
                self._families[name] = family
            elif family.kind != kind:
                raise ValueError(f"metric {name} is already a {family.kind}, cannot register it as a {kind}")
            return family

    def get(self, name: str) -> Family | None:
        return self._families.get(name)

    def series_of(self, spec: MetricFamily) -> tuple[Series, ...]:
        """The gauge or counter series a family has now (nothing is created), the unlabelled one first.

        For the readers that look every step (breach watching, the live history, JSON Lines columns, actions):
        the tuple is kept until a series appears or goes, so the step path neither locks nor copies. Any thread
        may call it: an entry is stamped with the version it was built at and used only while that is current.
        """
        version = self.version
        cached = self._readers_cache.get(spec.name)
        if cached is not None and cached[0] == version:
            return cached[1]
        family = self._families.get(spec.name)
        children = family.children() if family is not None else []
        found = tuple(sorted((c for c in children if isinstance(c, Series)), key=lambda c: bool(c.labels)))
        self._readers_cache[spec.name] = (version, found)
        return found

    def value_of(self, spec: MetricFamily) -> float:
        """The value of the family's unlabelled series (else its first), NaN while nothing was measured."""
        found = self.series_of(spec)
        return found[0].value if found else math.nan

    def families(self, on_error: Callable[[BaseException], None] | None = None) -> Iterator[FamilySnapshot]:
        """A consistent view for readers: family list and each family's children copied under their locks.

        With `on_error`, a family that cannot be read is reported and skipped instead of ending the iteration.
        (`on_error` is an errors.OnPartError, spelled out here: errors.py builds on the store, not the reverse.)"""
        with self._lock:
            families = list(self._families.values())
        for family in families:
            try:
                children = family.children()
            except Exception as exc:
                if on_error is None:
                    raise
                on_error(exc)
                continue
            yield FamilySnapshot(family.name, family.kind, family.help, children)
