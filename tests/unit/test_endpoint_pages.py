"""The endpoint's /metrics answers against prometheus_client's own WSGI app, which the endpoint used to wrap."""

from __future__ import annotations

import gzip
from email.message import Message
from typing import Any

import pytest
from prometheus_client import CollectorRegistry, Counter, Gauge, make_wsgi_app

from ms_exporter.endpoint import pages as endpoint_pages
from ms_exporter.endpoint.pages import MetricsPages


def registry() -> CollectorRegistry:
    fresh = CollectorRegistry()
    Gauge("mindspore_train_loss", "Loss.", ["rank"], registry=fresh).labels(rank="0").set(0.25)
    Counter("mindspore_train_steps", "Steps.", registry=fresh).inc(3)
    return fresh


def headers(**fields: str) -> Message:
    message = Message()
    for name, value in fields.items():
        message[name.replace("_", "-")] = value
    return message


def wsgi_answer(fresh: CollectorRegistry, accept: str, encoding: str) -> tuple[str, list[tuple[str, str]], bytes]:
    got: dict[str, Any] = {}

    def start_response(status: str, response_headers: list[tuple[str, str]]) -> None:
        got.update(status=status, headers=response_headers)

    environ = {
        "REQUEST_METHOD": "GET",
        "PATH_INFO": "/metrics",
        "QUERY_STRING": "",
        "HTTP_ACCEPT": accept,
        "HTTP_ACCEPT_ENCODING": encoding,
    }
    body = b"".join(make_wsgi_app(fresh)(environ, start_response))
    return got["status"], got["headers"], body


@pytest.mark.parametrize(
    "accept",
    [
        "",
        "*/*",
        "text/plain; version=0.0.4",
        "text/plain; version=1.0.0",
        "text/plain; version=1.0.0; escaping=allow-utf-8",
        "application/openmetrics-text",
        "application/openmetrics-text; version=1.0.0",
        "application/openmetrics-text;version=1.0.0;q=0.5,text/plain;version=0.0.4;q=0.4",
    ],
)
@pytest.mark.parametrize("encoding", ["", "gzip", "deflate, gzip;q=0.9", "identity"])
def test_metrics_answers_as_prometheus_clients_own_app(accept: str, encoding: str) -> None:
    fresh = registry()
    status, answer_headers, body = MetricsPages(fresh, {}, 0).answer(
        "GET", "/metrics", headers(Accept=accept, Accept_Encoding=encoding)
    )
    expected_status, expected_headers, expected_body = wsgi_answer(fresh, accept, encoding)
    assert (status, answer_headers) == (expected_status, expected_headers)
    if dict(answer_headers).get("Content-Encoding") == "gzip":  # gzip headers carry the time: compare the content
        body, expected_body = gzip.decompress(body), gzip.decompress(expected_body)
    assert body == expected_body


def test_the_query_is_ignored_and_the_cache_stays_small_whatever_versions_clients_name() -> None:
    pages = MetricsPages(registry(), {}, 60)
    status, _, body = pages.answer("GET", "/metrics?name[]=mindspore_train_loss", headers())
    assert status == "200 OK" and b"mindspore_train_steps_total 3.0" in body  # name[] would have dropped it
    for minor in range(3 * endpoint_pages._MAX_CACHED):
        accept = f"application/openmetrics-text; version=1.0.{minor}"
        status, answer_headers, _ = pages.answer("GET", "/metrics", headers(Accept=accept))
        assert status == "200 OK" and f"version=1.0.{minor};" in dict(answer_headers)["Content-Type"]
        assert len(pages._cache) <= endpoint_pages._MAX_CACHED


def test_an_accept_version_that_is_not_a_number_is_a_400() -> None:
    status, _, body = MetricsPages(registry(), {}, 0).answer(
        "GET", "/metrics", headers(Accept="application/openmetrics-text; version=one")
    )
    assert status == "400 Bad Request" and b"version" in body
