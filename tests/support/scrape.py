"""Test helper: a real HTTP scrape parsed with prometheus_client's own parser."""

from __future__ import annotations

import itertools
import urllib.request

from prometheus_client.parser import text_string_to_metric_families


class Scrape:
    """Samples of one scrape, looked up by name and labels (rank/project may be left out)."""

    def __init__(self, text: str) -> None:
        self.text = text
        self.samples = [s for family in text_string_to_metric_families(text) for s in family.samples]

    def find(self, metric: str, /, **labels: str) -> list[float]:
        return [
            s.value for s in self.samples if s.name == metric and all(s.labels.get(k) == v for k, v in labels.items())
        ]

    def value(self, metric: str, /, **labels: str) -> float:
        found = self.find(metric, **labels)
        if len(found) != 1:
            raise AssertionError(f"expected one sample {metric}{labels}, found {len(found)}")
        return found[0]

    def labels_of(self, name: str) -> list[dict[str, str]]:
        return [dict(s.labels) for s in self.samples if s.name == name]

    def has(self, metric: str, /, **labels: str) -> bool:
        return bool(self.find(metric, **labels))


# Each read of a test says it is a read of its own (its User-Agent), as a person's curl is one: the endpoint tells
# scrapers apart by address and User-Agent, and a rank whose training ended holds its close() until every scraper it
# saw twice has read the end (up to 30 s, sinks/prometheus.py). A test that read a monitor twice would hold each
# close() so, waiting for a third read that never comes. Where a test runs a real scraper (Prometheus), that is it.
_READS = itertools.count()


def scrape(url: str, timeout: float = 5.0) -> Scrape:
    request = urllib.request.Request(url, headers={"User-Agent": f"ms_exporter-tests/read-{next(_READS)}"})
    with urllib.request.urlopen(request, timeout=timeout) as response:
        return Scrape(response.read().decode("utf-8"))
