"""The NVIDIA reader: the GPUs this rank uses, through NVML (the `nvidia-ml-py` binding, imported as `pynvml`).

Which GPUs: those CUDA_VISIBLE_DEVICES lists (indices or UUIDs, read the way CUDA reads them: up to the first entry
that names no GPU) when it is set, else every GPU NVML sees; of those, only the one at DEVICE_ID when that is set and
in range, since MindSpore's device id counts the GPUs the process can see, as CUDA's ordinals do. A GPU is named
`gpu<N>` with N its NVML index, the number dcgm-exporter puts in its `gpu` label.

NVML's units become base units here: milliwatts -> watts, percent -> ratio, MHz -> hertz, KB/s -> bytes/s. A
quantity the device does not support (NVMLError_NotSupported), or that neither the binding nor the driver has, is
None: no series, never a 0. NVML is initialised in build() and shut down in close(), never on import.
"""

from __future__ import annotations

import contextlib
import importlib
import logging
import os
import threading
from collections.abc import Mapping, Sequence
from typing import Any

from ms_exporter.core.device.reading import DeviceIdentity, DeviceReading, HardwareReader
from ms_exporter.core.registry import ReaderEntry

logger = logging.getLogger("ms_exporter")

WATTS_PER_MILLIWATT = 1e-3
RATIO_PER_PERCENT = 1e-2
HERTZ_PER_MEGAHERTZ = 1e6
BYTES_PER_KILOBYTE = 1024.0  # NVML writes only "KB/s" for PCIe; read as kibibytes, as nvitop does

# The clock event (throttle) reason bits of nvml.h (nvmlClocksThrottleReason<Name>), named in lower case. A bit not
# listed here is named by its hex value, so a reason a newer driver adds still shows.
THROTTLE_REASONS: tuple[tuple[int, str], ...] = (
    (0x001, "gpu_idle"),
    (0x002, "applications_clocks_setting"),
    (0x004, "sw_power_cap"),
    (0x008, "hw_slowdown"),
    (0x010, "sync_boost"),
    (0x020, "sw_thermal_slowdown"),
    (0x040, "hw_thermal_slowdown"),
    (0x080, "hw_power_brake_slowdown"),
    (0x100, "display_clock_setting"),
    (0x200, "board_limit"),
    (0x400, "reliability"),
)
_KNOWN_REASONS = sum(bit for bit, _ in THROTTLE_REASONS)  # distinct bits: their sum is their union

# Newest first: NVML deprecated the second name of each pair; a binding or driver without the first uses the next.
TEMPERATURE_CALLS = ("nvmlDeviceGetTemperatureV", "nvmlDeviceGetTemperature")
REASON_CALLS = ("nvmlDeviceGetCurrentClocksEventReasons", "nvmlDeviceGetCurrentClocksThrottleReasons")
# What an older driver answers for a function (or struct version) it lacks: use the older variant from then on.
MISSING_ERRORS = ("NVMLError_FunctionNotFound", "NVMLError_ArgumentVersionMismatch")


class NvmlReader(HardwareReader):
    """Reads every GPU it was given on each call; an NVML error other than "not supported" is raised for the
    hardware monitor to count (a lost GPU, a driver gone)."""

    name = "nvml"

    def __init__(self, nvml: Any, gpus: Sequence[tuple[int, Any]]) -> None:
        self._nvml = nvml
        self._gpus = list(gpus)  # (NVML index, handle)
        self._missing: set[str] = set()  # functions this driver does not have
        self._missing_errors = tuple(
            error for error in (getattr(nvml, name, None) for name in MISSING_ERRORS) if error is not None
        )
        self._memory_v2 = getattr(nvml, "nvmlMemory_v2", None)  # None: the binding or the driver has v1 only
        self._closed = False
        self._lock = threading.Lock()

    def devices(self) -> list[DeviceIdentity]:
        return [DeviceIdentity(f"gpu{index}", self._labels(index, handle)) for index, handle in self._gpus]

    def read(self) -> list[DeviceReading]:
        return [self._reading(index, handle) for index, handle in self._gpus]

    def close(self) -> None:
        with self._lock:
            if self._closed:
                return
            self._closed = True
        self._nvml.nvmlShutdown()

    def _labels(self, index: int, handle: Any) -> dict[str, str]:
        pci = self._ask("nvmlDeviceGetPciInfo", handle)
        return {
            "gpu": str(index),
            "uuid": _text(self._ask("nvmlDeviceGetUUID", handle)),
            # NVML's busId format (NVML_DEVICE_PCI_BUS_ID_FMT), the one dcgm-exporter passes on: 00000000:1B:00.0
            "pci_bus_id": f"{pci.domain:08X}:{pci.bus:02X}:{pci.device:02X}.0" if pci is not None else "",
            "model_name": _text(self._ask("nvmlDeviceGetName", handle)),
        }

    def _reading(self, index: int, handle: Any) -> DeviceReading:
        nvml = self._nvml
        temperature = self._ask(TEMPERATURE_CALLS, handle, nvml.NVML_TEMPERATURE_GPU)
        rates = self._ask("nvmlDeviceGetUtilizationRates", handle)
        memory = self._memory(handle)
        clock = self._ask("nvmlDeviceGetClockInfo", handle, nvml.NVML_CLOCK_SM)
        mask = self._ask(REASON_CALLS, handle)
        # Volatile: the errors since the driver loaded, what this run can have caused or suffered; the aggregate
        # count spans the board's whole life.
        ecc = self._ask(
            "nvmlDeviceGetTotalEccErrors", handle, nvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED, nvml.NVML_VOLATILE_ECC
        )
        rx = self._ask("nvmlDeviceGetPcieThroughput", handle, nvml.NVML_PCIE_UTIL_RX_BYTES)
        tx = self._ask("nvmlDeviceGetPcieThroughput", handle, nvml.NVML_PCIE_UTIL_TX_BYTES)
        return DeviceReading(
            f"gpu{index}",
            temperature_celsius=_scaled(temperature, 1.0),
            power_watts=_scaled(self._ask("nvmlDeviceGetPowerUsage", handle), WATTS_PER_MILLIWATT),
            power_limit_watts=_scaled(self._ask("nvmlDeviceGetEnforcedPowerLimit", handle), WATTS_PER_MILLIWATT),
            utilization_ratio=_scaled(rates.gpu, RATIO_PER_PERCENT) if rates is not None else None,
            memory_utilization_ratio=_scaled(rates.memory, RATIO_PER_PERCENT) if rates is not None else None,
            memory_used_bytes=_scaled(memory.used, 1.0) if memory is not None else None,
            memory_total_bytes=_scaled(memory.total, 1.0) if memory is not None else None,
            clock_hertz=_scaled(clock, HERTZ_PER_MEGAHERTZ),
            throttle_reasons=reason_names(mask) if mask is not None else None,
            ecc_uncorrected_errors=_scaled(ecc, 1.0),
            pcie_rx_bytes_per_second=_scaled(rx, BYTES_PER_KILOBYTE),
            pcie_tx_bytes_per_second=_scaled(tx, BYTES_PER_KILOBYTE),
        )

    def _memory(self, handle: Any) -> Any:
        """v2 where the binding and the driver have it (it tells the driver's reserved memory apart), else v1."""
        nvml = self._nvml
        if self._memory_v2 is not None:
            try:
                return nvml.nvmlDeviceGetMemoryInfo(handle, version=self._memory_v2)
            except nvml.NVMLError_NotSupported:
                pass  # v1 may still answer for this device
            except self._missing_errors:
                self._memory_v2 = None
        return self._ask("nvmlDeviceGetMemoryInfo", handle)

    def _ask(self, functions: str | tuple[str, ...], *args: Any) -> Any:
        """The first of `functions` this binding and driver have, called with `args`; None when the device does
        not support the quantity or none of them exists."""
        for function in (functions,) if isinstance(functions, str) else functions:
            call = getattr(self._nvml, function, None)
            if call is None or function in self._missing:
                continue
            try:
                return call(*args)
            except self._nvml.NVMLError_NotSupported:
                continue  # an older variant may still answer for this device
            except self._missing_errors:
                self._missing.add(function)
        return None


def reason_names(mask: int) -> tuple[str, ...]:
    """The reasons a clock event mask holds, known bits by name in nvml.h's order, others in hex; () for 0."""
    unknown = mask & ~_KNOWN_REASONS
    return tuple(name for bit, name in THROTTLE_REASONS if mask & bit) + tuple(
        f"0x{1 << shift:x}" for shift in range(unknown.bit_length()) if unknown >> shift & 1
    )


def build(config: Any) -> list[HardwareReader]:
    """One reader for this rank's GPUs; [] when the binding is not installed, NVML does not start within
    `config.timeout` seconds (no driver, a driver that hangs), or this rank uses no GPU."""
    try:
        nvml = importlib.import_module("pynvml")
    except ImportError:
        return []
    gpus = _open_within(nvml, float(getattr(config, "timeout", 5.0)))
    return [NvmlReader(nvml, gpus)] if gpus else []


def selected_gpus(nvml: Any, environ: Mapping[str, str]) -> list[tuple[int, Any]]:
    """(NVML index, handle) of the GPUs this rank uses, in CUDA's order (module docstring)."""
    gpus = [(index, nvml.nvmlDeviceGetHandleByIndex(index)) for index in range(nvml.nvmlDeviceGetCount())]
    visible = environ.get("CUDA_VISIBLE_DEVICES")
    if visible is not None:
        gpus = _visible(nvml, gpus, visible)
    device_id = environ.get("DEVICE_ID", "").strip()
    if device_id.isdigit() and int(device_id) < len(gpus):
        return [gpus[int(device_id)]]
    return gpus


def _visible(nvml: Any, gpus: list[tuple[int, Any]], visible: str) -> list[tuple[int, Any]]:
    """The GPUs CUDA_VISIBLE_DEVICES names, in its order. As CUDA does, the list ends at the first entry that names
    no GPU (or one already named); a UUID entry may be a unique prefix (GPU-8932f937)."""
    by_index = dict(gpus)
    uuids: dict[int, str] | None = None
    chosen: list[tuple[int, Any]] = []
    for entry in (part.strip() for part in visible.split(",")):
        if entry.isdigit():
            matches = [int(entry)] if int(entry) in by_index else []
        else:
            if uuids is None:
                uuids = {index: _text(nvml.nvmlDeviceGetUUID(handle)) for index, handle in gpus}
            matches = [index for index, uuid in uuids.items() if entry and uuid.startswith(entry)]
        if len(matches) != 1 or any(index == matches[0] for index, _ in chosen):
            break
        chosen.append((matches[0], by_index[matches[0]]))
    return chosen


def _open_within(nvml: Any, timeout: float) -> list[tuple[int, Any]]:
    """nvmlInit and the device selection on a thread of their own, waited for `timeout` seconds: a broken driver can
    hang in nvmlInit, and build() runs where the training waits for it. [] (and a log line) when NVML does not
    start; an init that returns after build gave up is shut down again."""
    opening = _Opening()
    threading.Thread(target=opening.run, args=(nvml,), name="ms_exporter-nvml-init", daemon=True).start()
    opening.done.wait(timeout)
    with opening.lock:
        if not opening.done.is_set():
            opening.abandoned = True
            logger.warning("ms_exporter: NVML did not start within %g s; no GPU readings this run", timeout)
            return []
    if isinstance(opening.result, BaseException):
        logger.info("ms_exporter: NVML is not available (%s); no GPU readings this run", opening.result)
        return []
    return opening.result


class _Opening:
    """The outcome of one nvmlInit + device selection, handed from the opening thread to build()."""

    def __init__(self) -> None:
        self.lock = threading.Lock()  # orders "build gave up" against "the opener finished"
        self.done = threading.Event()
        self.abandoned = False
        self.result: list[tuple[int, Any]] | BaseException = []

    def run(self, nvml: Any) -> None:
        result: list[tuple[int, Any]] | BaseException
        started = False
        try:
            nvml.nvmlInit()
            started = True
            result = selected_gpus(nvml, os.environ)
        except Exception as exc:  # no driver or library (not started: nothing to shut down), or a failed selection
            result = exc
        with self.lock:
            if started and (self.abandoned or not isinstance(result, list) or not result):  # nobody will read it
                with contextlib.suppress(Exception):
                    nvml.nvmlShutdown()
            self.result = result
            self.done.set()


def _scaled(value: Any, factor: float) -> float | None:
    return None if value is None else float(value) * factor


def _text(value: Any) -> str:
    """A string NVML returned (older bindings give bytes), "" where the device did not say."""
    if value is None:
        return ""
    return value.decode() if isinstance(value, bytes) else str(value)


PART = ReaderEntry("nvml", build, extra="nvml", order=10)
