"""A rank that ended normally keeps serving until its scraper has read `phase="ended"` (real sockets)."""

from __future__ import annotations

import socket
import threading
import time
import urllib.request
from collections.abc import Callable

from prometheus_client.parser import text_string_to_metric_families

from ms_exporter.core import catalogue
from ms_exporter.core.phases import PhaseClock
from ms_exporter.core.store import MetricStore
from ms_exporter.endpoint.scrapers import ACTIVE_INTERVALS, MAX_SCRAPERS, ScraperLog
from ms_exporter.sinks.prometheus import LINGER_MAX_SECONDS, PrometheusEndpoint


def ended_value(page: str) -> float | None:
    for family in text_string_to_metric_families(page):
        for found in family.samples:
            if found.name == catalogue.PHASE.name and found.labels.get("phase") == catalogue.ENDED:
                return found.value
    return None


class Scraper:
    """Scrapes every `interval` seconds until the endpoint goes, keeping each page's `ended` value."""

    def __init__(self, url: str, interval: float, user_agent: str = "Prometheus/2.42.0") -> None:
        self.seen: list[float | None] = []
        self.times: list[float] = []  # monotonic time each page arrived
        self._request = urllib.request.Request(url, headers={"User-Agent": user_agent})
        self._interval = interval
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while True:
            try:
                with urllib.request.urlopen(self._request, timeout=5) as response:
                    self.seen.append(ended_value(response.read().decode()))
                    self.times.append(time.monotonic())
            except OSError as exc:
                # A page that came too late on a loaded machine: Prometheus gives that scrape up and scrapes again
                # at its next interval, and so does this. Anything else (refused, reset) is the endpoint gone.
                if not isinstance(getattr(exc, "reason", exc), (TimeoutError, socket.timeout)):
                    return
            time.sleep(self._interval)

    def join(self) -> None:
        self._thread.join(15)


def wait_for(condition: Callable[[], bool], seconds: float = 30) -> None:
    deadline = time.monotonic() + seconds
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.02)


def endpoint() -> tuple[PrometheusEndpoint, PhaseClock]:
    store = MetricStore((("rank", "0"), ("project", "p")))
    clock = PhaseClock(store)
    served = PrometheusEndpoint(store, "127.0.0.1", 0, lambda component, exc: None)
    return served, clock


def test_close_waits_for_a_scrape_that_reads_ended() -> None:
    served, clock = endpoint()
    clock.enter(catalogue.STEP_PHASE)
    # 3 s: the wait's bound is three intervals and a second, so a loaded machine's delays (MindSpore 2.7's run of this
    # module beside a training: [0, 0, 0, 1] at 1.5 s) stay well inside it.
    scraper = Scraper(served.url, 3.0)
    deadline = time.monotonic() + 40
    while len(scraper.seen) < 3 and time.monotonic() < deadline:
        time.sleep(0.05)
    clock.enter(catalogue.ENDED)
    served.close()  # right after the end, as a script that exits when training returns
    scraper.join()
    assert scraper.seen[-1] == 1.0, scraper.seen
    assert 0.0 in scraper.seen
    # Two scrapes read the end: one the scraper gave up on (its timeout) would not have stored it.
    assert scraper.seen.count(1.0) >= 2, scraper.seen


def test_close_does_not_wait_when_nobody_scrapes_or_training_did_not_end() -> None:
    served, clock = endpoint()
    clock.enter(catalogue.ENDED)
    began = time.monotonic()
    served.close()
    assert time.monotonic() - began < LINGER_MAX_SECONDS / 2

    served, clock = endpoint()
    clock.enter(catalogue.STEP_PHASE)  # a run that raised keeps its phase: it did not end normally
    scraper = Scraper(served.url, 0.5)
    deadline = time.monotonic() + 30
    while len(scraper.seen) < 3 and time.monotonic() < deadline:
        time.sleep(0.05)
    count = len(scraper.seen)
    served.close()
    scraper.join()
    assert len(scraper.seen) <= count + 1


def test_close_waits_for_every_scraper_not_only_the_first() -> None:
    """An HA Prometheus pair, or vmagent beside Prometheus: the slow scraper reads the end too. Training ends just
    after the slow one scraped, so the fast one reads `ended` twice long before the slow one asks again: an end that
    waited for any two scrapes would be gone when the slow scraper comes back."""
    served, clock = endpoint()
    clock.enter(catalogue.STEP_PHASE)
    fast = Scraper(served.url, 0.2, "Prometheus/2.42.0")
    slow = Scraper(served.url, 1.5, "vm_promscrape")
    wait_for(lambda: len(slow.seen) >= 2)
    count = len(slow.seen)
    wait_for(lambda: len(slow.seen) > count)  # it just scraped: its next scrape is ~1.5 s away
    clock.enter(catalogue.ENDED)
    served.close()
    fast.join()
    slow.join()
    assert slow.seen[-1] == 1.0 and fast.seen[-1] == 1.0, (slow.seen, fast.seen)
    assert slow.seen.count(1.0) >= 2, slow.seen


def test_a_scraper_that_stopped_is_not_waited_for() -> None:
    """A replica shut down before the end: waiting for it would cost the whole linger (4.1 s at its 1 s interval)."""
    served, clock = endpoint()
    clock.enter(catalogue.STEP_PHASE)
    gone = Scraper(served.url, 1.0, "Prometheus/2.42.0")
    wait_for(lambda: len(gone.seen) >= 3)
    gone._request = urllib.request.Request("http://127.0.0.1:1/")  # its next scrape fails and it stops
    wait_for(lambda: not gone._thread.is_alive())
    time.sleep(ACTIVE_INTERVALS * 1.0 + 1.5)  # the time that tells a scraper that stopped from one between scrapes
    clock.enter(catalogue.ENDED)
    began = time.monotonic()
    served.close()
    assert time.monotonic() - began < 2.5


def test_many_one_off_readers_do_not_push_the_scraper_out() -> None:
    log = ScraperLog()
    for second in range(5):
        log.record("10.0.0.1", "Prometheus/2.42.0", float(second), float(second))
    for reader in range(3 * MAX_SCRAPERS):
        log.record("10.0.0.2", f"curl/{reader}", 4.5, 4.5)
    assert log.slowest_interval(5.0) == 1.0  # the Prometheus that scrapes every second is still known
    assert log.waiting(since=4.2, now=5.0, pages=2) == 1  # and still waited for: it read no page after 4.2
