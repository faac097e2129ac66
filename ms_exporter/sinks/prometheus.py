"""Renders the store at scrape time on a per-rank HTTP endpoint, through prometheus_client."""

from __future__ import annotations

import ipaddress
import logging
import math
import socket
import time
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

from prometheus_client import CollectorRegistry
from prometheus_client.metrics_core import Metric
from prometheus_client.registry import Collector

from ms_exporter.config import ConfigError, WebConfig
from ms_exporter.core import catalogue
from ms_exporter.core.errors import OnError
from ms_exporter.core.part import DebugPage, PartContext
from ms_exporter.core.registry import BackendEntry
from ms_exporter.core.sink import Sink
from ms_exporter.core.store import FamilySnapshot, HistogramSeries, MetricStore
from ms_exporter.endpoint.live_history import StepHistory
from ms_exporter.endpoint.server import serve, tls_context
from ms_exporter.sinks.shared import series_budget

logger = logging.getLogger("ms_exporter")

# A rank that ended normally keeps serving at close until every scraper that scrapes it (an HA pair, an agent
# beside Prometheus) has read `phase="ended"` (alerts tell a finished rank from a dead one by it), for at most two
# intervals of the slowest of them and never longer than this.
LINGER_MAX_SECONDS = 30.0
# Scrapes of `ended` each scraper is to be served: a scrape the scraper gave up on (its timeout, on a loaded
# machine) was served here but never stored there, so one served page is not yet an end that was seen.
LINGER_SCRAPES = 2


class StoreCollector(Collector):
    """Turns the store into prometheus_client Metric objects; the library does the text format."""

    def __init__(self, store: MetricStore, on_error: OnError) -> None:
        self._store = store
        self._on_error = on_error

    def describe(self) -> list[Metric]:
        return []  # series appear during training; nothing to pre-declare

    def collect(self) -> Iterator[Metric]:
        constant = dict(self._store.constant_labels)
        read = self._store.families(lambda exc: self._on_error("prometheus", exc))
        for family in series_budget.kept(
            self._store, read
        ):  # series_profile: large_job (sinks/shared/series_budget.py)
            try:
                yield _render(family, constant)
            except Exception as exc:  # one broken family costs its series, never the whole scrape
                self._on_error("prometheus", exc)


def _render(family: FamilySnapshot, constant: dict[str, str]) -> Metric:
    if family.kind == "counter":
        base = family.name[: -len("_total")] if family.name.endswith("_total") else family.name
        metric = Metric(base, family.help, "counter")
        for child in family.children:
            metric.add_sample(base + "_total", {**constant, **dict(child.labels)}, float(child.value))  # type: ignore[union-attr]
        return metric
    metric = Metric(family.name, family.help, family.kind)
    for child in family.children:
        labels = {**constant, **dict(child.labels)}
        if isinstance(child, HistogramSeries):
            buckets, count, total = child.cumulative()
            for bound, cumulative in buckets:
                le = "+Inf" if math.isinf(bound) else repr(float(bound))
                metric.add_sample(family.name + "_bucket", {**labels, "le": le}, float(cumulative))
            metric.add_sample(family.name + "_count", labels, float(count))
            metric.add_sample(family.name + "_sum", labels, float(total))
        else:
            metric.add_sample(family.name, labels, float(child.value))
    return metric


class PrometheusEndpoint(Sink):
    """A private registry served on bind_address:port; a taken port falls back to any free one."""

    name = "prometheus"
    needs_signals = True  # a SIGTERM that ends the process waits for a scrape of `ended` (on_signal())

    def __init__(
        self,
        store: MetricStore,
        bind_address: str,
        port: int,
        on_error: OnError,
        web: WebConfig | None = None,
        history: StepHistory | None = None,
        debug_pages: Mapping[str, DebugPage] | None = None,
        trusted_file: Path | None = None,
    ) -> None:
        self.registry = CollectorRegistry(auto_describe=False)
        self._trusted_file = trusted_file
        self._debug_pages = debug_pages
        self.collector = StoreCollector(store, on_error)
        self.registry.register(self.collector)
        self._server: Any = None
        self._thread: Any = None
        self.requested_port = port
        self.bind_address = bind_address
        self.web = web or WebConfig()
        self._history = history
        self._on_error = on_error
        self._labels = dict(store.constant_labels)
        self._store = store
        self._tls = None
        if self.web.tls:
            try:
                self._tls = tls_context(self.web)
            except (OSError, ValueError) as exc:  # asked for TLS: never fall back to plain HTTP
                raise ConfigError(
                    [
                        f"monitor_config.web: cannot load the TLS certificate, key or client CA "
                        f"({self.web.tls_cert_file}, {self.web.tls_key_file}, "
                        f"{self.web.client_ca_file}): {exc}"
                    ]
                ) from exc
        self.port = self._start(bind_address, port)

    def _serve(self, address: str, port: int) -> Any:
        return serve(
            self.registry,
            self.web,
            address,
            port,
            self._on_error,
            self._tls,
            self._history,
            self._labels,
            self._debug_pages,
            self._trusted_file,
        )

    def _start(self, address: str, port: int) -> int:
        try:
            self._server, self._thread = self._serve(address, port)
        except OSError as exc:
            if port == 0:
                raise
            self._server, self._thread = self._serve(address, 0)
            actual = int(self._server.server_address[1])
            logger.warning(
                "ms_exporter: port %d on %s is not available (%s); serving metrics on port %d instead",
                port,
                address,
                exc.strerror or exc,
                actual,
            )
            return actual
        return int(self._server.server_address[1])

    @property
    def metrics_url(self) -> str | None:
        return self.url

    @property
    def url(self) -> str:
        host = self.bind_address
        if host in ("0.0.0.0", "::", ""):
            host = socket.gethostname()
        elif ":" in host:
            host = f"[{host}]"
        return f"{'https' if self.web.tls else 'http'}://{host}:{self.port}/metrics"

    def close(self) -> None:
        if self._server is not None:
            self._linger()
            self._server.shutdown()
            self._server.server_close()
            self._server = None

    def on_signal(self, signal_name: str, step: int) -> None:
        """A signal that ends the process entered `ended` first: serve it until each scraper read it LINGER_SCRAPES
        times (bounded as at close), so that the rank's end is seen before its target leaves discovery (file_sd
        comes after us)."""
        if self._server is not None:
            self._linger()

    def _ended_since(self) -> float | None:
        """perf_counter time training ended normally (the phase clock's `ended`), None if it did not."""
        for series in self._store.series_of(catalogue.PHASE):
            if series.labels == (("phase", catalogue.ENDED),) and series.value == 1:
                return time.perf_counter() - self._store.value_of(catalogue.PHASE_SECONDS)
        return None

    def _linger(self) -> None:
        """Wait until every scraper still scraping has been served LINGER_SCRAPES pages rendered after training
        ended: at most one interval of the slowest more than that many, never over LINGER_MAX_SECONDS."""
        ended = self._ended_since()
        scrapers = self._server.pages.scrapers
        interval = scrapers.slowest_interval(time.perf_counter())
        if ended is None or interval is None:
            return
        deadline = time.perf_counter() + min((LINGER_SCRAPES + 1) * interval + 1.0, LINGER_MAX_SECONDS)
        while (now := time.perf_counter()) < deadline and scrapers.waiting(ended, now, LINGER_SCRAPES):
            time.sleep(0.05)


def build(context: PartContext) -> list[Sink]:
    """The endpoint and the live page's ring it serves (the registry's `prometheus` backend); none when no port on
    the address could be bound: training goes on without an endpoint. Sets `context.port` for file_sd."""
    config = context.config
    history = StepHistory(context.store, config.all_bounds())
    port = config.port + context.rank.local_rank if config.port else 0
    try:
        endpoint = PrometheusEndpoint(
            context.store,
            config.bind_address,
            port,
            context.on_error,
            config.web,
            history,
            context.debug_pages,
            # The addresses whose password passed: the rank's next process checks them first (basic_auth.py).
            Path(config.save_dir) / f"ms_exporter-scrapers-rank{context.rank.rank}.json",
        )
    except OSError as exc:
        context.on_error("prometheus", exc)
        logger.error(
            "ms_exporter: cannot serve metrics on %s (%s); training continues without /metrics",
            config.bind_address,
            exc.strerror or exc,
        )
        return []
    logger.info("ms_exporter: rank %d serves metrics at %s", context.rank.rank, endpoint.url)
    if not _loopback(config.bind_address) and not config.web.tls_cert_file and not config.web.basic_auth_users:
        logger.warning(
            "ms_exporter: %s is reachable from other hosts without TLS or a password: anyone who can "
            "reach it reads the metrics, the live page and the hang dumps; set web.tls_cert_file and "
            "web.basic_auth_users (docs/configuration.md) or keep it behind a network policy",
            endpoint.url,
        )
    context.port = endpoint.port
    return [endpoint, history]


def _loopback(address: str) -> bool:
    if address == "localhost":
        return True
    try:
        return ipaddress.ip_address(address).is_loopback
    except ValueError:  # a host name: it may resolve anywhere
        return False


PART = BackendEntry("prometheus", build, order=10)
