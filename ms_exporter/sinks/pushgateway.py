"""Pushes this rank's series to a Prometheus Pushgateway, so short or crashed jobs leave their last numbers."""

from __future__ import annotations

import threading
from typing import Any

from prometheus_client import CollectorRegistry, push_to_gateway

from ms_exporter.config import PushgatewayConfig
from ms_exporter.core.errors import OnError
from ms_exporter.core.part import PartContext
from ms_exporter.core.registry import BackendEntry
from ms_exporter.core.sink import Sink
from ms_exporter.core.store import MetricStore
from ms_exporter.sinks.prometheus import StoreCollector

COMPONENT = "pushgateway"
GROUPING_LABELS = ("project", "rank")


class PushgatewaySink(Sink):
    """PUTs the whole store (what /metrics serves) to `{url}/metrics/job/{job}/project/{project}/rank/{rank}`.

    Each push replaces the group's previous state, so the Pushgateway always holds this rank's latest numbers.
    When pushes happen follows `config.on`: `train_end` pushes once when a run ends (normally, by an exception
    or by SIGTERM/SIGINT) and at close if no run ended since; `interval` pushes every `config.interval` seconds
    from a daemon thread while training runs. A push that fails or takes longer than `config.timeout` (per
    connect and per read) is counted in `mindspore_exporter_errors_total{component="pushgateway"}` and skipped;
    no method raises.

    | pushed | grouping key | job label |
    |---|---|---|
    | every series of the store, with its `rank` and `project` labels | `project`, `rank` | `config.job` |
    """

    name = COMPONENT
    needs_signals = True  # a stopped job leaves its last numbers behind

    def __init__(self, store: MetricStore, config: PushgatewayConfig, on_error: OnError) -> None:
        if not config.url:
            raise ValueError("PushgatewaySink needs pushgateway.url")
        self._config = config
        self._on_error = on_error
        self._registry = CollectorRegistry(auto_describe=False)
        # A family that fails to render during a push is a push problem, not a /metrics scrape problem.
        self._registry.register(StoreCollector(store, lambda _component, exc: on_error(COMPONENT, exc)))
        constant = dict(store.constant_labels)
        self._grouping_key = {name: constant[name] for name in GROUPING_LABELS if name in constant}
        self._periodic = "interval" in config.on
        self._final = "train_end" in config.on
        # Serialises pushes, so the final push of a run is never overtaken by a periodic one still in flight.
        # Re-entrant because a signal handler may call on_train_end() while the main thread is inside a push.
        self._push_lock = threading.RLock()
        self._state_lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self._stop: threading.Event | None = None
        self._final_attempted = False  # an on_train_end() push was tried since the last on_train_begin()
        self._closed = False

    def on_train_begin(self, cb_params: Any) -> None:
        """A run begins: start the periodic pusher if `interval` is in `on`. Calling it again is harmless."""
        try:
            with self._state_lock:
                if self._closed:
                    return
                self._final_attempted = False
                if not self._periodic or (self._thread is not None and self._thread.is_alive()):
                    return
                # A fresh event per thread: a thread that outlived its join must still see its own stop.
                self._stop = threading.Event()
                self._thread = threading.Thread(
                    target=self._loop, args=(self._stop,), name="ms_exporter-pushgateway", daemon=True
                )
                self._thread.start()
        except Exception as exc:  # e.g. no thread can be started: train without periodic pushes
            self._on_error(COMPONENT, exc)

    def on_train_end(self, step: int, completed: bool = True) -> None:
        """A run ended (or is being stopped): stop the periodic pusher, then push once if `train_end` is in `on`."""
        try:
            self._stop_thread()
            if self._final:
                self._final_attempted = True
                self._push()
        except Exception as exc:
            self._on_error(COMPONENT, exc)

    def on_signal(self, signal_name: str, step: int) -> None:
        """The process may end now: push its state once. The periodic pusher goes on, for a process that outlives
        the signal (SIGTERM ignored, a handler that saves and carries on); its real end pushes again."""
        self._push()

    def close(self) -> None:
        """Stop pushing; push the last state if `train_end` is in `on` and no run ended since the last start."""
        try:
            if self._closed:
                return
            self._closed = True
            self._stop_thread()
            if self._final and not self._final_attempted:
                self._final_attempted = True
                self._push()
        except Exception as exc:
            self._on_error(COMPONENT, exc)

    # -- internals ---------------------------------------------------------------------------------------
    def _loop(self, stop: threading.Event) -> None:
        while not stop.wait(self._config.interval):
            self._push(stop)

    def _stop_thread(self) -> None:
        with self._state_lock:
            thread, stop = self._thread, self._stop
            self._thread = self._stop = None
        if stop is not None:
            stop.set()
        if thread is not None and thread is not threading.current_thread():
            # A push in flight can take a connect and a read timeout; beyond that, stop waiting for it.
            thread.join(2 * self._config.timeout + 1.0)

    def _push(self, stop: threading.Event | None = None) -> None:
        # Bounded: a periodic push stuck past its timeouts must not hold the final push (or training) for long.
        if not self._push_lock.acquire(timeout=2 * self._config.timeout + 1.0):
            self._on_error(COMPONENT, TimeoutError("an earlier push to the Pushgateway is still running"))
            return
        try:
            if stop is not None and stop.is_set():
                return  # the run ended while this periodic push waited: the final push has the newer state
            push_to_gateway(
                str(self._config.url),
                job=self._config.job,
                registry=self._registry,
                grouping_key=self._grouping_key,
                timeout=self._config.timeout,
            )
        except Exception as exc:
            self._on_error(COMPONENT, exc)
        finally:
            self._push_lock.release()


def build(context: PartContext) -> list[Sink]:
    """Pushes to the Pushgateway at pushgateway.url; none without a URL."""
    config = context.config
    return [PushgatewaySink(context.store, config.pushgateway, context.on_error)] if config.pushgateway.url else []


PART = BackendEntry("pushgateway", build, selectable=False, order=80)
