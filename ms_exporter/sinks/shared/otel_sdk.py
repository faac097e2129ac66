"""The one place that relies on OpenTelemetry SDK internals; the rest of ms_exporter uses only its public API.

Tested with opentelemetry-sdk and opentelemetry-exporter-otlp (-proto-grpc, -proto-http) 1.42.1, 1.43.0, 1.44.0
and 1.45.2 (tests/unit/test_otel_sdk.py and tests/integration/test_otlp.py); pyproject.toml's `otlp` extra pins
that range. 1.40.0 passes too; 1.41.1 also exports the SDK's own `otel.sdk.metric_reader.collection.duration`
beside the monitor's series. The unit test checks every name below against the installed SDK, so an upgrade that
moves one fails there, with the name, instead of quietly in a training run.

What is needed, and why there is no public way:

- `MetricExporter._preferred_temporality` and `._preferred_aggregation`. The OTLP exporters work out their
  temporality and default histogram aggregation in their constructor (from their arguments and
  OTEL_EXPORTER_OTLP_METRICS_TEMPORALITY_PREFERENCE / _DEFAULT_HISTOGRAM_AGGREGATION) and keep the result only in
  these attributes; `PeriodicExportingMetricReader` reads them from the exporter it is given. The sink hands the
  reader a wrapper around the OTLP exporter (to add the store's histograms and count failed exports), so the
  wrapper must carry the inner exporter's preferences. The public alternative, computing them again from the
  variables, would copy the SDK's parsing and drift from it.
- `EXPORT_LOGGERS`: the loggers the OTLP metric exporters log a failed or retried export to. They are named after
  SDK modules (`logging.getLogger(__name__)`), which is not an API. A logging filter sees only the records of the
  logger it is attached to, so the sink has to name them to keep the SDK from logging every failed export (it
  counts them and logs the first itself). Nothing here is private, but a module move breaks it just the same.

The sink no longer reads the reader's `_export_interval_millis` (it works out the interval itself, from the
documented OTEL_METRIC_EXPORT_INTERVAL, and hands it to the reader) nor its `_daemon_thread` (failed-export logs
are recognised by being logged inside the sink's own export call).
"""

from __future__ import annotations

import importlib
import logging
from typing import Any

from opentelemetry.sdk.metrics.export import MetricExporter

logger = logging.getLogger("ms_exporter")

TESTED_VERSIONS = ">=1.42,<1.46"  # pyproject.toml's otlp extra says the same; a unit test holds them together

EXPORT_LOGGERS = (
    "opentelemetry.exporter.otlp.proto.grpc.exporter",  # OTLPExporterMixin._export: "Failed to export", retries
    "opentelemetry.exporter.otlp.proto.http.metric_exporter",  # passed as the logger of the shared HTTP client
)
_PREFERENCES = {"preferred_temporality": "_preferred_temporality", "preferred_aggregation": "_preferred_aggregation"}


def preferences(exporter: MetricExporter) -> dict[str, Any]:
    """The exporter's preferred temporality and aggregation, as keyword arguments for MetricExporter.__init__."""
    found = {argument: getattr(exporter, attribute, None) for argument, attribute in _PREFERENCES.items()}
    if not all(hasattr(exporter, attribute) for attribute in _PREFERENCES.values()):
        logger.warning(
            "ms_exporter: this OpenTelemetry SDK keeps an exporter's preferred temporality elsewhere "
            "(tested: %s); OTLP exports use the SDK's defaults (cumulative)",
            TESTED_VERSIONS,
        )
    return found


def missing() -> list[str]:
    """What this module needs that the installed SDK lacks, each with what went wrong; [] when all is there."""
    problems = []

    class _Probe(MetricExporter):
        def export(self, *args: Any, **kwargs: Any) -> Any:
            raise NotImplementedError

        def force_flush(self, timeout_millis: float = 10_000) -> bool:
            return True

        def shutdown(self, *args: Any, **kwargs: Any) -> None:
            pass

    given: dict[str, Any] = {argument: {} for argument in _PREFERENCES}
    probe = _Probe(**given)
    for argument, attribute in _PREFERENCES.items():
        if getattr(probe, attribute, None) is not given[argument]:
            problems.append(f"MetricExporter.{attribute}: MetricExporter(...{argument}=) is no longer kept there")
    for name in EXPORT_LOGGERS:
        try:
            module = importlib.import_module(name)
        except ImportError as exc:
            problems.append(f"logger {name}: no such module ({exc})")
            continue
        if not any(isinstance(value, logging.Logger) and value.name == name for value in vars(module).values()):
            problems.append(f"logger {name}: the module no longer logs under its own name")
    return problems
