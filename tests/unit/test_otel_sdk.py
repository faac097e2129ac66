"""The adapter to OpenTelemetry SDK internals (ms_exporter/sinks/shared/otel_sdk.py) against the installed SDK."""

from __future__ import annotations

import logging
import math
import socket
import sys
from importlib.metadata import version
from pathlib import Path
from typing import Any

import pytest

from tests.support.pythons import OTLP, below

if below(OTLP):
    pytest.skip(OTLP.why, allow_module_level=True)
from opentelemetry.exporter.otlp.proto.grpc.metric_exporter import OTLPMetricExporter as GrpcExporter
from opentelemetry.exporter.otlp.proto.http.metric_exporter import OTLPMetricExporter as HttpExporter
from opentelemetry.metrics import Observation
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import (
    AggregationTemporality,
    MetricExporter,
    MetricExportResult,
    MetricsData,
    PeriodicExportingMetricReader,
    ResourceMetrics,
    ScopeMetrics,
)
from opentelemetry.sdk.resources import Resource
from packaging.specifiers import SpecifierSet

from ms_exporter.core.store import MetricStore
from ms_exporter.sinks.otlp import SCOPE, StoreHistogramExporter
from ms_exporter.sinks.shared import otel_sdk

SDK_PACKAGES = ("opentelemetry-sdk", "opentelemetry-exporter-otlp")


def test_every_sdk_name_the_adapter_needs_is_where_it_expects() -> None:
    problems = otel_sdk.missing()
    assert not problems, (
        f"opentelemetry-sdk {version('opentelemetry-sdk')} moved what ms_exporter/sinks/shared/otel_sdk.py relies on "
        f"(tested: {otel_sdk.TESTED_VERSIONS}):\n  " + "\n  ".join(problems)
    )


def test_the_otlp_extra_pins_the_tested_range_and_the_installed_sdk_is_in_it() -> None:
    tomllib = pytest.importorskip("tomllib" if sys.version_info >= (3, 11) else "tomli")  # tomli: the same, before
    pyproject = tomllib.loads((Path(__file__).parents[2] / "pyproject.toml").read_text(encoding="utf-8"))
    extra = pyproject["project"]["optional-dependencies"]["otlp"]
    assert sorted(extra) == sorted(f"{package}{otel_sdk.TESTED_VERSIONS}" for package in SDK_PACKAGES)
    for package in SDK_PACKAGES:
        assert version(package) in SpecifierSet(otel_sdk.TESTED_VERSIONS), package


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def one_batch() -> MetricsData:
    return MetricsData(
        resource_metrics=[
            ResourceMetrics(
                resource=Resource.create({}),
                scope_metrics=[ScopeMetrics(scope=SCOPE, metrics=[], schema_url="")],
                schema_url="",
            )
        ]
    )


@pytest.mark.parametrize("protocol", ["grpc", "http/protobuf"])
def test_a_failed_export_logs_only_to_the_loggers_the_sink_quiets(
    protocol: str, caplog: pytest.LogCaptureFixture
) -> None:
    port = free_port()  # nothing listens there
    exporter: MetricExporter = (
        GrpcExporter(endpoint=f"http://127.0.0.1:{port}", insecure=True, timeout=1)
        if protocol == "grpc"
        else HttpExporter(endpoint=f"http://127.0.0.1:{port}/v1/metrics", timeout=1)
    )
    with caplog.at_level(logging.DEBUG, logger="opentelemetry"):
        result = exporter.export(one_batch(), timeout_millis=1000)
    exporter.shutdown()
    assert result is MetricExportResult.FAILURE
    logged = {record.name for record in caplog.records if record.levelno >= logging.WARNING}
    assert logged, "the SDK logged nothing about a failed export: the test no longer shows where it logs"
    unquieted = logged - set(otel_sdk.EXPORT_LOGGERS)
    assert not unquieted, f"the SDK now logs failed exports to {unquieted}: add them to otel_sdk.EXPORT_LOGGERS"


def exported_counter_temporality() -> AggregationTemporality:
    """An observable counter collected through the sink's wrapper around a real OTLP exporter."""
    inner = HttpExporter(endpoint=f"http://127.0.0.1:{free_port()}/v1/metrics")
    batches: list[MetricsData] = []

    def capture(metrics_data: MetricsData, **kwargs: Any) -> MetricExportResult:
        batches.append(metrics_data)
        return MetricExportResult.SUCCESS

    inner.export = capture  # type: ignore[method-assign]
    reader = PeriodicExportingMetricReader(
        StoreHistogramExporter(inner, MetricStore(), lambda *_: None), export_interval_millis=math.inf
    )
    provider = MeterProvider(metric_readers=[reader])
    provider.get_meter("test").create_observable_counter("c", [lambda options: [Observation(1.0)]])
    provider.force_flush()
    provider.shutdown()
    (metric,) = [m for s in batches[0].resource_metrics[0].scope_metrics for m in s.metrics]
    return metric.data.aggregation_temporality


def test_the_wrapper_keeps_the_temporality_the_otlp_exporter_was_configured_with(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("OTEL_EXPORTER_OTLP_METRICS_TEMPORALITY_PREFERENCE", raising=False)
    assert exported_counter_temporality() is AggregationTemporality.CUMULATIVE
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_METRICS_TEMPORALITY_PREFERENCE", "delta")
    assert exported_counter_temporality() is AggregationTemporality.DELTA


def test_preferences_fall_back_to_the_sdk_defaults_with_a_warning(caplog: pytest.LogCaptureFixture) -> None:
    class Bare:  # an exporter of an SDK that keeps its preferences elsewhere
        pass

    with caplog.at_level(logging.WARNING, logger="ms_exporter"):
        found = otel_sdk.preferences(Bare())  # type: ignore[arg-type]
    assert found == {"preferred_temporality": None, "preferred_aggregation": None}
    assert "tested: " + otel_sdk.TESTED_VERSIONS in caplog.text


SECRET = "s3cr3t-pw"


@pytest.mark.parametrize(
    ("configured", "variable", "shown"),
    [
        (f"http://ops:{SECRET}@127.0.0.1:{{port}}", None, "http://ops:<redacted>@127.0.0.1:{port}"),
        (
            None,
            f"http://{SECRET}@127.0.0.1:{{port}}/?api_key={SECRET}",
            "http://<redacted>@127.0.0.1:{port}/?api_key=<redacted>",
        ),
    ],
)
def test_the_otlp_target_is_logged_without_its_credentials(
    configured: str | None,
    variable: str | None,
    shown: str,
    caplog: pytest.LogCaptureFixture,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The INFO line that names the collector (and the error of a failed export) shows the host, never the endpoint's
    user:password@, token@ or query values, whether monitor_config or OTEL_EXPORTER_OTLP_ENDPOINT names it."""
    from ms_exporter.config import OtlpConfig
    from ms_exporter.core.ranks import RankInfo
    from ms_exporter.sinks.otlp import OtlpExport

    port = free_port()  # nothing listens there
    monkeypatch.delenv("OTEL_EXPORTER_OTLP_METRICS_ENDPOINT", raising=False)
    if variable is not None:
        monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", variable.format(port=port))
    else:
        monkeypatch.delenv("OTEL_EXPORTER_OTLP_ENDPOINT", raising=False)
    config = OtlpConfig(
        endpoint=configured.format(port=port) if configured else None,
        protocol="http/protobuf",
        interval=3600,
        timeout=1,
    )
    errors: list[BaseException] = []
    with caplog.at_level(logging.INFO, logger="ms_exporter"):
        sink = OtlpExport(MetricStore(), config, RankInfo(0, 0, 1, "host"), "p", lambda _, exc: errors.append(exc))
        try:
            assert sink.exporter.export(one_batch(), timeout_millis=1000) is MetricExportResult.FAILURE
        finally:
            sink.close()
    said = caplog.text + "".join(map(str, errors))
    assert "exporting OTLP to " + shown.format(port=port) in caplog.text
    assert errors and shown.format(port=port) in str(errors[0])
    assert SECRET not in said
