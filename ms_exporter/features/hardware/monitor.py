"""The hardware monitor: every `hardware.interval` seconds each reader reads its devices on a thread of its own.

No reader is ever called on the step path, and nobody waits on one: the monitor's thread only asks a reader's
thread for a reading. A reader still busy past `hardware.timeout` is counted (`TimeoutError` under
`component="hardware.<reader>"`), once more for every further `hardware.timeout` it stays busy, and asked again
only when it has returned, so an interface that hangs for good costs one parked daemon thread and no more. A reader
that raises, or returns what is not a list of readings, is counted the same way. "In a row" counts a reader's own
readings (asked or overdue), not the monitor's ticks: three failures in a row switch it off
(`mindspore_exporter_component_disabled`), and its readings leave the page with it, so that a frozen value is never
shown as current and the device exporters' live readings take its place in the recording rules. Its
`mindspore_train_device_info` stays: the device is still this rank's, and the rules join the exporters through it.

Closing a reader (NVML's nvmlShutdown) runs on the reader's own thread too, waited for `hardware.timeout` at most:
a driver that hangs there is left to that daemon thread, and the process still exits.
"""

from __future__ import annotations

import logging
import math
import os
import threading
import time
from collections.abc import Mapping, Sequence
from typing import Any

from ms_exporter.core import catalogue as c
from ms_exporter.core.device.reading import DeviceIdentity, DeviceReading, HardwareReader
from ms_exporter.core.errors import Breaker
from ms_exporter.core.part import ThreadPart
from ms_exporter.core.periodic import PeriodicThread
from ms_exporter.core.store import Family, Labels, MetricStore

logger = logging.getLogger("ms_exporter")

# DeviceReading field -> the family it is written to (numbers as they are; booleans as 1 and 0).
_GAUGES = (
    ("temperature_celsius", c.DEVICE_TEMPERATURE),
    ("power_watts", c.DEVICE_POWER),
    ("power_limit_watts", c.DEVICE_POWER_LIMIT),
    ("utilization_ratio", c.DEVICE_UTILIZATION),
    ("memory_utilization_ratio", c.DEVICE_MEMORY_UTILIZATION),
    ("memory_used_bytes", c.DEVICE_MEMORY_USED),
    ("memory_total_bytes", c.DEVICE_MEMORY_TOTAL),
    ("clock_hertz", c.DEVICE_CLOCK),
    ("ecc_uncorrected_errors", c.DEVICE_ECC_UNCORRECTED),
    ("link_up", c.DEVICE_LINK_UP),
    ("healthy", c.DEVICE_HEALTHY),
)


# The Downward API variables the shipped Kubernetes manifests set (deploy/kubernetes/example/training-job.yaml):
# the pod's own names, as dcgm-exporter labels a GPU's pod in Kubernetes mode.
POD_ENVIRONMENT = (("pod", "POD_NAME"), ("namespace", "POD_NAMESPACE"), ("container", "CONTAINER_NAME"))


def join_labels(node: str, environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """The rank's side of the join: its host (`hostname`, dcgm-exporter's `Hostname`: the Downward API's NODE_NAME
    inside a pod, whose own host name is the pod's), and its pod where Kubernetes says. The pod's labels only with
    POD_NAME set: outside a pod, a stray CONTAINER_NAME (some container runtimes set one) names nothing a device
    exporter labels."""
    env = os.environ if environ is None else environ
    host = {"hostname": env.get("NODE_NAME") or node}
    if not env.get("POD_NAME"):
        return host
    return {**host, **{label: env[name] for label, name in POD_ENVIRONMENT if env.get(name)}}


def component(reader: HardwareReader) -> str:
    return f"hardware.{reader.name}"


class HardwareMonitor(ThreadPart):
    """A part like the memory sampler: started at train begin, stopped at train end and close."""

    name = "hardware"

    def __init__(
        self,
        readers: Sequence[HardwareReader],
        store: MetricStore,
        interval: float,
        timeout: float,
        breaker: Breaker,
        identity: dict[str, str] | None = None,
    ) -> None:
        self._store = store
        self._timeout = timeout
        self._breaker = breaker
        self._identity = identity or {}  # the rank's own join labels (hostname, pod, namespace, container)
        self._families = {name: store.register(family) for name, family in _GAUGES}
        self._lock = threading.Lock()  # orders a reader's recording against the removal of its series
        self._throttled = store.register(c.DEVICE_THROTTLED)
        self._pcie = store.register(c.DEVICE_PCIE)
        self._info = store.register(c.DEVICE_INFO)
        self._reasons: dict[str, set[str]] = {}
        self._readers = [_ReaderThread(reader, self) for reader in readers]
        self._closed = False
        self._thread = PeriodicThread("ms_exporter-hardware", interval, self.sample, first_at_once=True)

    @property
    def readers(self) -> list[HardwareReader]:
        return [worker.reader for worker in self._readers]

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._thread.stop()

    def close(self) -> None:
        """Stops sampling and closes every reader on its own thread, waiting `timeout` seconds in all at most."""
        self._thread.stop()
        if self._closed:
            return
        self._closed = True
        for worker in self._readers:
            worker.close()
        deadline = time.monotonic() + self._timeout
        for worker in self._readers:
            if not worker.closed.wait(max(deadline - time.monotonic(), 0.0)):
                logger.warning(
                    "ms_exporter: %s did not close within %g s; left to its daemon thread",
                    component(worker.reader),
                    self._timeout,
                )

    def sample(self) -> None:
        """One round: ask every reader that is not busy or switched off; count the ones busy past the timeout, once
        per `timeout` they stay busy (each is one reading that did not come)."""
        now = time.monotonic()
        for worker in self._readers:
            if self.disabled(worker.reader):
                continue
            if worker.busy_since is None:
                worker.request()
                continue
            attempt = worker.late(now, self._timeout)
            if attempt is not None:
                self.failed(
                    worker.reader,
                    TimeoutError(f"{component(worker.reader)} did not answer within {self._timeout:g} s"),
                    attempt,
                    worker,
                )

    def disabled(self, reader: HardwareReader) -> bool:
        return component(reader) in self._breaker.disabled

    # -- called on a reader's thread ---------------------------------------------------------------------------
    def failed(self, reader: HardwareReader, exc: BaseException, index: int, worker: _ReaderThread | None) -> None:
        """Count a failed reading (`index`: the reader's own count of readings); the one that switches the reader
        off takes its readings off the page."""
        then = "its readings leave the page; the training goes on"
        if self._breaker.failed(component(reader), exc, index, then) and worker is not None:
            self._forget(worker)

    def _forget(self, worker: _ReaderThread) -> None:
        with self._lock:
            for family, labels in worker.written:
                family.remove(**dict(labels))
            worker.written.clear()

    def identify(self, identities: Any) -> None:
        for identity in _checked(identities, DeviceIdentity):
            labels = {name: str(value) for name, value in identity.labels.items() if name in c.DEVICE_INFO.labels}
            self._info.series(
                **{**dict.fromkeys(c.DEVICE_INFO.labels, ""), **self._identity, **labels, "device": identity.device}
            ).value = 1.0

    def record(self, readings: Any, worker: _ReaderThread) -> None:
        """Writes the readings, unless the reader was switched off while it read (its series are gone for good)."""
        values = self._values(_checked(readings, DeviceReading))
        with self._lock:
            if self.disabled(worker.reader):
                return
            for family, labels, value in values:
                family.series(**dict(labels)).value = value
                worker.written.add((family, labels))

    def _values(self, readings: list[DeviceReading]) -> list[tuple[Family, Labels, float]]:
        values: list[tuple[Family, Labels, float]] = []
        for reading in readings:
            device = reading.device
            for name, family in self._families.items():
                value = getattr(reading, name)
                if value is not None:
                    values.append((family, (("device", device),), _number(value)))
            if reading.throttle_reasons is not None:  # every reason seen stays a series: 1 while it holds, then 0
                active = set(reading.throttle_reasons)
                seen = self._reasons.setdefault(device, set())
                seen |= active
                for reason in sorted(seen):
                    labels = (("device", device), ("reason", reason))
                    values.append((self._throttled, labels, 1.0 if reason in active else 0.0))
            for direction, value in (
                ("rx", reading.pcie_rx_bytes_per_second),
                ("tx", reading.pcie_tx_bytes_per_second),
            ):
                if value is not None:
                    values.append((self._pcie, (("device", device), ("direction", direction)), _number(value)))
        return values


def _checked(items: Any, kind: type) -> list[Any]:
    if not isinstance(items, (list, tuple)) or not all(isinstance(item, kind) for item in items):
        raise TypeError(f"a hardware reader returned {type(items).__name__}, not a list of {kind.__name__}")
    return list(items)


def _number(value: Any) -> float:
    number = float(value)  # a bool is 1.0 or 0.0
    if math.isnan(number):
        raise ValueError("a hardware reader returned NaN")
    return number


class _ReaderThread:
    """One reader's own daemon thread: waits for a request, reads, records; at close, closes the reader. `busy_since`
    is set while it reads. `attempt` counts the reader's readings, asked or overdue: the breaker's "in a row"."""

    def __init__(self, reader: HardwareReader, monitor: HardwareMonitor) -> None:
        self.reader = reader
        self.busy_since: float | None = None
        self.attempt = 0
        self.overdue = 0  # timeouts counted for the reading under way
        self.written: set[tuple[Family, Labels]] = set()  # what its readings wrote
        self.closed = threading.Event()  # set once the reader's close() has returned
        self._monitor = monitor
        self._identified = False
        self._wake = threading.Event()
        self._closing = False
        self._lock = threading.Lock()  # orders a request against close (both on the monitor's side)
        self._thread: threading.Thread | None = None

    def request(self) -> None:
        with self._lock:
            if self._closing:
                return
            self.attempt += 1
            self.overdue = 0
            self.busy_since = time.monotonic()
            self._started()
            self._wake.set()

    def late(self, now: float, timeout: float) -> int | None:
        """The attempt index to count one more timeout of the reading under way at (the first is that reading's
        own, each later one the reading that did not come meanwhile); None while it is not due or not reading."""
        with self._lock:
            began = self.busy_since
            if began is None or now - began <= timeout * (self.overdue + 1):
                return None
            if self.overdue:
                self.attempt += 1
            self.overdue += 1
            return self.attempt

    def close(self) -> None:
        """Asks the reader's thread to close the reader once it is not reading; never waits here."""
        with self._lock:
            if self._closing:
                return
            self._closing = True
            self._started()
            self._wake.set()

    def _started(self) -> None:
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name=f"ms_exporter-{component(self.reader)}", daemon=True)
            self._thread.start()

    def _run(self) -> None:
        while True:
            self._wake.wait()
            self._wake.clear()
            if self.busy_since is not None:
                self._read(self.attempt)
            if self._closing:
                self._close()
                return

    def _read(self, attempt: int) -> None:
        error: Exception | None = None
        try:
            if not self._identified:
                self._monitor.identify(self.reader.devices())
                self._identified = True
            self._monitor.record(self.reader.read(), self)
        except Exception as exc:
            error = exc
        finally:
            with self._lock:
                counted = self.overdue > 0  # a reading counted late already is not counted twice
                self.busy_since = None
        if error is not None and not counted:
            self._monitor.failed(self.reader, error, attempt, self)

    def _close(self) -> None:
        try:
            self.reader.close()
        except Exception as exc:
            self._monitor.failed(self.reader, exc, self.attempt + 1, None)
        finally:
            self.closed.set()
