"""Who may read a rank's endpoint: TLS, client certificates and basic auth, over real HTTP(S) requests."""

from __future__ import annotations

import base64
import gzip
import hashlib
import http.client
import socket
import ssl
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import bcrypt
import pytest

from ms_exporter import TrainingMonitor
from ms_exporter.config import ConfigError
from ms_exporter.core import catalogue
from ms_exporter.endpoint import basic_auth
from ms_exporter.sinks.prometheus import PrometheusEndpoint
from tests.support.scrape import Scrape

pytestmark = pytest.mark.integration

SHA_PASSWORD = "scrape-me"
BCRYPT_PASSWORD = "correct horse"


def openssl(*args: str, cwd: Path) -> None:
    subprocess.run(["openssl", *args], cwd=cwd, check=True, capture_output=True, timeout=60)


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A CA, a server certificate for 127.0.0.1 and a client certificate, all signed by the CA."""
    d = tmp_path_factory.mktemp("pki")
    openssl(
        "req",
        "-x509",
        "-newkey",
        "rsa:2048",
        "-nodes",
        "-keyout",
        "ca.key",
        "-out",
        "ca.crt",
        "-days",
        "2",
        "-subj",
        "/CN=ms-exporter test CA",
        cwd=d,
    )
    for name, extension in (("server", "subjectAltName=IP:127.0.0.1"), ("client", "extendedKeyUsage=clientAuth")):
        openssl(
            "req",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-keyout",
            f"{name}.key",
            "-out",
            f"{name}.csr",
            "-subj",
            f"/CN={name}",
            cwd=d,
        )
        (d / f"{name}.ext").write_text(extension + "\n")
        openssl(
            "x509",
            "-req",
            "-in",
            f"{name}.csr",
            "-CA",
            "ca.crt",
            "-CAkey",
            "ca.key",
            "-CAcreateserial",
            "-out",
            f"{name}.crt",
            "-days",
            "2",
            "-extfile",
            f"{name}.ext",
            cwd=d,
        )
    return d


def users() -> dict[str, str]:
    return {
        "prometheus": "sha256:" + hashlib.sha256(SHA_PASSWORD.encode()).hexdigest(),
        "grafana": bcrypt.hashpw(BCRYPT_PASSWORD.encode(), bcrypt.gensalt(4)).decode(),
    }


def get(
    url: str,
    auth: tuple[str, str] | None = None,
    context: ssl.SSLContext | None = None,
    method: str = "GET",
    headers: dict[str, str] | None = None,
) -> tuple[int, dict[str, str], str]:
    status, got, body = get_bytes(url, auth, context, method, headers)
    return status, got, body.decode()


def get_bytes(
    url: str,
    auth: tuple[str, str] | None = None,
    context: ssl.SSLContext | None = None,
    method: str = "GET",
    headers: dict[str, str] | None = None,
) -> tuple[int, dict[str, str], bytes]:
    request = urllib.request.Request(url, method=method, headers=headers or {})
    if auth:
        request.add_header("Authorization", "Basic " + base64.b64encode(":".join(auth).encode()).decode())
    try:
        with urllib.request.urlopen(request, timeout=10, context=context) as response:
            return response.status, dict(response.headers), response.read()
    except urllib.error.HTTPError as error:
        return error.code, dict(error.headers), error.read()


@pytest.fixture
def monitors() -> Iterator[list[TrainingMonitor]]:
    made: list[TrainingMonitor] = []
    yield made
    for monitor in made:
        monitor.close()


def start(monitors: list[TrainingMonitor], **options: Any) -> TrainingMonitor:
    monitor = TrainingMonitor(port=0, project="web", **options)
    monitors.append(monitor)
    assert monitor.url is not None
    return monitor


def client_context(pki: Path, certificate: bool = False) -> ssl.SSLContext:
    context = ssl.create_default_context(cafile=str(pki / "ca.crt"))
    if certificate:
        context.load_cert_chain(str(pki / "client.crt"), str(pki / "client.key"))
    return context


def test_only_metrics_and_the_live_page_are_served(monitors: list[TrainingMonitor]) -> None:
    monitor = start(monitors)
    base = monitor.url.removesuffix("/metrics")
    assert get(monitor.url)[0] == 200
    status, headers, _ = get(base + "/")
    assert status == 200 and headers["Content-Type"].startswith("text/html")
    assert get(base + "/api/series?since=-1")[0] == 200
    assert get(base + "/api/series?since=soon")[0] == 400
    for path in ("/metric", "/metrics/x", "/../etc/passwd", "/favicon.ico", "/api", "/api/series/x"):
        status, _, body = get(base + path)
        assert status == 404 and "serves /metrics" in body, path
    status, headers, _ = get(monitor.url, method="POST")
    assert status == 405 and headers["Allow"] == "GET, HEAD"


def test_a_burst_of_scrapes_shares_one_render(monitors: list[TrainingMonitor]) -> None:
    monitor = start(monitors, web={"cache_seconds": 0.5})
    steps = monitor.store.get("mindspore_train_global_step").series()
    before = Scrape(get(monitor.url)[2]).value("mindspore_train_global_step")
    steps.value = 41  # what a training step would write
    assert Scrape(get(monitor.url)[2]).value("mindspore_train_global_step") == before
    time.sleep(0.6)  # past the cache window (this test is about the window itself)
    assert Scrape(get(monitor.url)[2]).value("mindspore_train_global_step") == 41


OPENMETRICS = "application/openmetrics-text; version=1.0.0"


def test_formats_follow_accept_and_accept_encoding_and_the_cache_keeps_them_apart(
    monitors: list[TrainingMonitor],
) -> None:
    monitor = start(monitors, web={"cache_seconds": 60})  # every answer below within one cache window
    status, headers, plain = get_bytes(monitor.url)
    assert status == 200 and headers["Content-Type"] == "text/plain; version=0.0.4; charset=utf-8"
    assert "Content-Encoding" not in headers and Scrape(plain.decode()).has("mindspore_train_info")
    status, headers, zipped = get_bytes(monitor.url, headers={"Accept-Encoding": "gzip"})
    assert status == 200 and headers["Content-Encoding"] == "gzip"
    assert headers["Content-Type"] == "text/plain; version=0.0.4; charset=utf-8"
    # The same page, but for the goodput ledgers: this process's is read at each render (the time goes on between
    # two) and the run's changes when the saver thread, started with the monitor, first saves (may fall between).
    moving = tuple(family.name.encode() for family in (catalogue.TIME_SECONDS, catalogue.RUN_TIME_SECONDS))

    def steady(page: bytes) -> list[bytes]:
        return [line for line in page.split(b"\n") if not line.startswith(moving)]

    assert steady(gzip.decompress(zipped)) == steady(plain)
    # What Prometheus sends: OpenMetrics first among the formats prometheus_client writes.
    prometheus_accept = (
        "application/vnd.google.protobuf;proto=io.prometheus.client.MetricFamily;"
        "encoding=delimited;q=0.7,application/openmetrics-text;version=1.0.0;q=0.5,"
        "text/plain;version=0.0.4;q=0.4,*/*;q=0.1"
    )
    for accept, encoding in ((OPENMETRICS, ""), (prometheus_accept, "gzip")):
        status, headers, body = get_bytes(monitor.url, headers={"Accept": accept, "Accept-Encoding": encoding})
        assert status == 200 and headers["Content-Type"].startswith(OPENMETRICS + "; charset=utf-8")
        text = (gzip.decompress(body) if encoding else body).decode()
        assert text.endswith("# EOF\n") and "mindspore_train_info" in text
    status, headers, _ = get_bytes(monitor.url, headers={"Accept": "text/plain; version=1.0.0"})
    assert headers["Content-Type"].startswith("text/plain; version=1.0.0; charset=utf-8")
    assert get(monitor.url, headers={"Accept": "application/openmetrics-text; version=soon"})[0] == 400
    assert get(monitor.url)[0] == 200


def test_head_answers_as_get_without_the_body_and_does_not_spoil_the_cache(monitors: list[TrainingMonitor]) -> None:
    monitor = start(monitors, web={"cache_seconds": 60})
    status, head_headers, body = get(monitor.url, method="HEAD")
    assert status == 200 and body == ""
    status, get_headers, page = get(monitor.url)  # from the render the HEAD made
    assert status == 200 and Scrape(page).has("mindspore_train_info")
    assert head_headers == get_headers and int(get_headers["Content-Length"]) == len(page.encode())


def endpoint_of(monitor: TrainingMonitor) -> PrometheusEndpoint:
    endpoint = monitor.part_of(PrometheusEndpoint)
    assert endpoint is not None
    return endpoint


class BrokenCollector:
    def collect(self) -> list[Any]:
        raise RuntimeError("a collector that cannot be read")


def test_a_render_that_fails_is_a_counted_500_and_the_next_scrape_works(monitors: list[TrainingMonitor]) -> None:
    monitor = start(monitors, web={"cache_seconds": 0})
    registry = endpoint_of(monitor).registry
    broken = BrokenCollector()
    registry.register(broken)  # type: ignore[arg-type]
    status, headers, body = get(monitor.url)
    assert status == 500 and headers["Connection"] == "close" and "mindspore_exporter_errors_total" in body
    registry.unregister(broken)  # type: ignore[arg-type]
    status, _, page = get(monitor.url)
    assert status == 200 and Scrape(page).value("mindspore_exporter_errors_total", component="prometheus") == 1


def test_basic_auth_with_sha256_and_bcrypt_hashes(
    monitors: list[TrainingMonitor], monkeypatch: pytest.MonkeyPatch
) -> None:
    # One client asks right after a wrong bcrypt password here: lift the ration (tests/unit/test_basic_auth.py).
    monkeypatch.setattr(basic_auth, "PEER_CHECK_SECONDS", 0.0)
    monkeypatch.setattr(basic_auth, "CHECKS_PER_SECOND", 1000.0)
    monitor = start(monitors, web={"basic_auth_users": users()})
    status, headers, _ = get(monitor.url)
    assert status == 401 and headers["WWW-Authenticate"].startswith("Basic realm=")
    assert get(monitor.url, ("prometheus", "wrong"))[0] == 401
    assert get(monitor.url, ("nobody", SHA_PASSWORD))[0] == 401
    assert get(monitor.url, ("grafana", SHA_PASSWORD))[0] == 401  # another user's password
    assert get(monitor.url.removesuffix("metrics") + "nothing")[0] == 401  # no hints about paths without auth
    status, _, body = get(monitor.url, ("prometheus", SHA_PASSWORD))
    assert status == 200 and Scrape(body).has("mindspore_train_info")
    for _ in range(2):  # the second time from the verified-credentials cache
        assert get(monitor.url, ("grafana", BCRYPT_PASSWORD))[0] == 200
    assert get(monitor.url, ("grafana", "x" * 100))[0] == 401  # over bcrypt's 72 bytes, an answer


def test_tls_serves_https_and_plain_http_fails(pki: Path, monitors: list[TrainingMonitor]) -> None:
    monitor = start(
        monitors,
        web={
            "tls_cert_file": str(pki / "server.crt"),
            "tls_key_file": str(pki / "server.key"),
            "basic_auth_users": users(),
        },
    )
    assert monitor.url.startswith("https://127.0.0.1:")
    status, _, body = get(monitor.url, ("prometheus", SHA_PASSWORD), client_context(pki))
    assert status == 200 and Scrape(body).has("mindspore_train_steps_total")
    assert get(monitor.url, None, client_context(pki))[0] == 401
    plain = http.client.HTTPConnection("127.0.0.1", int(monitor.url.split(":")[2].split("/")[0]), timeout=10)
    with pytest.raises((http.client.HTTPException, ConnectionError, OSError)):
        plain.request("GET", "/metrics")
        plain.getresponse()
    with pytest.raises(urllib.error.URLError):  # a client that does not trust the CA
        get(monitor.url, ("prometheus", SHA_PASSWORD), ssl.create_default_context())


def test_client_certificates_required(pki: Path, monitors: list[TrainingMonitor]) -> None:
    monitor = start(
        monitors,
        web={
            "tls_cert_file": str(pki / "server.crt"),
            "tls_key_file": str(pki / "server.key"),
            "client_ca_file": str(pki / "ca.crt"),
            "client_auth_type": "RequireAndVerifyClientCert",
        },
    )
    assert get(monitor.url, None, client_context(pki, certificate=True))[0] == 200
    with pytest.raises((urllib.error.URLError, ssl.SSLError, ConnectionError)):
        get(monitor.url, None, client_context(pki, certificate=False))


def test_a_silent_client_does_not_hold_up_other_scrapes(pki: Path, monitors: list[TrainingMonitor]) -> None:
    monitor = start(monitors, web={"tls_cert_file": str(pki / "server.crt"), "tls_key_file": str(pki / "server.key")})
    port = int(monitor.url.split(":")[2].split("/")[0])
    silent = [socket.create_connection(("127.0.0.1", port)) for _ in range(3)]  # never say hello
    try:
        answered = threading.Event()

        def scrape_once() -> None:
            if get(monitor.url, None, client_context(pki))[0] == 200:
                answered.set()

        threading.Thread(target=scrape_once, daemon=True).start()
        assert answered.wait(5), "a scrape waited behind connections that never finished their TLS handshake"
    finally:
        for sock in silent:
            sock.close()


def test_prometheus_web_config_file(pki: Path, tmp_path: Path, monitors: list[TrainingMonitor]) -> None:
    hashed = users()["grafana"]
    web_config = tmp_path / "web.yml"
    web_config.write_text(
        f"tls_server_config:\n  cert_file: {pki / 'server.crt'}\n  key_file: {pki / 'server.key'}\n"
        f"basic_auth_users:\n  grafana: '{hashed}'\n"
    )
    monitor = start(monitors, web={"config_file": str(web_config)})
    assert get(monitor.url, ("grafana", BCRYPT_PASSWORD), client_context(pki))[0] == 200
    assert get(monitor.url, ("grafana", "nope"), client_context(pki))[0] == 401
    web_config.write_text("tls_server_config:\n  cert_file: x\n  min_version: TLS13\nhttp_server_config: {}\n")
    unsupported = r"does not support: \['http_server_config', 'tls_server_config.min_version'\]"
    with pytest.raises(ConfigError, match=unsupported):
        TrainingMonitor(port=0, web={"config_file": str(web_config)})


def test_bad_tls_material_is_a_construction_error(pki: Path, tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="tls_cert_file and tls_key_file go together"):
        TrainingMonitor(port=0, web={"tls_cert_file": str(pki / "server.crt")})
    with pytest.raises(ConfigError, match="need TLS"):
        TrainingMonitor(port=0, web={"client_ca_file": str(pki / "ca.crt")})
    garbage = tmp_path / "garbage.pem"
    garbage.write_text("not a certificate\n")
    with pytest.raises(ConfigError, match="cannot load the TLS certificate"):
        TrainingMonitor(port=0, web={"tls_cert_file": str(garbage), "tls_key_file": str(pki / "server.key")})


def test_password_hashes_never_printed(tmp_path: Path, monitors: list[TrainingMonitor]) -> None:
    hashes = users()
    config = tmp_path / "monitor.yaml"
    config.write_text(
        "monitor_config:\n  web:\n    basic_auth_users:\n"
        + "".join(f"      {user}: '{hashed}'\n" for user, hashed in hashes.items())
    )
    shown = subprocess.run(
        [sys.executable, "-m", "ms_exporter", "check-config", str(config)], capture_output=True, text=True, check=True
    ).stdout
    assert "prometheus: <redacted>" in shown
    assert not any(hashed in shown for hashed in hashes.values())
    monitor = start(monitors, config=str(config))
    page = get(monitor.url, ("prometheus", SHA_PASSWORD))[2]
    assert not any(hashed in page for hashed in hashes.values())


def test_huge_requests_are_refused_and_the_endpoint_keeps_serving(monitors: list[TrainingMonitor]) -> None:
    monitor = start(monitors)
    port = int(monitor.url.split(":")[2].split("/")[0])
    for request in (
        b"GET /" + b"a" * 200_000 + b" HTTP/1.1\r\n\r\n",
        b"GET /metrics HTTP/1.1\r\n" + b"".join(b"X-%d: y\r\n" % i for i in range(500)) + b"\r\n",
        b"GET /metrics HTTP/1.1\r\nX-Big: " + b"z" * 200_000 + b"\r\n\r\n",
    ):
        with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
            sock.sendall(request)
            status_line = sock.recv(200).split(b"\r\n")[0]
        assert status_line.split()[1] in (b"400", b"414", b"431"), status_line
    assert get(monitor.url)[0] == 200


def port_of(monitor: TrainingMonitor) -> int:
    return int((monitor.url or "").split(":")[2].split("/")[0])


def test_keep_alive_serves_many_requests_on_one_connection(monitors: list[TrainingMonitor]) -> None:
    monitor = start(monitors, web={"basic_auth_users": users()})
    connection = http.client.HTTPConnection("127.0.0.1", port_of(monitor), timeout=10)
    token = base64.b64encode(f"prometheus:{SHA_PASSWORD}".encode()).decode()
    try:
        connection.connect()
        first = connection.sock
        for path, expected in (("/metrics", 200), ("/nothing", 404), ("/metrics", 200)):
            connection.request("GET", path, headers={"Authorization": f"Basic {token}"})
            response = connection.getresponse()
            body = response.read()
            assert response.status == expected and response.version == 11
            assert response.getheader("Connection") != "close"
            if expected == 200:
                assert Scrape(body.decode()).has("mindspore_train_steps_total")
        connection.request("GET", "/metrics")  # no credentials: 401, and the connection still serves
        response = connection.getresponse()
        response.read()
        assert response.status == 401
        assert connection.sock is first, "the client had to reconnect: the server closed a kept-alive connection"
    finally:
        connection.close()


def test_a_kept_connection_ends_after_its_quota_and_says_so(monitors: list[TrainingMonitor]) -> None:
    from ms_exporter.endpoint.server import REQUESTS_PER_CONNECTION

    monitor = start(monitors)
    connection = http.client.HTTPConnection("127.0.0.1", port_of(monitor), timeout=10)
    try:
        closing = []
        for index in range(1, REQUESTS_PER_CONNECTION + 21):  # http.client reconnects after "Connection: close"
            connection.request("GET", "/metrics")
            response = connection.getresponse()
            assert response.status == 200 and b"mindspore_train_steps_total" in response.read()
            if response.getheader("Connection") == "close":
                closing.append(index)
        assert closing == [REQUESTS_PER_CONNECTION]
    finally:
        connection.close()


def raw_exchange(port: int, request: bytes, wait: float = 5.0) -> tuple[bytes, bool]:
    """Send `request`; return everything received and whether the server closed the connection by then."""
    with socket.create_connection(("127.0.0.1", port), timeout=wait) as sock:
        sock.sendall(request)
        received = b""
        try:
            while chunk := sock.recv(65536):
                received += chunk
        except TimeoutError:
            return received, False
        return received, True


def test_connections_close_when_asked_idle_or_carrying_a_body(monitors: list[TrainingMonitor]) -> None:
    port = port_of(start(monitors))
    for request in (
        b"GET /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n",
        b"GET /metrics HTTP/1.0\r\n\r\n",  # 1.0 without keep-alive: one request per connection
        # A body the endpoint does not read: answered, then closed, never parsed as a request.
        b"GET /metrics HTTP/1.1\r\nHost: x\r\nContent-Length: 26\r\n\r\nGET /nothing HTTP/1.1\r\n\r\n",
    ):
        received, closed = raw_exchange(port, request, wait=5.0)
        assert closed, request
        assert received.count(b"HTTP/1.1 ") == 1 and received.startswith(b"HTTP/1.1 200"), received[:80]
    # Kept alive, then idle: the server ends it after KEEPALIVE_IDLE_SECONDS (1 s), well before the client's 5 s.
    began = time.monotonic()
    received, closed = raw_exchange(port, b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n", wait=5.0)
    assert closed and received.startswith(b"HTTP/1.1 200") and time.monotonic() - began < 4


def test_keep_alive_over_tls(pki: Path, monitors: list[TrainingMonitor]) -> None:
    monitor = start(monitors, web={"tls_cert_file": str(pki / "server.crt"), "tls_key_file": str(pki / "server.key")})
    connection = http.client.HTTPSConnection("127.0.0.1", port_of(monitor), timeout=10, context=client_context(pki))
    try:
        connection.connect()
        first = connection.sock
        for _ in range(3):
            connection.request("GET", "/metrics")
            response = connection.getresponse()
            assert response.status == 200 and b"mindspore_train_steps_total" in response.read()
        assert connection.sock is first
    finally:
        connection.close()


def test_requests_over_the_budget_wait_and_are_all_answered(monitors: list[TrainingMonitor]) -> None:
    monitor = start(monitors, web={"max_requests_per_second": 5})
    connection = http.client.HTTPConnection("127.0.0.1", port_of(monitor), timeout=10)
    began = time.monotonic()
    try:
        for _ in range(15):  # 5 at once (a second's worth), then one every 0.2 s
            connection.request("GET", "/metrics")
            response = connection.getresponse()
            assert response.status == 200 and b"mindspore_train_steps_total" in response.read()
    finally:
        connection.close()
    assert time.monotonic() - began >= 1.9  # a lower bound only: the ten requests over the budget waited


def test_slow_and_silent_clients_do_not_take_the_endpoint_down(monitors: list[TrainingMonitor]) -> None:
    """50 connections with an unfinished request head and 200 that never send: scrapes are still answered."""
    monitor = start(monitors)
    port = port_of(monitor)
    held: list[socket.socket] = []
    try:
        for index in range(250):
            sock = socket.create_connection(("127.0.0.1", port), timeout=10)
            if index < 50:
                sock.sendall(b"GET /metrics HTTP/1.1\r\nHost: x\r\nX-Slow: a")  # and then nothing more
            held.append(sock)
        for _ in range(5):
            status, _, body = get(monitor.url)  # urllib's 10 s timeout: a held-up endpoint fails here
            assert status == 200 and Scrape(body).has("mindspore_train_steps_total")
    finally:
        for sock in held:
            sock.close()


def test_a_client_that_drips_bytes_cannot_extend_its_deadline(
    monitors: list[TrainingMonitor], monkeypatch: pytest.MonkeyPatch
) -> None:
    from ms_exporter.endpoint import server as http_server

    monkeypatch.setattr(http_server, "REQUEST_SECONDS", 2.0)  # the whole head within 2 s, however it drips
    monitor = start(monitors)
    with socket.create_connection(("127.0.0.1", port_of(monitor)), timeout=10) as sock:
        sock.sendall(b"GET /metrics HTTP/1.1\r\nHost: x\r\nX-Slow: ")
        began = time.monotonic()
        closed_after = None
        while time.monotonic() - began < 20:
            try:
                sock.sendall(b"a")  # a byte every 0.2 s: each would have reset a per-read timeout
                sock.settimeout(0.2)
                if sock.recv(100) == b"":
                    closed_after = time.monotonic() - began
                    break
            except TimeoutError:
                continue
            except OSError:
                closed_after = time.monotonic() - began
                break
        assert closed_after is not None and closed_after < 15, closed_after  # 2 s and a margin, not never


def test_requests_are_parsed_as_http_1_1_says(monitors: list[TrainingMonitor]) -> None:
    port = port_of(start(monitors))
    # Two Content-Length headers that disagree: refused, and the "body" is never taken for a second request.
    smuggled = (
        b"GET /metrics HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\nContent-Length: 44\r\n\r\n"
        b"GET /debug/stacks HTTP/1.1\r\nHost: x\r\n\r\n"
    )
    received, closed = raw_exchange(port, smuggled)
    assert closed and received.startswith(b"HTTP/1.1 400 ") and received.count(b"HTTP/1.1 ") == 1, received[:200]
    received, closed = raw_exchange(port, b"NOT A REQUEST LINE\r\n\r\n")  # a status line, not an HTML page
    assert closed and received.startswith(b"HTTP/1.1 400 ") and b"<html" not in received.lower()
    received, _ = raw_exchange(port, b"GET http://127.0.0.1/metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
    assert received.startswith(b"HTTP/1.1 200 ")  # the absolute form is the same resource
    received, _ = raw_exchange(port, b"BREW /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
    assert received.startswith(b"HTTP/1.1 405 ") and b"Allow: GET, HEAD" in received  # not 501


def test_a_flood_of_page_requests_does_not_delay_the_scrapes(monitors: list[TrainingMonitor]) -> None:
    """Requests for anything but /metrics also wait in a budget of their own (a quarter of the rate): six page
    requests at once take seconds to be served, and a scrape sent after them is answered before the last."""
    monitor = start(monitors, web={"max_requests_per_second": 4})  # the pages' budget: 1 a second
    base = monitor.url.removesuffix("metrics")
    finished: list[tuple[str, float]] = []
    lock = threading.Lock()

    def fetch(path: str) -> None:
        status = get(base + path)[0]
        with lock:
            finished.append((f"{path} {status}", time.monotonic()))

    pages = [threading.Thread(target=fetch, args=("api/series?since=-1",)) for _ in range(6)]
    for thread in pages:
        thread.start()
    time.sleep(0.5)  # the page requests are in before the scrape
    scrape_thread = threading.Thread(target=fetch, args=("metrics",))
    scrape_thread.start()
    for thread in [*pages, scrape_thread]:
        thread.join(30)
    order = [name for name, _ in sorted(finished, key=lambda item: item[1])]
    assert len(order) == 7 and all(name.endswith(" 200") for name in order), order
    assert order.index("metrics 200") < 6, order  # not behind the whole page flood


def basic(user: str, password: str) -> dict[str, str]:
    return {"Authorization": "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()}


def request_from(source: str, port: int, headers: dict[str, str]) -> int:
    """One GET /metrics on a new connection from `source` (any 127.0.0.0/8 address is this host's loopback)."""
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=30, source_address=(source, 0))
    try:
        connection.request("GET", "/metrics", headers=headers)
        response = connection.getresponse()
        response.read()
        return response.status
    finally:
        connection.close()


def test_a_wrong_password_flood_neither_locks_out_nor_delays_the_honest_scraper(
    monitors: list[TrainingMonitor], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Eight connections from two addresses sending new wrong passwords for a bcrypt user
    took every bcrypt check (the right password got 401 for a minute), and their requests waited in the request
    budget the honest scraper waits in, ahead of it: each of its scrapes waited for the whole flood's queue. Now the
    addresses take turns for checks, and a refused request waits in a budget of its own. Counted, not timed: how
    many flood answers were sent while a scrape was waiting (the whole queue of 8 before the fix, ~0 now)."""
    bcrypt_checks: list[None] = []
    checkpw = bcrypt.checkpw

    def counted_checkpw(password: bytes, hashed: bytes) -> bool:
        bcrypt_checks.append(None)
        return checkpw(password, hashed)

    monkeypatch.setattr(bcrypt, "checkpw", counted_checkpw)
    monitor = start(monitors, web={"basic_auth_users": users()})
    port = port_of(monitor)
    stop = threading.Event()
    answers: list[tuple[float, int]] = []
    lock = threading.Lock()

    def flood(source: str, worker: int) -> None:
        connection = http.client.HTTPConnection("127.0.0.1", port, timeout=30, source_address=(source, 0))
        for attempt in range(1_000_000):
            if stop.is_set():
                break
            try:
                connection.request("GET", "/metrics", headers=basic("grafana", f"guess-{worker}-{attempt}"))
                response = connection.getresponse()
                response.read()
            except (OSError, http.client.HTTPException):
                connection.close()  # http.client connects again at the next request
                continue
            with lock:
                answers.append((time.monotonic(), response.status))
        connection.close()

    workers = [
        threading.Thread(target=flood, args=(source, worker), daemon=True)
        for worker, source in enumerate(["127.0.0.3", "127.0.0.4"] * 4)
    ]
    began = time.monotonic()
    for thread in workers:
        thread.start()
    try:
        deadline = time.monotonic() + 60
        while len(answers) < 16 and time.monotonic() < deadline:  # the flood is under way, every connection busy
            time.sleep(0.05)
        tries = 0
        status = 0
        while status != 200 and time.monotonic() < deadline:  # first login: the check waits its address's turn
            tries += 1
            status = request_from("127.0.0.2", port, basic("grafana", BCRYPT_PASSWORD))
            if status != 200:
                time.sleep(0.5)
        assert status == 200, f"the right password was refused {tries} times during the flood"
        behind = []
        for _ in range(10):  # the credential is remembered now: each scrape costs microseconds of auth
            sent = time.monotonic()
            assert request_from("127.0.0.2", port, basic("grafana", BCRYPT_PASSWORD)) == 200
            answered = time.monotonic()
            with lock:
                behind.append(sum(1 for at, _ in answers if sent < at < answered))
    finally:
        stop.set()
        for thread in workers:
            thread.join(60)
    elapsed = time.monotonic() - began
    assert len(answers) >= 16 and {code for _, code in answers} == {401}
    assert sum(behind) <= 10, f"flood answers sent while each scrape waited: {behind}"
    checks = len(bcrypt_checks)
    assert checks <= 3 + elapsed * basic_auth.CHECKS_PER_SECOND  # the flood got no more than the ration


def test_request_heads_over_16_kib_are_refused_however_they_arrive(
    monitors: list[TrainingMonitor],
) -> None:
    """h11 measures a head only while it is incomplete, and the server read 64 KiB at a
    time, so a head of up to ~64 KB that arrived in one read was served. Now every head is held to 16 KiB."""
    from ms_exporter.endpoint.server import MAX_HEAD_BYTES

    port = port_of(start(monitors))
    for size, expected in ((MAX_HEAD_BYTES - 200, b"200"), (MAX_HEAD_BYTES + 100, b"431"), (60_000, b"431")):
        request = b"GET /metrics HTTP/1.1\r\nHost: x\r\nX-Big: " + b"z" * size + b"\r\nConnection: close\r\n\r\n"
        received, _ = raw_exchange(port, request, wait=10)
        assert received.split(b"\r\n")[0].split()[1:2] == [expected], (size, received[:80])
    assert get(f"http://127.0.0.1:{port}/metrics")[0] == 200


ATEXIT_SCRIPT = """
import atexit, sys
from ms_exporter import TrainingMonitor

monitor = TrainingMonitor(port=0, project="atexit", save_dir=sys.argv[1])
print(monitor.url, flush=True)
sys.stdin.readline()  # the test has scraped regularly: the monitor knows its scrapers' interval
monitor.on_train_end(None)
# Registered after the monitor, so run before its close(), which lingers for a scrape of phase="ended".
atexit.register(lambda: print("at exit", flush=True))
"""


def test_the_endpoint_answers_while_atexit_closes_the_monitor(tmp_path: Path) -> None:
    """A script that never calls close() has its monitor closed from atexit, after the
    interpreter shut down concurrent.futures' pools; the scrape that should read phase="ended" failed ("cannot
    schedule new futures after shutdown") and every normal end paged. The answer threads are the server's own."""
    process = subprocess.Popen(
        [sys.executable, "-c", ATEXIT_SCRIPT, str(tmp_path)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=tmp_path,
    )
    assert process.stdin is not None and process.stdout is not None
    try:
        url = process.stdout.readline().strip()  # the process is killed in `finally` if it hangs here
        assert url.startswith("http://"), url
        for gap in (0.0, 1.5, 1.5):  # a scrape interval of 1.5 s: the linger waits up to 2 of them
            time.sleep(gap)
            assert get(url)[0] == 200
        process.stdin.write("end\n")
        process.stdin.flush()
        assert process.stdout.readline().strip() == "at exit"
        ended: list[float] = []
        deadline = time.monotonic() + 30
        while not ended and time.monotonic() < deadline:  # the first page may be the cached one (cache_seconds)
            status, _, body = get(url)
            assert status == 200
            ended = Scrape(body).find("mindspore_train_phase", phase="ended")
        assert ended == [1]
        _, stderr = process.communicate(timeout=60)
    finally:
        process.kill()
        process.wait(60)
    assert process.returncode == 0, stderr
    assert "cannot schedule new futures" not in stderr and "failed" not in stderr, stderr
