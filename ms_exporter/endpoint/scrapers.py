"""Who scrapes this rank's /metrics, how often, and which pages each was served: how a rank that ended waits for
every scraper (a highly available Prometheus pair, an agent beside Prometheus) to read its end, not only the first."""

from __future__ import annotations

import statistics
import threading
from collections import OrderedDict, deque

# Scrapers remembered at once; past this a one-off reader, else the one heard from least recently, is forgotten.
# Scrapers are told apart by address and User-Agent: two Prometheus servers on two hosts, or vmagent and Prometheus
# on one, are two.
MAX_SCRAPERS = 16
# A scraper is still scraping while its last request is no older than this many of its intervals (plus a second).
ACTIVE_INTERVALS = 2.0


class _Scraper:
    __slots__ = ("requests", "renders")

    def __init__(self) -> None:
        self.requests: deque[float] = deque(maxlen=4)  # perf_counter times of its /metrics requests
        self.renders: deque[float] = deque(maxlen=4)  # when each page served to it was rendered

    def interval(self) -> float | None:
        times = list(self.requests)
        if len(times) < 2:
            return None
        return statistics.median(later - earlier for earlier, later in zip(times, times[1:]))


class ScraperLog:
    """Written by the endpoint's answer threads, read by the closing thread; one lock, microseconds held."""

    def __init__(self) -> None:
        self._scrapers: OrderedDict[tuple[str, str], _Scraper] = OrderedDict()
        self._lock = threading.Lock()

    def record(self, peer: str, user_agent: str, requested: float, rendered: float) -> None:
        key = (peer, user_agent)
        with self._lock:
            scraper = self._scrapers.pop(key, None) or _Scraper()
            self._scrapers[key] = scraper  # most recently heard from last
            if len(self._scrapers) > MAX_SCRAPERS:
                # One-off readers (a person's curl, a test's read) go first, so that many of them never push a
                # real scraper out; then the one heard from least recently.
                once = [k for k, s in self._scrapers.items() if len(s.requests) < 2 and s is not scraper]
                del self._scrapers[once[0] if once else next(iter(self._scrapers))]
            scraper.requests.append(requested)
            scraper.renders.append(rendered)

    def slowest_interval(self, now: float) -> float | None:
        """The longest interval among the scrapers still scraping at `now`; None when none is."""
        with self._lock:
            intervals = [interval for _, interval in self._active(now)]
        return max(intervals) if intervals else None

    def waiting(self, since: float, now: float, pages: int) -> int:
        """How many scrapers scraping at `now` have been served fewer than `pages` pages rendered at or after
        `since` (the moment training ended)."""
        with self._lock:
            return sum(
                1
                for scraper, _ in self._active(now)
                if sum(1 for rendered in scraper.renders if rendered >= since) < pages
            )

    def _active(self, now: float) -> list[tuple[_Scraper, float]]:
        """Each scraper that scrapes regularly and still does at `now`, with its interval: two requests seen, the
        last within ACTIVE_INTERVALS of its interval (plus a second). A person's one curl is not a scraper, and a
        scraper that stopped (a Prometheus shut down, a replica gone) is no longer waited for. Lock held."""
        found = []
        for scraper in self._scrapers.values():
            interval = scraper.interval()
            if interval is not None and now - scraper.requests[-1] <= ACTIVE_INTERVALS * interval + 1.0:
                found.append((scraper, interval))
        return found
