"""What the rank's endpoint answers: /metrics rendered by prometheus_client (auth first, then a cached render),
the live page, its series, the hang dump, 404 and 405. How connections are handled is http_server.py's job."""

from __future__ import annotations

import gzip
import html
import json
import math
import threading
import time
import urllib.parse
from collections.abc import Mapping
from importlib import resources
from typing import TYPE_CHECKING, Protocol

from prometheus_client import CollectorRegistry
from prometheus_client.exposition import choose_encoder, gzip_accepted

from ms_exporter.core.part import DebugPage
from ms_exporter.endpoint.basic_auth import BasicAuth
from ms_exporter.endpoint.scrapers import ScraperLog

if TYPE_CHECKING:
    from ms_exporter.endpoint.live_history import StepHistory

METRICS_PATH = "/metrics"
LIVE_PATHS = ("/", "/index.html")
SERIES_PATH = "/api/series"
STACKS_PATH = "/debug/stacks"  # the hang watchdog's latest dump (hang.debug_endpoint)
CHECKSUMS_PATH = "/debug/checksums"  # the replica checks' recent per-tensor checksums (docs/sdc.md)
LIVE_REFRESH_MS = 2000
# Rendered pages kept at once. The key is the content type prometheus_client chose from the Accept header, and a
# client may name any version >= 1.0.0 in it: past this many the cache starts over instead of growing.
_MAX_CACHED = 16

Headers = list[tuple[str, str]]
Answer = tuple[str, Headers, bytes]  # status line's "200 OK", headers without Content-Length, body
UNAUTHORIZED: Answer = (
    "401 Unauthorized",
    [("Content-Type", "text/plain; charset=utf-8"), ("WWW-Authenticate", 'Basic realm="ms_exporter", charset="UTF-8"')],
    b"Unauthorized\n",
)


class RequestHeaders(Protocol):
    """What the pages read of a request's headers: email.message.Message and the server's own mapping."""

    def get(self, name: str, default: str = ..., /) -> str: ...


def split_target(target: str) -> tuple[str, str]:
    """A request target's path (percent-decoded) and query; the absolute form (RFC 9112 3.2.2, as proxies send it)
    is the same resource as the origin form."""
    if target.startswith(("http://", "https://")):
        parts = urllib.parse.urlsplit(target)
        target = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
    raw_path, _, query = target.partition("?")
    return urllib.parse.unquote(raw_path, "iso-8859-1"), query


class MetricsPages:
    """What the endpoint answers: GET /metrics (auth first, then a cached render), the live page, 404 elsewhere,
    405 for methods other than GET and HEAD. The format is prometheus_client's: `choose_encoder` reads the Accept
    header (Prometheus text 0.0.4 or 1.0.0, OpenMetrics) and the page is gzipped when Accept-Encoding allows,
    as prometheus_client's own handlers do."""

    def __init__(
        self,
        registry: CollectorRegistry,
        users: Mapping[str, str],
        cache_seconds: float,
        history: StepHistory | None = None,
        labels: Mapping[str, str] | None = None,
        debug_pages: Mapping[str, DebugPage] | None = None,
    ) -> None:
        self._registry = registry
        # Not a copy: a part built after the endpoint adds its page to the same mapping (monitor/assembly.py).
        self._debug_pages = debug_pages if debug_pages is not None else {}
        self._history = history
        self._labels = dict(labels or {})
        title = " ".join(f"{k} {v}" for k, v in self._labels.items() if k in ("project", "rank")) or "ms_exporter"
        self._page = live_page(title, history.capacity if history is not None else 0).encode()
        self.auth = BasicAuth(users)
        self._cache_seconds = cache_seconds
        self._cache: dict[tuple[str, bool], tuple[float, Answer]] = {}
        self._series_cache: dict[int, tuple[float, Answer]] = {}  # since -> (perf_counter, answer)
        self._render_lock = threading.Lock()
        # Who asked for /metrics, when, and when each page served to them was rendered: how a rank that ended knows
        # its scrapers' intervals and whether each of them has read its last state.
        self.scrapers = ScraperLog()

    def answer(
        self, method: str, target: str, headers: RequestHeaders, peer: str = "", authenticated: bool = False
    ) -> Answer:
        """The answer to one parsed request; for HEAD the caller sends its status and headers only. The server
        passes authenticated=True once it has checked the request's credentials against `auth` itself."""
        if not authenticated and self.auth and not self.auth.allows(headers.get("Authorization", ""), peer):
            return UNAUTHORIZED
        path, query = split_target(target)
        live = self._history is not None and (path in LIVE_PATHS or path == SERIES_PATH)
        debug = self._debug_pages.get(path)
        if path != METRICS_PATH and not live and debug is None:
            served = f"{METRICS_PATH}, / and {SERIES_PATH}" if self._history is not None else METRICS_PATH
            return _reply("404 Not Found", f"Not found: this endpoint serves {served}\n".encode())
        if method not in ("GET", "HEAD"):
            return _reply("405 Method Not Allowed", b"Method not allowed\n", [("Allow", "GET, HEAD")])
        if path == SERIES_PATH and self._history is not None:
            return self._series(self._history, query)
        if debug is not None:
            text = debug.read()
            if text is None:
                return _reply("404 Not Found", f"{debug.missing}\n".encode())
            return _reply("200 OK", text.encode(), [("Cache-Control", "no-cache")], debug.content_type)
        if path in LIVE_PATHS:
            return _reply("200 OK", self._page, [("Cache-Control", "no-cache")], "text/html; charset=utf-8")
        # The query is ignored: prometheus_client's name[] filter would defeat the cache, and no scraper sends it.
        requested = time.perf_counter()
        rendered, answer = self._render(headers.get("Accept", ""), headers.get("Accept-Encoding", ""))
        self.scrapers.record(peer, headers.get("User-Agent", ""), requested, rendered)
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
        # A page that loads asks for the whole history (since=-1, ~30 ms to render at capacity): that answer is
        # reused for a page refresh period (later polls ask only for newer steps), the others for cache_seconds,
        # so a flood of page loads costs one whole-history render every 2 s.
        now = time.perf_counter()
        keep = max(self._cache_seconds, LIVE_REFRESH_MS / 1000) if since < 0 else self._cache_seconds
        with self._render_lock:
            cached = self._series_cache.get(since)
            if cached is not None and now - cached[0] < keep:
                return cached[1]
        payload = history.since(since)
        payload["labels"] = self._labels
        body = json.dumps(payload, allow_nan=False, separators=(",", ":")).encode()
        answer = _reply("200 OK", body, [("Cache-Control", "no-store")], "application/json")
        if keep > 0:
            with self._render_lock:
                if len(self._series_cache) >= _MAX_CACHED:
                    self._series_cache.clear()
                self._series_cache[since] = (now, answer)
        return answer


def _reply(
    status: str, body: bytes, headers: Headers | None = None, content_type: str = "text/plain; charset=utf-8"
) -> Answer:
    return status, [("Content-Type", content_type), *(headers or [])], body


def live_page(title: str, capacity: int) -> str:
    """The self-contained live page: the template with the chart code inlined, nothing fetched from elsewhere."""
    assets = resources.files("ms_exporter.endpoint") / "web_assets"
    template = (assets / "live.html").read_text(encoding="utf-8")
    return (
        template.replace("__CHART_JS__", (assets / "chart.js").read_text(encoding="utf-8"))
        .replace("__TITLE__", html.escape(title))
        .replace("__CAPACITY__", str(capacity))
        .replace("__REFRESH_MS__", str(LIVE_REFRESH_MS))
    )
