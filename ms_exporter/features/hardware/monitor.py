"""The hardware monitor: every `hardware.interval` seconds each reader reads its devices on a thread of its own.

No reader is ever called on the step path, and nobody waits on one: the monitor's thread only asks a reader's
thread for a reading. A reader still busy past `hardware.timeout` is counted once (`TimeoutError` under
`component="hardware.<reader>"`) and asked again only when it has returned, so an interface that hangs for good
costs one parked daemon thread and no more. A reader that raises, or returns what is not a list of readings, is
counted the same way; three failures in a row switch it off (`mindspore_exporter_component_disabled`).
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
from ms_exporter.core.errors import Breaker
from ms_exporter.core.hardware import DeviceIdentity, DeviceReading, HardwareReader
from ms_exporter.core.part import ThreadPart
from ms_exporter.core.periodic import PeriodicThread
from ms_exporter.core.store import MetricStore

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
    """The rank's side of the join: its host as dcgm-exporter's `Hostname` (the Downward API's NODE_NAME inside a
    pod, whose own host name is the pod's), and its pod where Kubernetes says. The pod's labels only with POD_NAME
    set: outside a pod, a stray CONTAINER_NAME (some container runtimes set one) names nothing a device exporter
    labels."""
    env = os.environ if environ is None else environ
    host = {"Hostname": env.get("NODE_NAME") or node}
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
        self._identity = identity or {}  # the rank's own join labels (Hostname, pod, namespace, container)
        self._families = {name: store.register(family) for name, family in _GAUGES}
        self._throttled = store.register(c.DEVICE_THROTTLED)
        self._pcie = store.register(c.DEVICE_PCIE)
        self._info = store.register(c.DEVICE_INFO)
        self._reasons: dict[str, set[str]] = {}
        self._readers = [_ReaderThread(reader, self) for reader in readers]
        self._tick = 0
        self._thread = PeriodicThread("ms_exporter-hardware", interval, self.sample, first_at_once=True)

    @property
    def readers(self) -> list[HardwareReader]:
        return [worker.reader for worker in self._readers]

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._thread.stop()

    def close(self) -> None:
        self._thread.stop()
        for worker in self._readers:
            worker.close()

    def sample(self) -> None:
        """One round: ask every reader that is not busy or switched off; count the ones busy past the timeout."""
        self._tick += 1
        now = time.monotonic()
        for worker in self._readers:
            if component(worker.reader) in self._breaker.disabled:
                continue
            began = worker.busy_since
            if began is None:
                worker.request(self._tick)
            elif now - began > self._timeout and not worker.overdue_counted:
                worker.overdue_counted = True
                self.failed(
                    worker.reader,
                    TimeoutError(f"{component(worker.reader)} did not answer within {self._timeout:g} s"),
                    self._tick,
                )

    # -- called on a reader's thread ---------------------------------------------------------------------------
    def failed(self, reader: HardwareReader, exc: BaseException, index: int) -> None:
        self._breaker.failed(component(reader), exc, index, "the other readers and the training go on")

    def identify(self, identities: Any) -> None:
        for identity in _checked(identities, DeviceIdentity):
            labels = {name: str(value) for name, value in identity.labels.items() if name in c.DEVICE_INFO.labels}
            self._info.series(
                **{**dict.fromkeys(c.DEVICE_INFO.labels, ""), **self._identity, **labels, "device": identity.device}
            ).value = 1.0

    def record(self, readings: Any) -> None:
        for reading in _checked(readings, DeviceReading):
            device = reading.device
            for name, family in self._families.items():
                value = getattr(reading, name)
                if value is not None:
                    family.series(device=device).value = _number(value)
            if reading.throttle_reasons is not None:  # every reason seen stays a series: 1 while it holds, then 0
                active = set(reading.throttle_reasons)
                seen = self._reasons.setdefault(device, set())
                seen |= active
                for reason in sorted(seen):
                    self._throttled.series(device=device, reason=reason).value = 1.0 if reason in active else 0.0
            for direction, value in (
                ("rx", reading.pcie_rx_bytes_per_second),
                ("tx", reading.pcie_tx_bytes_per_second),
            ):
                if value is not None:
                    self._pcie.series(device=device, direction=direction).value = _number(value)


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
    """One reader's own daemon thread: waits for a request, reads, records. `busy_since` is set while it reads."""

    def __init__(self, reader: HardwareReader, monitor: HardwareMonitor) -> None:
        self.reader = reader
        self.busy_since: float | None = None
        self.overdue_counted = False
        self._monitor = monitor
        self._identified = False
        self._index = 0
        self._wake = threading.Event()
        self._closed = False
        self._thread: threading.Thread | None = None

    def request(self, index: int) -> None:
        self._index = index
        self.busy_since = time.monotonic()
        self.overdue_counted = False
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name=f"ms_exporter-{component(self.reader)}", daemon=True)
            self._thread.start()
        self._wake.set()

    def close(self) -> None:
        self._closed = True
        self._wake.set()
        if self.busy_since is None:  # a reader stuck in its interface keeps it: never waited for
            try:
                self.reader.close()
            except Exception as exc:
                self._monitor.failed(self.reader, exc, self._index)

    def _run(self) -> None:
        while True:
            self._wake.wait()
            self._wake.clear()
            if self._closed:
                return
            try:
                if not self._identified:
                    self._monitor.identify(self.reader.devices())
                    self._identified = True
                self._monitor.record(self.reader.read())
            except Exception as exc:
                self._monitor.failed(self.reader, exc, self._index)
            finally:
                self.busy_since = None
