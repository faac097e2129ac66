"""The host reader: CPU temperature where the kernel has a sensor, CPU utilisation and memory, through psutil.

The one reader that runs on every machine, CPU-only ones included. Temperature is the hottest CPU package or core
sensor psutil finds (`coretemp`, `k10temp`, `cpu_thermal` ...); a machine or container without one shows no
temperature series, never a 0.
"""

from __future__ import annotations

import time
from typing import Any

from ms_exporter.core.device.reading import HOST, DeviceIdentity, DeviceReading, HardwareReader
from ms_exporter.core.registry import ReaderEntry

# psutil's CPU share is over the time since its previous call: shorter than this, it says nothing (it answers 0.0),
# so a reading that soon measures over this long instead.
MIN_CPU_INTERVAL_SECONDS = 0.1
# psutil.sensors_temperatures() groups by driver; these are CPU sensors (x86 Intel/AMD, ARM SoCs, ACPI zones).
CPU_SENSORS = ("coretemp", "k10temp", "zenpower", "cpu_thermal", "cpu-thermal", "acpitz")


class HostReader(HardwareReader):
    name = "host"

    def __init__(self) -> None:
        import psutil

        self._psutil = psutil
        psutil.cpu_percent(None)  # the first call starts the interval the next one measures
        self._cpu_since = time.monotonic()

    def devices(self) -> list[DeviceIdentity]:
        return [DeviceIdentity(HOST)]

    def read(self) -> list[DeviceReading]:
        psutil = self._psutil
        memory = psutil.virtual_memory()
        return [
            DeviceReading(
                HOST,
                temperature_celsius=self._cpu_temperature(),
                utilization_ratio=self._cpu_share(),
                memory_used_bytes=float(memory.total - memory.available),
                memory_total_bytes=float(memory.total),
            )
        ]

    def _cpu_share(self) -> float:
        """The CPUs' busy share since the last reading. Right after the reader was built (the first reading comes as
        training begins) that interval is too short to mean anything (psutil answers 0.0): then the share is
        measured over MIN_CPU_INTERVAL_SECONDS, a wait on this reader's own thread, never the step's."""
        now = time.monotonic()
        if now - self._cpu_since < MIN_CPU_INTERVAL_SECONDS:
            share = self._psutil.cpu_percent(MIN_CPU_INTERVAL_SECONDS)
        else:
            share = self._psutil.cpu_percent(None)
        self._cpu_since = time.monotonic()
        return share / 100.0

    def _cpu_temperature(self) -> float | None:
        read = getattr(self._psutil, "sensors_temperatures", None)  # Linux and FreeBSD only
        if read is None:
            return None
        sensors = read() or {}
        readings = [entry.current for name in CPU_SENSORS for entry in sensors.get(name, ()) if entry.current]
        return float(max(readings)) if readings else None


def build(section: Any) -> list[HardwareReader]:
    """The host is always there: one reader."""
    return [HostReader()]


PART = ReaderEntry("host", build, order=30)
