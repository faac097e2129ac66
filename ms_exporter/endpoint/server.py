"""The rank's HTTP endpoint: how connections are handled (what is answered is endpoint_pages.py's job).

Connections live on one asyncio event loop in a daemon thread, so an idle, silent or dripping client costs a
suspended coroutine, not a thread, and no client can keep the endpoint from others by being slow:
- every request has a total deadline (REQUEST_SECONDS from its first byte to its last header; a client that
  sends a byte a second gains nothing), and a connection must start its first request within REQUEST_SECONDS
  and each next one within KEEPALIVE_IDLE_SECONDS;
- at most MAX_CONNECTIONS are open, and MAX_CONNECTIONS_PER_PEER from one address; a new connection past a
  limit takes the place of the one that has waited longest for its request (slow and silent clients go first),
  and is refused only when every connection is busy being answered;
- HTTP/1.1 is parsed by h11 (conflicting Content-Length headers, malformed request lines and heads over
  MAX_HEAD_BYTES are answered 400/431 with a status line, and the connection closes);
- answers are computed by MetricsPages in ANSWER_THREADS threads, under the request budget, which counts each
  answer's CPU time (request_budget.py). Without basic auth every request pays the budget before it is read; a
  request for anything but /metrics (the live page, its series, the stacks, a 404) also pays a second, smaller
  budget once parsed, and its answer's work is charged there: a flood of page requests cannot delay the scrapes;
- with basic auth a request is authenticated first, on the loop (a remembered password costs microseconds; a
  bcrypt check runs in an answer thread, rationed and shared fairly between addresses by basic_auth.py). Only a
  request that passed pays the request budget; one that did not waits in a third, small budget for its 401, and
  may make way for a new connection meanwhile: a flood of wrong passwords cannot delay the scrapes either;
- the answer threads are the server's own daemon threads fed by a queue, not a concurrent.futures pool: those
  refuse work once the interpreter starts to exit, and a monitor that closes from atexit keeps serving until
  its scrapers have read that the run ended.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import queue
import socket
import ssl
import threading
import time
import weakref
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import h11
from prometheus_client import CollectorRegistry

from ms_exporter.config import WebConfig
from ms_exporter.core.compat import start_tls
from ms_exporter.core.errors import OnError
from ms_exporter.core.part import DebugPage
from ms_exporter.endpoint.basic_auth import TrustedPeersFile
from ms_exporter.endpoint.pages import (
    METRICS_PATH,
    UNAUTHORIZED,
    Answer,
    MetricsPages,
    _reply,
    split_target,
)
from ms_exporter.endpoint.request_budget import RequestBudget

if TYPE_CHECKING:
    from ms_exporter.endpoint.live_history import StepHistory

REQUEST_SECONDS = 10.0  # the whole head of a request (and a TLS handshake), from its first byte
PAGES_SHARE = 0.25  # the second budget's rate, as a share of web.max_requests_per_second
REFUSED_SHARE = 0.25  # the third one's, for requests that failed basic auth
KEEPALIVE_IDLE_SECONDS = 1.0  # a kept connection's wait for its next request
REQUESTS_PER_CONNECTION = 100  # then the answer says Connection: close
SEND_SECONDS = 10.0  # a client that does not take its answer within this is dropped
MAX_CONNECTIONS = 256
MAX_CONNECTIONS_PER_PEER = 192  # another address always finds 64 places without evicting anyone
MAX_HEAD_BYTES = 16 * 1024  # request line and headers
ANSWER_THREADS = 2
LINGER_SECONDS = 1.0  # after an error answer, unread input is drained this long so the answer is not reset away
LINGER_BYTES = 1024 * 1024
_T = TypeVar("_T")


class _Headers(dict[str, str]):
    """A request's headers by lower-case name (the first of repeated ones), read case-insensitively."""

    def get(self, name: str, default: str = "", /) -> str:  # type: ignore[override]
        return super().get(name.lower(), default)


class _AnswerThreads:
    """ANSWER_THREADS daemon threads that run calls for the loop, in the order given. Unlike a ThreadPoolExecutor
    they take work while atexit handlers run (a monitor closing at exit lingers for its last scrape then)."""

    def __init__(self, count: int) -> None:
        self._jobs: queue.SimpleQueue[
            tuple[asyncio.AbstractEventLoop, asyncio.Future[Any], Callable[[], Any]] | None
        ] = queue.SimpleQueue()
        self._threads = [
            threading.Thread(target=self._work, name=f"ms_exporter-http-answer-{index}", daemon=True)
            for index in range(count)
        ]
        for thread in self._threads:
            thread.start()

    def run(self, call: Callable[[], _T]) -> asyncio.Future[_T]:
        """`call()` in a thread; the future (of the running loop) has its result or exception."""
        loop = asyncio.get_running_loop()
        future: asyncio.Future[_T] = loop.create_future()
        self._jobs.put((loop, future, call))
        return future

    def close(self) -> None:
        for _ in self._threads:
            self._jobs.put(None)

    def _work(self) -> None:
        while (job := self._jobs.get()) is not None:
            loop, future, call = job
            try:
                outcome: tuple[Any, BaseException | None] = (call(), None)
            except Exception as exc:  # handed to the awaiting coroutine
                outcome = (None, exc)
            with contextlib.suppress(RuntimeError):  # the loop closed meanwhile: nobody waits any more
                loop.call_soon_threadsafe(_settle, future, *outcome)


def _settle(future: asyncio.Future[Any], result: Any, error: BaseException | None) -> None:
    if future.done():  # the awaiting coroutine was cancelled
        return
    if error is not None:
        future.set_exception(error)
    else:
        future.set_result(result)


class _Connection:
    """One client connection: where it is, for the limits' choice of whom to drop."""

    __slots__ = ("peer", "transport", "waiting_since")

    def __init__(self, peer: str, transport: asyncio.WriteTransport) -> None:
        self.peer = peer
        self.transport = transport
        self.waiting_since: float | None = time.monotonic()  # None while its request is being answered


class EndpointServer:
    """Serves `pages` on a bound listening socket until shutdown(); the interface PrometheusEndpoint uses."""

    def __init__(
        self,
        listener: socket.socket,
        pages: MetricsPages,
        on_error: OnError,
        budget: RequestBudget | None,
        context: ssl.SSLContext | None,
    ) -> None:
        self.pages = pages
        self.server_address = listener.getsockname()
        self._listener = listener
        self._on_error = on_error
        self._budget = budget
        self._pages_budget = RequestBudget(budget.rate * PAGES_SHARE) if budget is not None else None
        self._refused_budget = RequestBudget(budget.rate * REFUSED_SHARE) if budget is not None else None
        self._auth_first = bool(pages.auth)  # then the request budget is paid once a request passed
        self._context = context
        self._connections: dict[int, _Connection] = {}
        self._loop = asyncio.new_event_loop()
        # What asyncio reports about single connections (a reset during a TLS handshake, say) is the client's
        # business, not a monitor error, and must not reach the training's stderr.
        self._loop.set_exception_handler(lambda loop, context: None)
        self._stopped = threading.Event()
        # Set up here, in the constructing thread: a shutdown() right after construction finds a whole server.
        self._server = self._loop.run_until_complete(
            asyncio.start_server(self._serve_connection, sock=listener, limit=MAX_HEAD_BYTES)
        )
        self._threads = _AnswerThreads(ANSWER_THREADS)  # last: nothing to stop when start_server failed

    # -- the loop's thread --------------------------------------------------------------------------------
    def serve_forever(self) -> None:
        asyncio.set_event_loop(self._loop)
        try:
            self._loop.run_forever()
        finally:
            with contextlib.suppress(Exception):
                self._close_everything()
            self._stopped.set()

    def _close_everything(self) -> None:
        self._server.close()
        for connection in list(self._connections.values()):
            connection.transport.abort()
        pending = asyncio.all_tasks(self._loop)
        for task in pending:
            task.cancel()
        if pending:
            self._loop.run_until_complete(asyncio.gather(*pending, return_exceptions=True))
        self._loop.close()

    # -- called from other threads ----------------------------------------------------------------------------
    def shutdown(self) -> None:
        if not self._loop.is_closed():
            with contextlib.suppress(RuntimeError):  # the loop closed meanwhile
                self._loop.call_soon_threadsafe(self._loop.stop)
        self._stopped.wait(10)

    def server_close(self) -> None:
        self._listener.close()
        self._threads.close()

    # -- one connection ---------------------------------------------------------------------------------------
    async def _serve_connection(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        peer = str((writer.get_extra_info("peername") or ("",))[0])
        connection = _Connection(peer, writer.transport)
        if not self._admit(connection):
            writer.transport.abort()
            return
        try:
            if self._context is not None:
                await self._wait_for_budget()  # a handshake costs more CPU than a request: it counts as one
                await start_tls(writer, self._context, REQUEST_SECONDS)
                connection.transport = writer.transport
            await self._exchange(reader, writer, connection)
        except (
            OSError,
            TimeoutError,
            ssl.SSLError,
            asyncio.IncompleteReadError,
            h11.ProtocolError,
            asyncio.CancelledError,
        ):
            pass  # a client that went away, stalled or failed its handshake, or the server stopping
        except Exception as exc:  # the server must outlive anything one connection does
            self._on_error("prometheus", exc)
        finally:
            self._connections.pop(id(connection), None)
            writer.transport.abort()

    def _admit(self, new: _Connection) -> bool:
        """Room for `new`: past a limit, the connection of the same scope that has waited longest for its request
        makes way; when none waits (all are being answered), `new` is refused."""
        same_peer = [c for c in self._connections.values() if c.peer == new.peer]
        for scope, limit in (
            (same_peer, MAX_CONNECTIONS_PER_PEER),
            (list(self._connections.values()), MAX_CONNECTIONS),
        ):
            if len(scope) >= limit:
                waiting = [c for c in scope if c.waiting_since is not None]
                if not waiting:
                    return False
                oldest = min(waiting, key=lambda c: c.waiting_since or 0.0)
                oldest.transport.abort()
                self._connections.pop(id(oldest), None)
        self._connections[id(new)] = new
        return True

    async def _exchange(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, connection: _Connection
    ) -> None:
        parser = h11.Connection(h11.SERVER, max_incomplete_event_size=MAX_HEAD_BYTES)
        idle = REQUEST_SECONDS  # the first request must start within this; later ones within the keep-alive wait
        for served in range(1, REQUESTS_PER_CONNECTION + 1):
            connection.waiting_since = time.monotonic()
            try:
                request = await self._next_request(reader, parser, idle)
            except h11.RemoteProtocolError as exc:
                await self._refuse(reader, writer, parser, exc)
                return
            if request is None:
                return  # closed, or nothing came in time
            connection.waiting_since = None
            headers = _Headers()
            for name, value in request.headers:
                headers.setdefault(name.decode("latin-1"), value.decode("latin-1"))
            answer: Answer | None = None
            if self._auth_first:
                if not await self._authenticate(headers, connection.peer):
                    # Refused requests wait apart from the others, and a new connection may take this one's place.
                    connection.waiting_since = time.monotonic()
                    await self._wait_for_budget(self._refused_budget)
                    connection.waiting_since = None
                    answer = UNAUTHORIZED
                else:
                    await self._wait_for_budget()
            lane = self._budget
            if (
                answer is None
                and self._pages_budget is not None
                and split_target(request.target.decode("latin-1"))[0] != METRICS_PATH
            ):
                lane = self._pages_budget
                await self._wait_for_budget(lane)
            has_body = request.headers and any(
                (name == b"content-length" and value.strip() != b"0") or name == b"transfer-encoding"
                for name, value in request.headers
            )
            # A body is never read: the connection ends after the answer so it is never taken for a request.
            closing = bool(has_body) or served == REQUESTS_PER_CONNECTION
            status, reply_headers, body = answer or await self._answer(request, headers, connection.peer, lane)
            if closing or status.startswith("500"):
                reply_headers = [*reply_headers, ("Connection", "close")]
            await self._send(writer, parser, request.method == b"HEAD", status, reply_headers, body)
            if not has_body and not isinstance(parser.next_event(), h11.EndOfMessage):
                return  # (a request without a body ends with its head: this cannot happen, but never guess)
            if parser.our_state is not h11.DONE or parser.their_state is not h11.DONE:
                return  # h11 says the connection ends here (Connection: close, HTTP/1.0, a body left unread)
            parser.start_next_cycle()
            idle = KEEPALIVE_IDLE_SECONDS

    async def _next_request(
        self, reader: asyncio.StreamReader, parser: h11.Connection, idle: float
    ) -> h11.Request | None:
        """The next request's head, or None when the client closed or did not start one within `idle`. From its
        first byte the head must be complete within REQUEST_SECONDS, however the bytes are spread. The request
        waits its turn in the budget once its head is complete and before it is parsed: a client that never
        finishes its head (a slow or stalled one) takes nothing from the budget the others wait in."""
        loop = asyncio.get_running_loop()
        deadline: float | None = None
        paid = False
        tail = b""  # the last bytes received, to see a head's end split across reads
        while True:
            event = parser.next_event()
            if isinstance(event, h11.Request):
                if not paid and not self._auth_first:  # a request that came in the same read as the previous one
                    await self._wait_for_budget()
                return event
            if isinstance(event, h11.ConnectionClosed):
                return None
            if event is not h11.NEED_DATA:
                continue  # the previous request's EndOfMessage
            # h11 measures a head only while it is incomplete: one that arrives whole in a read is taken at any
            # size. Reading no more than the head may still take keeps every head within MAX_HEAD_BYTES.
            room = MAX_HEAD_BYTES - len(parser.trailing_data[0])
            if room <= 0:
                raise h11.RemoteProtocolError(f"the request head is over {MAX_HEAD_BYTES} bytes", error_status_hint=431)
            try:
                data = await asyncio.wait_for(
                    reader.read(room), idle if deadline is None else max(deadline - loop.time(), 0.0)
                )
            except TimeoutError:
                if deadline is not None:
                    raise  # a head that did not arrive in time: the connection just ends
                return None
            if deadline is None and data:
                deadline = loop.time() + REQUEST_SECONDS
            if not paid and not self._auth_first:
                seen = tail + data
                if b"\r\n\r\n" in seen or b"\n\n" in seen:  # h11 also takes bare newlines
                    await self._wait_for_budget()
                    paid = True
                tail = seen[-3:]
            parser.receive_data(data)  # b"": the client closed

    async def _wait_for_budget(self, budget: RequestBudget | None = None) -> None:
        budget = budget or self._budget
        if budget is not None:
            delay = budget.reserve()
            if delay > 0:
                await asyncio.sleep(delay)

    async def _authenticate(self, headers: _Headers, peer: str) -> bool:
        """Whether the request's credentials pass: on the loop when that takes microseconds (remembered, sha256,
        malformed, not this address's turn), in an answer thread when a bcrypt check is due."""
        auth, header = self.pages.auth, headers.get("Authorization")
        verdict = auth.allows(header, peer, checks=False)
        if verdict is None:
            verdict = await self._threads.run(lambda: auth.allows(header, peer))
        return bool(verdict)

    async def _answer(self, request: h11.Request, headers: _Headers, peer: str, budget: RequestBudget | None) -> Answer:
        method, target = request.method.decode("ascii", "replace"), request.target.decode("latin-1")
        answer, cpu = await self._threads.run(lambda: self._timed_answer(method, target, headers, peer))
        if budget is not None:
            budget.charge(cpu)
        return answer

    def _timed_answer(self, method: str, target: str, headers: _Headers, peer: str) -> tuple[Answer, float]:
        began = time.thread_time()
        try:
            answer = self.pages.answer(method, target, headers, peer, authenticated=True)
        except Exception as exc:  # a render or the live page's history failed: counted, never raised further
            self._on_error("prometheus", exc)
            answer = _reply(
                "500 Internal Server Error",
                b'The monitor failed to answer; counted in mindspore_exporter_errors_total{component="prometheus"}\n',
            )
        return answer, time.thread_time() - began

    @staticmethod
    async def _send(
        writer: asyncio.StreamWriter,
        parser: h11.Connection,
        head_only: bool,
        status: str,
        headers: list[tuple[str, str]],
        body: bytes,
    ) -> None:
        code, _, reason = status.partition(" ")
        response = h11.Response(
            status_code=int(code),
            reason=reason.encode("latin-1"),
            headers=[*headers, ("Content-Length", str(len(body)))],
        )  # for HEAD too
        data = parser.send(response) or b""
        if not head_only:
            data += parser.send(h11.Data(data=body)) or b""
        data += parser.send(h11.EndOfMessage()) or b""
        writer.write(data)
        await asyncio.wait_for(writer.drain(), SEND_SECONDS)

    async def _refuse(
        self,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        parser: h11.Connection,
        error: h11.RemoteProtocolError,
    ) -> None:
        """Answer a request h11 could not parse with its status (400, 414, 431) and a status line, then close,
        draining what the client still sends for a moment so that the answer is not lost to a reset."""
        if parser.our_state not in (h11.IDLE, h11.SEND_RESPONSE):
            return
        status = {400: "400 Bad Request", 414: "414 URI Too Long", 431: "431 Request Header Fields Too Large"}.get(
            error.error_status_hint, f"{error.error_status_hint} Bad Request"
        )
        body = f"Bad request: {error}\n".encode("utf-8", "replace")
        code, _, reason = status.partition(" ")
        head = (
            f"HTTP/1.1 {code} {reason}\r\nContent-Type: text/plain; charset=utf-8\r\nContent-Length: "
            f"{len(body)}\r\nConnection: close\r\n\r\n"
        ).encode("latin-1")
        writer.write(head + body)
        await asyncio.wait_for(writer.drain(), SEND_SECONDS)
        if writer.can_write_eof():
            writer.write_eof()
        drained, until = 0, asyncio.get_running_loop().time() + LINGER_SECONDS
        with contextlib.suppress(TimeoutError, OSError):
            while drained < LINGER_BYTES:
                left = until - asyncio.get_running_loop().time()
                chunk = await asyncio.wait_for(reader.read(65536), max(left, 0.0))
                if not chunk:
                    break
                drained += len(chunk)


def tls_context(web: WebConfig) -> ssl.SSLContext:
    """The server's TLS settings; ssl.SSLError when the certificate, key or CA do not load."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    context.load_cert_chain(web.tls_cert_file or "", web.tls_key_file)
    if web.client_ca_file:
        context.load_verify_locations(cafile=web.client_ca_file)
        context.verify_mode = (
            ssl.CERT_REQUIRED if web.client_auth_type == "RequireAndVerifyClientCert" else ssl.CERT_OPTIONAL
        )
    return context


def serve(
    registry: CollectorRegistry,
    web: WebConfig,
    address: str,
    port: int,
    on_error: OnError,
    context: ssl.SSLContext | None = None,
    history: StepHistory | None = None,
    labels: Mapping[str, str] | None = None,
    debug_pages: Mapping[str, DebugPage] | None = None,
    trusted_file: Path | None = None,
) -> tuple[EndpointServer, Any]:
    """Start serving on a daemon thread (TLS when given a context); OSError when the port cannot be bound.

    `on_error(component, exc)` counts a request that could not be answered (a render that raised, say).
    `trusted_file` keeps the addresses whose password passed for the rank's next process (basic_auth.py)."""
    family = socket.AF_INET6 if ":" in address else socket.AF_INET
    listener = socket.create_server((address, port), family=family, backlog=128, reuse_port=False)
    _LISTENERS.add(listener)
    pages = MetricsPages(registry, web.basic_auth_users, web.cache_seconds, history, labels, debug_pages)
    if pages.auth and trusted_file is not None:
        trusted = TrustedPeersFile(trusted_file, on_error)
        pages.auth.trust(trusted.load(), trusted.save)
    budget = RequestBudget(web.max_requests_per_second) if web.max_requests_per_second else None
    server = EndpointServer(listener, pages, on_error, budget, context)
    thread = threading.Thread(target=server.serve_forever, name="ms_exporter-http", daemon=True)
    thread.start()
    return server, thread


# Every endpoint's listening socket in this process. A child forked from it (a data loader's worker, a helper) gets a
# copy of each, and one that outlived its parent kept the rank's port bound: the rank's next process could not
# serve on it. The child never serves (the monitor is off there), so its copies are closed at once.
_LISTENERS: weakref.WeakSet[socket.socket] = weakref.WeakSet()


def _close_listeners_in_child() -> None:
    for listener in list(_LISTENERS):
        with contextlib.suppress(OSError):
            listener.close()


os.register_at_fork(after_in_child=_close_listeners_in_child)
