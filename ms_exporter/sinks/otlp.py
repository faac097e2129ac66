"""Exports the store through the OpenTelemetry SDK: a PeriodicExportingMetricReader and an OTLP exporter.

Gauges and counters are observable instruments whose callbacks read the store when the reader collects, so
the SDK does the aggregation and the training thread never calls into OpenTelemetry. The SDK has no
asynchronous histogram instrument, and the store already holds cumulative bucket counts: histograms are added
to each batch as SDK histogram points by the exporter wrapper, which also counts failed exports. What needs
SDK internals (the wrapper carrying the inner exporter's preferences, the names of the SDK's loggers) is in
otel_sdk.py, with the versions it was tested with.
"""

from __future__ import annotations

import logging
import math
import os
import threading
import time
import urllib.parse
from collections.abc import Callable, Iterable
from typing import Any

from opentelemetry.metrics import CallbackOptions, Observation
from opentelemetry.sdk.environment_variables import OTEL_METRIC_EXPORT_INTERVAL
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import (
    AggregationTemporality,
    Histogram,
    HistogramDataPoint,
    Metric,
    MetricExporter,
    MetricExportResult,
    MetricsData,
    PeriodicExportingMetricReader,
    ResourceMetrics,
    ScopeMetrics,
)
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.util.instrumentation import InstrumentationScope

from ms_exporter._version import __version__
from ms_exporter.config import OtlpConfig
from ms_exporter.core.errors import OnError
from ms_exporter.core.part import PartContext
from ms_exporter.core.ranks import RankInfo
from ms_exporter.core.redaction import url_for_logs
from ms_exporter.core.registry import BackendEntry
from ms_exporter.core.sink import Sink
from ms_exporter.core.store import Family, HistogramSeries, MetricStore, Series
from ms_exporter.sinks.shared import otel_sdk, series_budget

logger = logging.getLogger("ms_exporter")

SCOPE = InstrumentationScope("ms_exporter", __version__)
DEFAULT_INTERVAL_MILLIS = 60_000.0  # the OpenTelemetry specification's default for OTEL_METRIC_EXPORT_INTERVAL


def otlp_name(name: str, kind: str) -> str:
    """OpenTelemetry names counters without Prometheus' `_total`; the Collector's Prometheus exporters add it back."""
    return name[: -len("_total")] if kind == "counter" and name.endswith("_total") else name


def _unit(name: str) -> str:
    if name.endswith("_seconds"):
        return "s"
    if name.endswith("_bytes"):
        return "By"
    return ""


def resolve_protocol(config: OtlpConfig) -> str:
    """monitor_config first, then the standard variables, then gRPC (the SDK's own default)."""
    return (
        config.protocol
        or os.environ.get("OTEL_EXPORTER_OTLP_METRICS_PROTOCOL")
        or os.environ.get("OTEL_EXPORTER_OTLP_PROTOCOL")
        or "grpc"
    )


def build_exporter(config: OtlpConfig) -> MetricExporter:
    """The SDK's OTLP exporter; what monitor_config leaves unset, the SDK reads from OTEL_EXPORTER_OTLP_*."""
    protocol = resolve_protocol(config)
    if protocol == "grpc":
        from opentelemetry.exporter.otlp.proto.grpc.metric_exporter import OTLPMetricExporter as GrpcExporter

        headers = None if config.headers is None else dict(config.headers)  # None: OTEL_EXPORTER_OTLP_HEADERS
        return GrpcExporter(endpoint=config.endpoint, insecure=config.insecure, headers=headers, timeout=config.timeout)
    if protocol != "http/protobuf":
        raise ValueError(
            f"OTLP protocol {protocol!r} (from OTEL_EXPORTER_OTLP_PROTOCOL) is not supported; use grpc or http/protobuf"
        )
    from opentelemetry.exporter.otlp.proto.http.metric_exporter import OTLPMetricExporter as HttpExporter

    endpoint = config.endpoint
    if endpoint and urllib.parse.urlsplit(endpoint).path in ("", "/"):
        # The variable OTEL_EXPORTER_OTLP_ENDPOINT gets the signal path appended by the SDK; do the same here.
        endpoint = endpoint.rstrip("/") + "/v1/metrics"
    return HttpExporter(endpoint=endpoint, headers=config.headers, timeout=config.timeout)


def export_interval_millis(config: OtlpConfig) -> float:
    """monitor_config first, then OTEL_METRIC_EXPORT_INTERVAL (milliseconds), then 60 s, as the SDK reads them."""
    if config.interval is not None:
        return config.interval * 1000
    raw = os.environ.get(OTEL_METRIC_EXPORT_INTERVAL)
    if raw is None:
        return DEFAULT_INTERVAL_MILLIS
    try:
        return float(raw)  # zero or less: the reader refuses it, as it would the variable itself
    except ValueError:
        logger.warning(
            "ms_exporter: %s=%r is not a number of milliseconds; exporting every %.0f s",
            OTEL_METRIC_EXPORT_INTERVAL,
            raw,
            DEFAULT_INTERVAL_MILLIS / 1000,
        )
        return DEFAULT_INTERVAL_MILLIS


def describe_target(config: OtlpConfig) -> str:
    """Where exports go, for messages: never the headers, nor the endpoint's user:password@ (or token@) and query
    values, which may carry credentials."""
    endpoint = (
        config.endpoint
        or os.environ.get("OTEL_EXPORTER_OTLP_METRICS_ENDPOINT")
        or os.environ.get("OTEL_EXPORTER_OTLP_ENDPOINT")
    )
    shown = url_for_logs(endpoint) if endpoint else "the SDK's default endpoint"
    return f"{shown} ({resolve_protocol(config)})"


def build_resource(rank: RankInfo, project: str) -> Resource:
    """service.name is the project; OTEL_RESOURCE_ATTRIBUTES adds to (never replaces) these."""
    return Resource.create(
        {
            "service.name": project,
            "service.instance.id": f"{rank.node}/rank-{rank.rank}",
            "host.name": rank.node,
            "mindspore.rank": rank.rank,
            "mindspore.local_rank": rank.local_rank,
            "mindspore.world_size": rank.world_size,
        }
    )


class StoreHistogramExporter(MetricExporter):
    """Wraps the OTLP exporter: appends the store's histograms to each batch and counts failed exports."""

    def __init__(
        self, inner: MetricExporter, store: MetricStore, on_error: OnError, target: str = "the OTLP endpoint"
    ) -> None:
        super().__init__(**otel_sdk.preferences(inner))  # what the reader asks its exporter for
        self._inner = inner
        self._store = store
        self._on_error = on_error
        self._target = target
        self._started_ns = time.time_ns()
        self.exports = 0
        self.failures = 0
        self.after_export: Callable[[], None] | None = None
        self.quiet = _QuietSdkLogs()

    def export(self, metrics_data: MetricsData, timeout_millis: float = 10_000, **kwargs: Any) -> MetricExportResult:
        self.quiet.enter()
        try:
            batch = self._with_histograms(metrics_data)
            result = self._inner.export(batch, timeout_millis=timeout_millis, **kwargs)
        except Exception as exc:  # never into the reader's thread loop, never into training
            result = MetricExportResult.FAILURE
            self.failures += 1
            self._on_error("otlp", exc)
        else:
            self.exports += 1
            if result is not MetricExportResult.SUCCESS:
                self.failures += 1
                self._on_error(
                    "otlp",
                    ConnectionError(
                        f"OTLP export to {self._target} failed (collector unreachable, slower than otlp.timeout, or "
                        "refusing the data); this batch was dropped, the next export sends current values"
                    ),
                )
        finally:
            self.quiet.leave()
        if self.after_export is not None:
            self.after_export()
        return result

    def force_flush(self, timeout_millis: float = 10_000) -> bool:
        return self._inner.force_flush(timeout_millis=timeout_millis)

    def shutdown(self, timeout_millis: float = 30_000, **kwargs: Any) -> None:
        try:
            self._inner.shutdown(timeout_millis=timeout_millis, **kwargs)
        finally:
            self.quiet.remove()

    def _with_histograms(self, data: MetricsData) -> MetricsData:
        histograms = self._histograms()
        if not histograms:
            return data
        resources = list(data.resource_metrics)
        first = resources[0]
        scopes = [s for s in first.scope_metrics if s.scope != SCOPE]
        ours = [s for s in first.scope_metrics if s.scope == SCOPE]
        metrics = [*(m for s in ours for m in s.metrics), *histograms]
        scopes.append(ScopeMetrics(scope=SCOPE, metrics=metrics, schema_url=""))
        resources[0] = ResourceMetrics(resource=first.resource, scope_metrics=scopes, schema_url=first.schema_url)
        return MetricsData(resource_metrics=resources)

    def _histograms(self) -> list[Metric]:
        now = time.time_ns()
        constant = dict(self._store.constant_labels)
        out = []
        read = self._store.families(lambda exc: self._on_error("otlp", exc))
        for family in series_budget.kept(self._store, read):  # a non-detail rank's histograms: sum and count
            if family.kind not in ("histogram", series_budget.SUM_AND_COUNT):
                continue
            points = []
            for child in family.children:
                if not isinstance(child, HistogramSeries):
                    continue
                counts = list(child.counts)
                points.append(
                    HistogramDataPoint(
                        attributes={**constant, **dict(child.labels)},
                        start_time_unix_nano=self._started_ns,
                        time_unix_nano=now,
                        count=sum(counts),
                        sum=child.sum,
                        bucket_counts=counts,
                        explicit_bounds=list(child.bounds),
                        # The store keeps no min/max; None leaves the optional OTLP fields unset.
                        min=None,  # type: ignore[arg-type]
                        max=None,  # type: ignore[arg-type]
                    )
                )
            if points:
                out.append(
                    Metric(
                        name=family.name,
                        description=family.help,
                        unit=_unit(family.name),
                        data=Histogram(data_points=points, aggregation_temporality=AggregationTemporality.CUMULATIVE),
                    )
                )
        return out


class OtlpExport(Sink):
    """Pushes this rank's series to an OTLP endpoint every `interval` from the SDK's own reader thread."""

    name = "otlp"

    def __init__(self, store: MetricStore, config: OtlpConfig, rank: RankInfo, project: str, on_error: OnError) -> None:
        self._store = store
        self._timeout = config.timeout
        self.exporter = StoreHistogramExporter(build_exporter(config), store, on_error, describe_target(config))
        interval_ms = export_interval_millis(config)
        self._reader = PeriodicExportingMetricReader(
            self.exporter, export_interval_millis=interval_ms, export_timeout_millis=config.timeout * 1000
        )
        self._provider = MeterProvider(resource=build_resource(rank, project), metric_readers=[self._reader])
        self._meter = self._provider.get_meter(SCOPE.name, SCOPE.version)
        self._instrumented: set[str] = set()
        self._seen_version = -1
        self._lock = threading.Lock()
        self._sync_instruments()
        # Families that appear during training get their instrument after the next export.
        self.exporter.after_export = self._sync_instruments
        logger.info("ms_exporter: exporting OTLP to %s every %.1f s", describe_target(config), interval_ms / 1000)

    def close(self) -> None:
        """One last export, bounded by the timeout, then stop the reader thread."""
        try:
            self._sync_instruments()  # so that the last export carries families that appeared since the previous one
            self._provider.shutdown(timeout_millis=self._timeout * 1000)
        finally:
            self.exporter.quiet.remove()

    def _sync_instruments(self) -> None:
        if self._store.version == self._seen_version:
            return
        with self._lock:
            self._seen_version = self._store.version
            for family in self._store.families():
                if family.kind == "histogram" or family.name in self._instrumented:
                    continue
                if not series_budget.of(self._store).keeps(family.name):  # series_profile: large_job
                    continue
                live = self._store.get(family.name)
                if live is None:
                    continue
                callback = _observer(live, dict(self._store.constant_labels))
                name = otlp_name(family.name, family.kind)
                if family.kind == "counter":
                    self._meter.create_observable_counter(
                        name, [callback], unit=_unit(family.name), description=family.help
                    )
                else:
                    self._meter.create_observable_gauge(
                        name, [callback], unit=_unit(family.name), description=family.help
                    )
                self._instrumented.add(family.name)


def _observer(family: Family, constant: dict[str, str]) -> Callable[[CallbackOptions], Iterable[Observation]]:
    # The SDK ignores a non-finite measurement with a warning each time: a NaN loss or the deadline of a rank that
    # ended (NaN) is left out here instead, quietly. /metrics still shows them.
    def observe(options: CallbackOptions) -> Iterable[Observation]:
        values = [(float(child.value), child.labels) for child in family.children() if isinstance(child, Series)]
        return [Observation(value, {**constant, **dict(labels)}) for value, labels in values if math.isfinite(value)]

    return observe


class _QuietSdkLogs(logging.Filter):
    """Drops what the OTLP exporter logs inside our export calls (failures, retries): the ErrorSink counts them and
    logs the first. Other users of the SDK in the process keep their logs."""

    def __init__(self) -> None:
        super().__init__()
        self._inside = threading.local()  # a logger's filters run on the thread that logs
        self._lock = threading.Lock()
        self._running = 0
        self._removed = False
        self._loggers = [logging.getLogger(name) for name in otel_sdk.EXPORT_LOGGERS]
        for sdk_logger in self._loggers:
            sdk_logger.addFilter(self)

    def filter(self, record: logging.LogRecord) -> bool:
        return not getattr(self._inside, "active", False)

    def enter(self) -> None:
        self._inside.active = True
        with self._lock:
            self._running += 1

    def leave(self) -> None:
        self._inside.active = False
        with self._lock:
            self._running -= 1
            last = self._removed and self._running == 0
        if last:
            self._detach()

    def remove(self) -> None:
        """Detach from the SDK's loggers; an export still running (past shutdown's timeout) detaches when it ends."""
        with self._lock:
            self._removed = True
            idle = self._running == 0
        if idle:
            self._detach()

    def _detach(self) -> None:
        for sdk_logger in self._loggers:
            sdk_logger.removeFilter(self)


def build(context: PartContext) -> list[Sink]:
    """OTLP export (the registry's `otlp` backend); a bad endpoint or TLS setting is counted and trains without it."""
    config = context.config
    try:
        return [OtlpExport(context.store, config.otlp, context.rank, config.project, context.on_error)]
    except Exception as exc:
        context.on_error("otlp", exc)
        return []


PART = BackendEntry("otlp", build, extra="otlp", python=(3, 10), order=20)
