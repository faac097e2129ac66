"""The hardware monitor: readers run on their own threads; one that raises, hangs or returns garbage is counted
and costs nobody a wait; readings land in the store under the device families; the host reader reads psutil;
the `hardware` section and the strategy-container article's `enable_hardware_monitor` switch it."""

from __future__ import annotations

import threading
import time
from types import SimpleNamespace
from typing import Any

import pytest

from ms_exporter.config import ConfigError, load_config
from ms_exporter.core import catalogue as c
from ms_exporter.core.device.reading import DeviceIdentity, DeviceReading, HardwareReader
from ms_exporter.core.errors import Breaker, ErrorSink
from ms_exporter.core.store import MetricStore
from ms_exporter.features.hardware import host
from ms_exporter.features.hardware.monitor import HardwareMonitor, join_labels
from tests.support.waiting import wait_until


class ScriptedReader(HardwareReader):
    """Answers with `readings`, or raises, hangs until released, or returns garbage, as told."""

    name = "scripted"

    def __init__(self, readings: list[DeviceReading]) -> None:
        self.readings = readings
        self.mode = "ok"
        self.release = threading.Event()
        self.calls = 0

    def devices(self) -> list[DeviceIdentity]:
        return [DeviceIdentity("gpu0", {"gpu": "0", "uuid": "GPU-1234", "model_name": "Test GPU"})]

    def read(self) -> Any:
        self.calls += 1
        if self.mode == "raise":
            raise RuntimeError("the driver went away")
        if self.mode == "hang":
            self.release.wait(30)
        if self.mode == "garbage":
            return {"not": "a list"}
        return self.readings


def _monitor(reader: HardwareReader, timeout: float = 0.2) -> tuple[HardwareMonitor, MetricStore, ErrorSink]:
    store = MetricStore((("rank", "3"), ("project", "p")))
    errors = ErrorSink(store)
    monitor = HardwareMonitor([reader], store, 3600, timeout, Breaker(errors, store), join_labels("node-a", {}))
    return monitor, store, errors


def _values(store: MetricStore, family: c.MetricFamily) -> dict[tuple[tuple[str, str], ...], float]:
    return {series.labels: series.value for series in store.series_of(family)}


def _errors(store: MetricStore, component: str) -> float:
    return {dict(s.labels)["component"]: s.value for s in store.series_of(c.ERRORS)}.get(component, 0.0)


HOT = DeviceReading(
    "gpu0",
    temperature_celsius=91.0,
    power_watts=350.5,
    utilization_ratio=0.97,
    throttle_reasons=("hw_thermal_slowdown",),
    ecc_uncorrected_errors=2,
    pcie_rx_bytes_per_second=1e9,
    link_up=True,
)


def _wait_idle(monitor: HardwareMonitor) -> None:
    wait_until(lambda: all(worker.busy_since is None for worker in monitor._readers), 10, "the reader's answer")


def test_readings_land_in_the_device_families_with_the_join_labels() -> None:
    reader = ScriptedReader([HOT])
    monitor, store, _ = _monitor(reader)
    try:
        monitor.sample()
        _wait_idle(monitor)
    finally:
        monitor.close()
    assert _values(store, c.DEVICE_TEMPERATURE) == {(("device", "gpu0"),): 91.0}
    assert _values(store, c.DEVICE_POWER) == {(("device", "gpu0"),): 350.5}
    assert _values(store, c.DEVICE_THROTTLED) == {(("device", "gpu0"), ("reason", "hw_thermal_slowdown")): 1.0}
    assert _values(store, c.DEVICE_ECC_UNCORRECTED) == {(("device", "gpu0"),): 2.0}
    assert _values(store, c.DEVICE_LINK_UP) == {(("device", "gpu0"),): 1.0}
    assert _values(store, c.DEVICE_PCIE) == {(("device", "gpu0"), ("direction", "rx")): 1e9}
    assert store.series_of(c.DEVICE_POWER_LIMIT) == ()  # not reported: no series, never a 0
    [info] = store.series_of(c.DEVICE_INFO)
    labels = dict(info.labels)
    assert (labels["device"], labels["gpu"], labels["uuid"], labels["hostname"]) == ("gpu0", "0", "GPU-1234", "node-a")
    assert labels["id"] == "" and info.value == 1.0  # npu-exporter's labels: empty on a GPU


def test_a_throttle_reason_that_clears_stays_a_series_at_zero() -> None:
    reader = ScriptedReader([HOT])
    monitor, store, _ = _monitor(reader)
    try:
        monitor.sample()
        _wait_idle(monitor)
        reader.readings = [DeviceReading("gpu0", throttle_reasons=())]
        monitor.sample()
        _wait_idle(monitor)
    finally:
        monitor.close()
    assert _values(store, c.DEVICE_THROTTLED) == {(("device", "gpu0"), ("reason", "hw_thermal_slowdown")): 0.0}


@pytest.mark.parametrize("mode", ["raise", "garbage"])
def test_a_reader_that_fails_is_counted_switched_off_after_three_and_never_raises(mode: str) -> None:
    reader = ScriptedReader([HOT])
    reader.mode = mode
    monitor, store, _ = _monitor(reader)
    try:
        for _ in range(5):
            monitor.sample()  # returns at once: the reader answers on its own thread
            _wait_idle(monitor)
    finally:
        monitor.close()
    assert _errors(store, "hardware.scripted") == 3
    assert reader.calls == 3  # switched off: not asked again
    assert {dict(s.labels)["component"] for s in store.series_of(c.COMPONENT_DISABLED)} == {"hardware.scripted"}


def _disabled(store: MetricStore) -> set[str]:
    return {dict(s.labels)["component"] for s in store.series_of(c.COMPONENT_DISABLED)}


def test_a_reader_that_hangs_for_good_is_switched_off_after_three_timeouts_and_costs_the_caller_nothing() -> None:
    reader = ScriptedReader([HOT])
    monitor, store, _ = _monitor(reader, timeout=0.2)
    try:
        monitor.sample()
        _wait_idle(monitor)
        reader.mode = "hang"
        slowest = 0.0

        def sample() -> set[str]:
            nonlocal slowest
            began = time.monotonic()
            monitor.sample()
            slowest = max(slowest, time.monotonic() - began)
            return _disabled(store)

        wait_until(sample, 20, "the hung reader to be switched off", every=0.05)
        assert slowest < 1.0  # sample() never waited on the reader
        assert _errors(store, "hardware.scripted") == 3  # one per timeout it stayed busy
        assert reader.calls == 2  # not asked again while it hangs
        reader.mode = "ok"
        reader.release.set()  # it answers at last, after it was switched off
        _wait_idle(monitor)
        monitor.sample()
    finally:
        monitor.close()
    assert reader.calls == 2
    assert _values(store, c.DEVICE_TEMPERATURE) == {}  # its late answer does not bring its readings back
    assert len(store.series_of(c.DEVICE_INFO)) == 1  # the device is still the rank's: the rules join through it


def test_a_reader_late_once_is_counted_and_asked_again_when_it_answers() -> None:
    reader = ScriptedReader([HOT])
    reader.mode = "hang"
    monitor, store, _ = _monitor(reader, timeout=1.0)
    try:
        monitor.sample()
        wait_until(lambda: (monitor.sample(), _errors(store, "hardware.scripted"))[1], 20, "the late reading counted")
        reader.mode = "ok"
        reader.release.set()
        _wait_idle(monitor)
        monitor.sample()
        _wait_idle(monitor)
    finally:
        monitor.close()
    assert reader.calls == 2
    assert _disabled(store) == set()
    assert _values(store, c.DEVICE_TEMPERATURE) == {(("device", "gpu0"),): 91.0}


@pytest.mark.parametrize("mode", ["raise", "garbage", "hang"])
def test_a_switched_off_readers_last_values_leave_the_page(mode: str) -> None:
    reader = ScriptedReader([HOT])
    monitor, store, _ = _monitor(reader, timeout=0.2)
    try:
        monitor.sample()
        _wait_idle(monitor)
        assert _values(store, c.DEVICE_TEMPERATURE) == {(("device", "gpu0"),): 91.0}
        reader.mode = mode
        wait_until(lambda: (monitor.sample(), _disabled(store))[1], 20, "the reader to be switched off", every=0.05)
    finally:
        reader.release.set()
        monitor.close()
    for family in (c.DEVICE_TEMPERATURE, c.DEVICE_POWER, c.DEVICE_LINK_UP, c.DEVICE_THROTTLED, c.DEVICE_PCIE):
        assert store.series_of(family) == (), family.name  # no frozen 91 C, no frozen link_up 1
    assert len(store.series_of(c.DEVICE_INFO)) == 1


class _SickShutdown(ScriptedReader):
    """A reader whose close() hangs, as nvmlShutdown on a sick GPU; it says which thread closed it."""

    def __init__(self) -> None:
        super().__init__([HOT])
        self.closed_on: str | None = None

    def close(self) -> None:
        self.closed_on = threading.current_thread().name
        self.release.wait(30)


def test_close_gives_up_on_a_reader_whose_close_hangs_after_the_timeout() -> None:
    reader = _SickShutdown()
    monitor, _, _ = _monitor(reader, timeout=0.5)
    monitor.sample()
    _wait_idle(monitor)
    began = time.monotonic()
    try:
        monitor.close()
        took = time.monotonic() - began
    finally:
        reader.release.set()
    assert took < 10  # bounded by hardware.timeout, not by the driver
    assert reader.closed_on == "ms_exporter-hardware.scripted"  # on the reader's thread, never the caller's


class _Temperature(SimpleNamespace):
    pass


def test_the_host_reader_reads_psutil(monkeypatch: pytest.MonkeyPatch) -> None:
    import psutil

    sensors = {"coretemp": [_Temperature(current=48.0), _Temperature(current=61.5)], "nvme": [_Temperature(current=90)]}
    monkeypatch.setattr(psutil, "sensors_temperatures", lambda: sensors, raising=False)
    waits: list[float | None] = []
    monkeypatch.setattr(psutil, "cpu_percent", lambda interval=None: waits.append(interval) or 25.0)
    clock = [100.0]
    monkeypatch.setattr(host.time, "monotonic", lambda: clock[0])
    reader = host.HostReader()
    assert reader.read()[0].utilization_ratio == 0.25
    assert waits == [None, host.MIN_CPU_INTERVAL_SECONDS]  # right after the priming call: measured over a wait
    clock[0] += 10
    [reading] = reader.read()
    assert waits[-1] is None  # ten seconds since the last reading: over those
    assert reading.device == "host"
    assert reading.temperature_celsius == 61.5  # the hottest CPU sensor; the NVMe drive is no CPU
    assert reading.utilization_ratio == 0.25
    assert reading.memory_total_bytes == psutil.virtual_memory().total
    monkeypatch.setattr(psutil, "sensors_temperatures", lambda: {}, raising=False)
    assert host.HostReader().read()[0].temperature_celsius is None  # no sensor (a container): no temperature


def test_join_labels_come_from_the_node_and_the_downward_api() -> None:
    assert join_labels("node-a", {}) == {"hostname": "node-a"}
    environ = {"POD_NAME": "job-0", "POD_NAMESPACE": "training", "CONTAINER_NAME": "trainer"}
    assert join_labels("node-a", environ) == {
        "hostname": "node-a",
        "pod": "job-0",
        "namespace": "training",
        "container": "trainer",
    }
    assert join_labels("node-a", {"CONTAINER_NAME": "set by a runtime"}) == {"hostname": "node-a"}  # not a pod
    assert join_labels("job-0", {**environ, "NODE_NAME": "gpu-node-7"})["hostname"] == "gpu-node-7"


def test_the_hardware_section_and_the_articles_switch() -> None:
    config = load_config({})
    assert config.hardware.enable and config.hardware.readers == ("nvml", "npu_smi", "host")
    assert load_config({"enable_hardware_monitor": False}).hardware.enable is False
    assert load_config({"hardware": {"readers": ["host"], "interval": 30}}).hardware.interval == 30
    with pytest.raises(ConfigError, match=r"hardware\.readers: unknown name\(s\) 'nvidia'"):
        load_config({"hardware": {"readers": ["nvidia"]}})
    with pytest.raises(ConfigError, match=r"monitor_config\.enable_hardware_monitor, read as hardware\.enable"):
        load_config({"enable_hardware_monitor": "yes please"})
