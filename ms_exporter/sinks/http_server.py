"""The rank's HTTP endpoint: /metrics rendered by prometheus_client, behind TLS, basic auth, a 404 and a cache."""

from __future__ import annotations

import base64
import binascii
import gzip
import hashlib
import hmac
import html
import json
import math
import queue
import socket
import ssl
import statistics
import threading
import time
import urllib.parse
from collections import deque
from collections.abc import Callable, Mapping
from email.message import Message
from http.server import BaseHTTPRequestHandler, HTTPServer
from importlib import resources
from typing import TYPE_CHECKING, Any

from prometheus_client import CollectorRegistry
from prometheus_client.exposition import choose_encoder, gzip_accepted

from ms_exporter.config import WebConfig

if TYPE_CHECKING:
    from ms_exporter.sinks.live_history import StepHistory

METRICS_PATH = "/metrics"
LIVE_PATHS = ("/", "/index.html")
SERIES_PATH = "/api/series"
STACKS_PATH = "/debug/stacks"  # the hang watchdog's latest dump (hang.debug_endpoint)
Stacks = Callable[[], "str | None"]
LIVE_REFRESH_MS = 2000
# A client that connects and then says nothing (or drips bytes) holds one server thread this long, at most.
REQUEST_TIMEOUT_SECONDS = 10.0
# Requests are served by a few long-lived threads (a thread per request costs more than serving a cached page)
# with a bounded queue in front: past it, a connection is closed at once instead of piling up.
WORKER_THREADS = 8
QUEUED_CONNECTIONS = 64
# HTTP/1.1 keep-alive (Prometheus and most load tools reuse connections): a kept connection holds a worker,
# so it is closed after this long without a next request, and after this many requests, so that idle or
# greedy clients cannot keep the workers from anyone else for long.
KEEPALIVE_IDLE_SECONDS = 1.0
REQUESTS_PER_CONNECTION = 100
_MAX_VERIFIED = 64  # remembered good credentials: bcrypt costs ~60 ms per check, a scrape must not pay it
# Rendered pages kept at once. The key is the content type prometheus_client chose from the Accept header, and a
# client may name any version >= 1.0.0 in it: past this many the cache starts over instead of growing.
_MAX_CACHED = 16

Headers = list[tuple[str, str]]
Answer = tuple[str, Headers, bytes]  # status line's "200 OK", headers without Content-Length, body
OnError = Callable[[str, BaseException], None]


class MetricsPages:
    """What the endpoint answers: GET /metrics (auth first, then a cached render), the live page, 404 elsewhere,
    405 for methods other than GET and HEAD. The format is prometheus_client's: `choose_encoder` reads the Accept
    header (Prometheus text 0.0.4 or 1.0.0, OpenMetrics) and the page is gzipped when Accept-Encoding allows,
    as prometheus_client's own handlers do."""

    def __init__(self, registry: CollectorRegistry, users: Mapping[str, str], cache_seconds: float,
                 history: StepHistory | None = None, labels: Mapping[str, str] | None = None,
                 stacks: Stacks | None = None) -> None:
        self._registry = registry
        self._stacks = stacks
        self._history = history
        self._labels = dict(labels or {})
        title = " ".join(f"{k} {v}" for k, v in self._labels.items() if k in ("project", "rank")) or "ms_exporter"
        self._page = live_page(title, history.capacity if history is not None else 0).encode()
        self._users = dict(users)
        self._cache_seconds = cache_seconds
        self._cache: dict[tuple[str, bool], tuple[float, Answer]] = {}
        self._render_lock = threading.Lock()
        self._verified: set[bytes] = set()
        # When /metrics was asked for (perf_counter), and when the newest page served was rendered: how a rank that
        # ended knows the interval its scrapers keep and whether they have seen its last state.
        self.metrics_requests: deque[float] = deque(maxlen=4)
        self.served_render = -math.inf

    def answer(self, method: str, target: str, headers: Message) -> Answer:
        """The answer to one parsed request; for HEAD the caller sends its status and headers only."""
        if self._users and not self._authorised(headers.get("Authorization", "")):
            return _reply("401 Unauthorized", b"Unauthorized\n",
                          [("WWW-Authenticate", 'Basic realm="ms_exporter", charset="UTF-8"')])
        raw_path, _, query = target.partition("?")
        path = urllib.parse.unquote(raw_path, "iso-8859-1")
        live = self._history is not None and (path in LIVE_PATHS or path == SERIES_PATH)
        stacks = self._stacks is not None and path == STACKS_PATH
        if path != METRICS_PATH and not live and not stacks:
            served = f"{METRICS_PATH}, / and {SERIES_PATH}" if self._history is not None else METRICS_PATH
            return _reply("404 Not Found", f"Not found: this endpoint serves {served}\n".encode())
        if method not in ("GET", "HEAD"):
            return _reply("405 Method Not Allowed", b"Method not allowed\n", [("Allow", "GET, HEAD")])
        if path == SERIES_PATH and self._history is not None:
            return self._series(self._history, query)
        if stacks and self._stacks is not None:
            dump = self._stacks()
            if dump is None:
                return _reply("404 Not Found", b"No hang dump yet: this rank has not outlasted a hang deadline\n")
            return _reply("200 OK", dump.encode(), [("Cache-Control", "no-cache")], "text/plain; charset=utf-8")
        if path in LIVE_PATHS:
            return _reply("200 OK", self._page, [("Cache-Control", "no-cache")], "text/html; charset=utf-8")
        # The query is ignored: prometheus_client's name[] filter would defeat the cache, and no scraper sends it.
        return self._metrics(headers.get("Accept", ""), headers.get("Accept-Encoding", ""))

    def scrape_interval(self) -> float | None:
        """The median gap between the last /metrics requests; None before two were seen."""
        times = list(self.metrics_requests)
        if len(times) < 2:
            return None
        return statistics.median(later - earlier for earlier, later in zip(times, times[1:], strict=False))

    def _metrics(self, accept: str, accept_encoding: str) -> Answer:
        self.metrics_requests.append(time.perf_counter())
        rendered, answer = self._render(accept, accept_encoding)
        self.served_render = max(self.served_render, rendered)
        return answer

    def _render(self, accept: str, accept_encoding: str) -> tuple[float, Answer]:
        """The page and the perf_counter time it was rendered at (-inf for an error)."""
        try:
            encoder, content_type = choose_encoder(accept)
        except (TypeError, ValueError):  # prometheus_client compares the version it was given as numbers
            return -math.inf, _reply("400 Bad Request", b"The Accept header's version is not a version number\n")
        gzipped = gzip_accepted(accept_encoding)
        key = (content_type, gzipped)
        # One render at a time: a burst of requests waits for it and shares it instead of rendering again.
        with self._render_lock:
            cached = self._cache.get(key)
            if cached is not None and time.perf_counter() - cached[0] < self._cache_seconds:
                return cached
            rendered = time.perf_counter()
            body = encoder(self._registry)
            headers = [("Content-Type", content_type)]
            if gzipped:
                body = gzip.compress(body)
                headers.append(("Content-Encoding", "gzip"))
            answer = ("200 OK", headers, body)
            if self._cache_seconds > 0:
                if len(self._cache) >= _MAX_CACHED:
                    self._cache.clear()
                self._cache[key] = (rendered, answer)
            return rendered, answer

    def _series(self, history: StepHistory, query: str) -> Answer:
        parsed = urllib.parse.parse_qs(query)
        try:
            since = int(parsed.get("since", ["-1"])[0])
        except ValueError:
            return _reply("400 Bad Request", b"since must be an integer step number\n")
        payload = history.since(since)
        payload["labels"] = self._labels
        body = json.dumps(payload, allow_nan=False, separators=(",", ":")).encode()
        return _reply("200 OK", body, [("Cache-Control", "no-store")], "application/json")

    def _authorised(self, header: str) -> bool:
        scheme, _, encoded = header.partition(" ")
        if scheme.lower() != "basic":
            return False
        try:
            user, _, password = base64.b64decode(encoded.strip(), validate=True).decode("utf-8").partition(":")
        except (binascii.Error, UnicodeDecodeError):
            return False
        hashed = self._users.get(user)
        if hashed is None:
            return False
        fingerprint = hashlib.sha256(f"{user}\0{password}\0{hashed}".encode()).digest()
        if fingerprint in self._verified:
            return True
        if not password_matches(password, hashed):
            return False
        if len(self._verified) >= _MAX_VERIFIED:
            self._verified.clear()
        self._verified.add(fingerprint)
        return True


def password_matches(password: str, hashed: str) -> bool:
    """bcrypt ($2a$/$2b$/$2y$) as in Prometheus' web config, or sha256:<hex> for machines without bcrypt."""
    if hashed.startswith("sha256:"):
        return hmac.compare_digest(hashlib.sha256(password.encode()).hexdigest(), hashed[len("sha256:"):])
    import bcrypt  # only needed when a bcrypt hash is configured: the `auth` extra

    return bool(bcrypt.checkpw(password.encode(), hashed.encode()))


def _reply(status: str, body: bytes, headers: Headers | None = None,
           content_type: str = "text/plain; charset=utf-8") -> Answer:
    return status, [("Content-Type", content_type), *(headers or [])], body


def live_page(title: str, capacity: int) -> str:
    """The self-contained live page: the template with the chart code inlined, nothing fetched from elsewhere."""
    assets = resources.files("ms_exporter") / "web_assets"
    template = (assets / "live.html").read_text(encoding="utf-8")
    return (template.replace("__CHART_JS__", (assets / "chart.js").read_text(encoding="utf-8"))
            .replace("__TITLE__", html.escape(title)).replace("__CAPACITY__", str(capacity))
            .replace("__REFRESH_MS__", str(LIVE_REFRESH_MS)))


class RequestBudget:
    """A token bucket shared by the endpoint's workers: `rate` requests a second on average, bursts of up to a
    second's worth. A worker over budget sleeps (holding no lock) before it reads its next request, so a flood
    is served at `rate` with growing latency instead of taking more of the training process's CPU and GIL."""

    def __init__(self, rate: float, clock: Callable[[], float] = time.monotonic,
                 sleep: Callable[[float], None] = time.sleep) -> None:
        self._rate = rate
        self._burst = max(rate, 1.0)
        self._tokens = self._burst
        self._clock = clock
        self._sleep = sleep
        self._updated = clock()
        self._lock = threading.Lock()

    def wait(self) -> None:
        with self._lock:
            now = self._clock()
            self._tokens = min(self._burst, self._tokens + (now - self._updated) * self._rate)
            self._updated = now
            self._tokens -= 1.0  # taken now; below zero it is a reservation that the sleep below pays for
            delay = -self._tokens / self._rate if self._tokens < 0 else 0.0
        if delay > 0:
            self._sleep(delay)


class _QuietHandler(BaseHTTPRequestHandler):
    """HTTP/1.1 with keep-alive, no access log on stderr, and bounded waits for slow or silent clients.

    The standard library parses and checks each request; the answer is written in one send (status line,
    headers and body together): a flood of requests costs the training process as little Python as the request
    itself needs.
    """

    timeout = REQUEST_TIMEOUT_SECONDS
    protocol_version = "HTTP/1.1"
    server: _PooledServer
    _last = False

    def handle(self) -> None:
        budget = self.server.budget
        for served in range(1, REQUESTS_PER_CONNECTION + 1):
            if budget is not None:
                budget.wait()  # before the request is read: waiting costs no parsing and holds nothing
            self.close_connection = True  # unless the request says keep-alive
            self._last = served == REQUESTS_PER_CONNECTION
            self.handle_one_request()  # the standard library's: read, 414/400/431, parse, then do_<METHOD>
            if self.close_connection:
                return
            self.connection.settimeout(KEEPALIVE_IDLE_SECONDS)

    def _answer(self) -> None:
        """Every method comes here: the pages answer 405 to all but GET and HEAD."""
        if self.headers.get("Content-Length", "0").strip() != "0" or "Transfer-Encoding" in self.headers:
            self.close_connection = True  # a body is never read: it must not be taken for the next request
        if self._last:
            self.close_connection = True  # and the answer says so: a client must not send the next one here
        try:
            status, headers, body = self.server.pages.answer(self.command, self.path, self.headers)
        except Exception as exc:  # a render or the live page's history failed: counted, never raised further
            self.server.on_error("prometheus", exc)
            self.close_connection = True
            status, headers, body = _reply("500 Internal Server Error", b"The monitor failed to answer; counted "
                                           b"in mindspore_exporter_errors_total{component=\"prometheus\"}\n")
        lines = [f"HTTP/1.1 {status}", *(f"{name}: {value}" for name, value in headers),
                 f"Content-Length: {len(body)}"]  # for HEAD too: what a GET would get
        if self.close_connection:
            lines.append("Connection: close")
        head = ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")
        self.wfile.write(head if self.command == "HEAD" else head + body)

    do_GET = do_HEAD = do_POST = do_PUT = do_DELETE = do_PATCH = do_OPTIONS = do_TRACE = do_CONNECT = _answer

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - the base class's signature
        pass


def tls_context(web: WebConfig) -> ssl.SSLContext:
    """The server's TLS settings; ssl.SSLError when the certificate, key or CA do not load."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    context.load_cert_chain(web.tls_cert_file or "", web.tls_key_file)
    if web.client_ca_file:
        context.load_verify_locations(cafile=web.client_ca_file)
        context.verify_mode = (ssl.CERT_REQUIRED if web.client_auth_type == "RequireAndVerifyClientCert"
                               else ssl.CERT_OPTIONAL)
    return context


class _PooledServer(HTTPServer):
    """Hands accepted connections to WORKER_THREADS daemon threads through a bounded queue."""

    def __init__(self, address: tuple[str, int], pages: MetricsPages, on_error: OnError,
                 budget: RequestBudget | None, context: ssl.SSLContext | None = None) -> None:
        self.pages = pages
        self.on_error = on_error
        self.budget = budget  # web.max_requests_per_second, shared by the workers
        self.context = context
        super().__init__(address, _QuietHandler)  # binds and listens: OSError when the port is taken

    def server_activate(self) -> None:
        super().server_activate()
        self._connections: queue.Queue[tuple[Any, Any] | None] = queue.Queue(QUEUED_CONNECTIONS)
        self._workers = [threading.Thread(target=self._work, name=f"ms_exporter-http-{i}", daemon=True)
                         for i in range(WORKER_THREADS)]
        for worker in self._workers:
            worker.start()

    def process_request(self, request: Any, client_address: Any) -> None:
        try:
            self._connections.put_nowait((request, client_address))
        except queue.Full:  # a flood: refuse this one rather than queue without bound
            self.shutdown_request(request)

    def _work(self) -> None:
        while True:
            item = self._connections.get()
            if item is None:
                return
            request, client_address = item
            try:
                self.finish_request(request, client_address)
            except Exception:
                pass  # a client that went away mid-request: nothing to report, the next one is served
            finally:
                self.shutdown_request(request)

    def server_close(self) -> None:
        super().server_close()
        for _ in getattr(self, "_workers", ()):  # none when binding failed before activation
            try:
                self._connections.put_nowait(None)
            except queue.Full:
                break  # daemon threads: they end with the process


class _TlsServer(_PooledServer):
    """Shakes hands in a worker thread, so a client that never finishes cannot stall accept()."""

    context: ssl.SSLContext

    def get_request(self) -> tuple[socket.socket, Any]:
        raw, address = self.socket.accept()
        return self.context.wrap_socket(raw, server_side=True, do_handshake_on_connect=False), address

    def finish_request(self, request: Any, client_address: Any) -> None:
        if self.budget is not None:
            self.budget.wait()  # a handshake costs more CPU than a request: it counts as one
        try:
            request.settimeout(REQUEST_TIMEOUT_SECONDS)
            request.do_handshake()
        except (OSError, ssl.SSLError):
            return  # plain HTTP on the TLS port, a bad or missing client certificate: the connection just ends
        super().finish_request(request, client_address)


def serve(registry: CollectorRegistry, web: WebConfig, address: str, port: int, on_error: OnError,
          context: ssl.SSLContext | None = None, history: StepHistory | None = None,
          labels: Mapping[str, str] | None = None, stacks: Stacks | None = None) -> tuple[HTTPServer, threading.Thread]:
    """Start serving on a daemon thread (TLS when given a context); OSError when the port cannot be bound.

    `on_error(component, exc)` counts a request that could not be answered (a render that raised, say)."""
    base: type[_PooledServer] = _TlsServer if context is not None else _PooledServer
    server_class = type("MetricsServer", (base,), {"address_family": socket.AF_INET6 if ":" in address
                                                   else socket.AF_INET})
    pages = MetricsPages(registry, web.basic_auth_users, web.cache_seconds, history, labels, stacks)
    budget = RequestBudget(web.max_requests_per_second) if web.max_requests_per_second else None
    server = server_class((address, port), pages, on_error, budget, context)
    thread = threading.Thread(target=server.serve_forever, name="ms_exporter-http", daemon=True)
    thread.start()
    return server, thread
