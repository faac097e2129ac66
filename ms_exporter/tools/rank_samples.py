"""A /metrics page's samples grouped by rank: what `top` builds its rows from and `hangs` its rank states."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from prometheus_client.parser import text_string_to_metric_families


class RankSamples:
    """The samples of one rank (one `project`, `rank` pair) of one scrape, by name."""

    def __init__(self, samples: Iterable[Any]) -> None:
        self._by_name: dict[str, list[tuple[dict[str, str], float]]] = {}
        for sample in samples:
            self._by_name.setdefault(sample.name, []).append((sample.labels, float(sample.value)))

    def value(self, name: str, **labels: str) -> float | None:
        for found, value in self._by_name.get(name, ()):
            if all(found.get(k) == v for k, v in labels.items()):
                return value
        return None

    def by_label(self, name: str, label: str) -> dict[str, float]:
        return {found[label]: value for found, value in self._by_name.get(name, ()) if label in found}

    def by_labels(self, name: str, *labels: str) -> dict[tuple[str, ...], float]:
        """The family's samples by the values of `labels` (those that carry them all)."""
        return {
            tuple(found[label] for label in labels): value
            for found, value in self._by_name.get(name, ())
            if all(label in found for label in labels)
        }


def parse_ranks(text: str) -> dict[tuple[str, str], RankSamples]:
    """The samples of a /metrics page grouped by (project, rank); series without a `rank` label are left out.

    Raises ValueError when the page is not the Prometheus text format.
    """
    groups: dict[tuple[str, str], list[Any]] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            rank = sample.labels.get("rank")
            if rank is not None:
                groups.setdefault((sample.labels.get("project", ""), rank), []).append(sample)
    return {key: RankSamples(samples) for key, samples in groups.items()}
