"""The host reader: CPU temperature where the kernel has a sensor, CPU utilisation and memory, through psutil.

The one reader that runs on every machine, CPU-only ones included. Temperature is the hottest CPU package or core
sensor psutil finds (`coretemp`, `k10temp`, `cpu_thermal` ...); a machine or container without one shows no
temperature series, never a 0.
"""

from __future__ import annotations

from typing import Any

from ms_exporter.core.hardware import HOST, DeviceIdentity, DeviceReading, HardwareReader
# psutil.sensors_temperatures() groups by driver; these are CPU sensors (x86 Intel/AMD, ARM SoCs, ACPI zones).
CPU_SENSORS = ("coretemp", "k10temp", "zenpower", "cpu_thermal", "cpu-thermal", "acpitz")


class HostReader(HardwareReader):
    name = "host"

    def __init__(self) -> None:
        import psutil

        self._psutil = psutil
        psutil.cpu_percent(None)  # the first call starts the interval the next one measures

    def devices(self) -> list[DeviceIdentity]:
        return [DeviceIdentity(HOST)]

    def read(self) -> list[DeviceReading]:
        psutil = self._psutil
        memory = psutil.virtual_memory()
        return [
            DeviceReading(
                HOST,
                temperature_celsius=self._cpu_temperature(),
                utilization_ratio=psutil.cpu_percent(None) / 100.0,
                memory_used_bytes=float(memory.total - memory.available),
                memory_total_bytes=float(memory.total),
            )
        ]

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
