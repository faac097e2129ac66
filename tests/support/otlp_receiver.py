"""Test helper: real OTLP metric receivers (gRPC from opentelemetry-proto's service definition, and HTTP/protobuf)
that decode every request and keep it, so tests read exactly what went over the wire."""

from __future__ import annotations

import threading
import time
from concurrent import futures
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import grpc
from opentelemetry.proto.collector.metrics.v1 import metrics_service_pb2, metrics_service_pb2_grpc
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, KeyValue

from tests.support.waiting import free_port


def value_of(any_value: AnyValue) -> Any:
    return getattr(any_value, any_value.WhichOneof("value"))


def attributes(pairs: list[KeyValue]) -> dict[str, Any]:
    return {pair.key: value_of(pair.value) for pair in pairs}


@dataclass
class Point:
    """One decoded data point: the metric it belongs to, its kind and its numbers."""

    name: str
    kind: str  # gauge, sum, histogram
    attributes: dict[str, Any]
    value: float = 0.0
    monotonic: bool = False
    temporality: int = 0
    count: int = 0
    total: float = 0.0
    bucket_counts: list[int] = field(default_factory=list)
    bounds: list[float] = field(default_factory=list)
    unit: str = ""


@dataclass
class Received:
    request: metrics_service_pb2.ExportMetricsServiceRequest
    headers: dict[str, str]

    def resource(self) -> dict[str, Any]:
        return attributes(list(self.request.resource_metrics[0].resource.attributes))

    def points(self) -> list[Point]:
        out = []
        for resource in self.request.resource_metrics:
            for scope in resource.scope_metrics:
                for metric in scope.metrics:
                    out.extend(_points(metric))
        return out


def _points(metric: Any) -> list[Point]:
    kind = metric.WhichOneof("data")
    data = getattr(metric, kind)
    out = []
    for dp in data.data_points:
        point = Point(metric.name, kind, attributes(list(dp.attributes)), unit=metric.unit)
        if kind == "histogram":
            point.count, point.total = dp.count, dp.sum
            point.bucket_counts, point.bounds = list(dp.bucket_counts), list(dp.explicit_bounds)
            point.temporality = data.aggregation_temporality
        else:
            point.value = dp.as_double if dp.WhichOneof("value") == "as_double" else float(dp.as_int)
            if kind == "sum":
                point.monotonic, point.temporality = data.is_monotonic, data.aggregation_temporality
        out.append(point)
    return out


class _Store:
    def __init__(self, delay: float = 0.0, keep: int | None = None) -> None:
        self.received: list[Received] = []
        self.count = 0
        self.delay = delay
        self.keep = keep  # keep only the newest `keep` requests (a soak must not measure the receiver's memory)
        self.lock = threading.Lock()

    def add(self, request: metrics_service_pb2.ExportMetricsServiceRequest, headers: dict[str, str]) -> None:
        if self.delay:
            time.sleep(self.delay)  # a slow collector
        with self.lock:
            self.count += 1
            self.received.append(Received(request, headers))
            if self.keep is not None:
                del self.received[: -self.keep]

    def last(self) -> Received:
        with self.lock:
            if not self.received:
                raise AssertionError("the receiver got no OTLP request")
            return self.received[-1]

    def wait_for(self, count: int, seconds: float) -> None:
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            with self.lock:
                if self.count >= count:
                    return
            time.sleep(0.05)
        raise AssertionError(f"the receiver got {self.count} OTLP requests in {seconds} s, wanted {count}")


class GrpcReceiver(_Store):
    """An OTLP/gRPC metrics endpoint on 127.0.0.1."""

    def __init__(self, delay: float = 0.0, keep: int | None = None) -> None:
        super().__init__(delay, keep)
        self.port = free_port()
        self.endpoint = f"http://127.0.0.1:{self.port}"
        self._server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
        metrics_service_pb2_grpc.add_MetricsServiceServicer_to_server(_Servicer(self), self._server)
        self._server.add_insecure_port(f"127.0.0.1:{self.port}")
        self._server.start()

    def stop(self) -> None:
        self._server.stop(grace=None)


class _Servicer(metrics_service_pb2_grpc.MetricsServiceServicer):
    def __init__(self, store: _Store) -> None:
        self._store = store

    def Export(self, request: Any, context: Any) -> Any:  # the generated service's method name
        self._store.add(request, {k: v for k, v in context.invocation_metadata()})
        return metrics_service_pb2.ExportMetricsServiceResponse()


class HttpReceiver(_Store):
    """An OTLP/HTTP (protobuf) metrics endpoint on 127.0.0.1; requests go to /v1/metrics."""

    def __init__(self, delay: float = 0.0) -> None:
        super().__init__(delay)
        store = self
        self.paths: list[str] = []

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # http.server's method name
                body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
                store.paths.append(self.path)
                request = metrics_service_pb2.ExportMetricsServiceRequest.FromString(body)
                store.add(request, {k.lower(): v for k, v in self.headers.items()})
                reply = metrics_service_pb2.ExportMetricsServiceResponse().SerializeToString()
                self.send_response(200)
                self.send_header("Content-Type", "application/x-protobuf")
                self.send_header("Content-Length", str(len(reply)))
                self.end_headers()
                self.wfile.write(reply)

            def log_message(self, *args: Any) -> None:
                pass

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.port = self._server.server_address[1]
        self.endpoint = f"http://127.0.0.1:{self.port}"
        threading.Thread(target=self._server.serve_forever, daemon=True).start()

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()
