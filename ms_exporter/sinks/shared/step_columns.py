"""The per-step series a step record carries (catalogue.JSONL_STEP_COLUMNS and the store's own step columns, a
user's strategies'), keyed as JSON Lines keys them; a writer may add families and key them its own way."""

from __future__ import annotations

from collections.abc import Callable

from ms_exporter.core import catalogue
from ms_exporter.core.catalogue import MetricFamily
from ms_exporter.core.store import MetricStore, Series

KeyOf = Callable[[MetricFamily, tuple[tuple[str, str], ...]], str]


def jsonl_key_of(family: MetricFamily, labels: tuple[tuple[str, str], ...]) -> str:
    return catalogue.jsonl_key(family.name, labels)


class StepColumns:
    """Reads the step columns' current values; rebinds (a new keys tuple) only when a series appeared, so that
    every record in between shares one keys tuple."""

    def __init__(self, store: MetricStore, extra: tuple[MetricFamily, ...] = (), key_of: KeyOf = jsonl_key_of) -> None:
        self._store = store
        self._extra = extra
        self._key_of = key_of
        self._keys: tuple[str, ...] = ()
        self._series: tuple[Series, ...] = ()
        self._version = -1

    def read(self) -> tuple[tuple[str, ...], tuple[float, ...]]:
        if self._version != self._store.version:
            self._bind()
        return self._keys, tuple([series.value for series in self._series])

    def _bind(self) -> None:
        self._version = self._store.version
        columns = [
            (self._key_of(family, series.labels), series)
            for family in (*catalogue.JSONL_STEP_COLUMNS, *self._store.step_columns, *self._extra)
            for series in self._store.series_of(family)
        ]
        self._keys = tuple(key for key, _ in columns)
        self._series = tuple(series for _, series in columns)
