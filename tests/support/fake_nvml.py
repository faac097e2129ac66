"""A stand-in for `pynvml` (nvidia-ml-py) to put in sys.modules: GPUs scripted one by one, no driver needed.

`FakeNvml(gpus).module()` is the module object. It has the names the NVML reader calls, spelled, shaped and in the
units of the real binding (milliwatts, percent, MHz, KB/s, bytes; NVMLError subclasses per error), and like NVML it
answers NVMLError_Uninitialized before nvmlInit and after the matching nvmlShutdown (which can be made to hang until
`release()`, as on a sick GPU). A GPU can answer NVMLError_NotSupported for a function, raise any exception, or hang
until `release()`; the module can lack names (an older binding) or answer NVMLError_FunctionNotFound for them (an
older driver). tests/unit/test_hardware_nvml.py holds these names and signatures to the real binding where it is
installed.
"""

from __future__ import annotations

import threading
import types
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

HANG_LIMIT_SECONDS = 60.0  # a hung call returns after this even if a test forgot release()

# The constants of the real binding the reader passes (pynvml.py, nvidia-ml-py 13).
CONSTANTS: dict[str, int] = {
    "NVML_TEMPERATURE_GPU": 0,
    "NVML_CLOCK_SM": 1,
    "NVML_MEMORY_ERROR_TYPE_CORRECTED": 0,
    "NVML_MEMORY_ERROR_TYPE_UNCORRECTED": 1,
    "NVML_VOLATILE_ECC": 0,
    "NVML_AGGREGATE_ECC": 1,
    "NVML_PCIE_UTIL_TX_BYTES": 0,
    "NVML_PCIE_UTIL_RX_BYTES": 1,
    "nvmlMemory_v2": 0x02000028,
    "nvmlTemperature_v1": 0x100000C,
}


class NVMLError(Exception):
    """The binding's base error; each NVML return code has its own subclass."""

    value = 999  # NVML_ERROR_UNKNOWN

    def __str__(self) -> str:
        return type(self).__name__


def _error(name: str, code: int) -> type[NVMLError]:
    return type(name, (NVMLError,), {"value": code})


ERRORS: dict[str, type[NVMLError]] = {
    error.__name__: error
    for error in (
        _error("NVMLError_Uninitialized", 1),
        _error("NVMLError_NotSupported", 3),
        _error("NVMLError_DriverNotLoaded", 9),
        _error("NVMLError_LibraryNotFound", 12),
        _error("NVMLError_FunctionNotFound", 13),
        _error("NVMLError_GpuIsLost", 15),
        _error("NVMLError_ArgumentVersionMismatch", 25),
    )
}
NotSupported = ERRORS["NVMLError_NotSupported"]
FunctionNotFound = ERRORS["NVMLError_FunctionNotFound"]
GpuIsLost = ERRORS["NVMLError_GpuIsLost"]
DriverNotLoaded = ERRORS["NVMLError_DriverNotLoaded"]
Uninitialized = ERRORS["NVMLError_Uninitialized"]


@dataclass
class FakeGpu:
    """One GPU in NVML's own units. `not_supported`, `raises` and `hangs` are keyed by binding function name."""

    uuid: str
    name: str = "NVIDIA H100 80GB HBM3"
    pci: tuple[int, int, int] = (0, 0x1B, 0)  # domain, bus, device
    temperature_c: int = 61
    power_mw: int = 312_500
    power_limit_mw: int = 700_000
    utilization_percent: tuple[int, int] = (87, 34)  # gpu, memory
    memory_total: int = 80 * 2**30
    memory_used: int = 20 * 2**30  # v2's used: what processes allocated
    memory_reserved: int = 2**29  # v2 counts it apart; v1's used includes it
    sm_clock_mhz: int = 1980
    clock_reasons: int = 0
    ecc_uncorrected: int = 0
    pcie_kb_per_s: tuple[int, int] = (1500, 2500)  # rx, tx
    not_supported: set[str] = field(default_factory=set)
    raises: dict[str, BaseException] = field(default_factory=dict)
    hangs: set[str] = field(default_factory=set)


class _Struct:
    """A result struct: the binding returns ctypes structures read by attribute."""

    def __init__(self, **fields: Any) -> None:
        self.__dict__.update(fields)


class FakeNvml:
    """The scripted state behind one fake module, and what the reader did with it."""

    def __init__(
        self,
        gpus: Iterable[FakeGpu],
        *,
        init_error: BaseException | None = None,
        init_hangs: bool = False,
        shutdown_hangs: bool = False,
        binding_lacks: Iterable[str] = (),
        driver_lacks: Iterable[str] = (),
    ) -> None:
        self.gpus = list(gpus)
        self.init_error = init_error
        self.init_hangs = init_hangs
        self.shutdown_hangs = shutdown_hangs  # nvmlShutdown waits until release(), as on a sick GPU
        self.binding_lacks = set(binding_lacks)
        self.driver_lacks = set(driver_lacks)
        self.init_calls = 0
        self.shutdown_calls = 0
        self.calls: list[str] = []  # every device function called, by name
        self._released = threading.Event()
        self._lock = threading.Lock()
        self._refcount = 0

    def release(self) -> None:
        """Let every hung call return: a device call then raises NVMLError_GpuIsLost (as after a driver reset), a
        hung nvmlInit succeeds late."""
        self._released.set()

    def module(self) -> types.ModuleType:
        module = types.ModuleType("pynvml", "fake nvidia-ml-py (tests/support/fake_nvml.py)")
        names: dict[str, Any] = {**CONSTANTS, **ERRORS, "NVMLError": NVMLError}
        names.update((name, getattr(self, name)) for name in dir(self) if name.startswith("nvml"))
        for name, value in names.items():
            if name not in self.binding_lacks:
                setattr(module, name, value)
        return module

    # -- library ---------------------------------------------------------------------------------------------------
    def nvmlInit(self) -> None:
        self.init_calls += 1
        if self.init_hangs:
            self._released.wait(HANG_LIMIT_SECONDS)
        if self.init_error is not None:
            raise self.init_error
        with self._lock:
            self._refcount += 1

    def nvmlShutdown(self) -> None:
        if self.shutdown_hangs:
            self._released.wait(HANG_LIMIT_SECONDS)
        with self._lock:
            if self._refcount == 0:
                raise Uninitialized()
            self._refcount -= 1
            self.shutdown_calls += 1

    def nvmlDeviceGetCount(self) -> int:
        self._check("nvmlDeviceGetCount", None)
        return len(self.gpus)

    def nvmlDeviceGetHandleByIndex(self, index: int) -> FakeGpu:
        self._check("nvmlDeviceGetHandleByIndex", None)
        return self.gpus[index]

    # -- identity ----------------------------------------------------------------------------------------------------
    def nvmlDeviceGetUUID(self, handle: FakeGpu) -> str:
        self._check("nvmlDeviceGetUUID", handle)
        return handle.uuid

    def nvmlDeviceGetName(self, handle: FakeGpu) -> str:
        self._check("nvmlDeviceGetName", handle)
        return handle.name

    def nvmlDeviceGetPciInfo(self, handle: FakeGpu) -> _Struct:
        self._check("nvmlDeviceGetPciInfo", handle)
        domain, bus, device = handle.pci
        bus_id = f"{domain:08X}:{bus:02X}:{device:02X}.0".encode()
        return _Struct(domain=domain, bus=bus, device=device, busId=bus_id, busIdLegacy=bus_id[4:])

    # -- quantities --------------------------------------------------------------------------------------------------
    def nvmlDeviceGetTemperatureV(
        self, handle: FakeGpu, sensor: int, version: int = CONSTANTS["nvmlTemperature_v1"]
    ) -> int:
        self._check("nvmlDeviceGetTemperatureV", handle)
        return handle.temperature_c

    def nvmlDeviceGetTemperature(self, handle: FakeGpu, sensor: int) -> int:
        self._check("nvmlDeviceGetTemperature", handle)
        return handle.temperature_c

    def nvmlDeviceGetPowerUsage(self, handle: FakeGpu) -> int:
        self._check("nvmlDeviceGetPowerUsage", handle)
        return handle.power_mw

    def nvmlDeviceGetEnforcedPowerLimit(self, handle: FakeGpu) -> int:
        self._check("nvmlDeviceGetEnforcedPowerLimit", handle)
        return handle.power_limit_mw

    def nvmlDeviceGetUtilizationRates(self, handle: FakeGpu) -> _Struct:
        self._check("nvmlDeviceGetUtilizationRates", handle)
        gpu, memory = handle.utilization_percent
        return _Struct(gpu=gpu, memory=memory)

    def nvmlDeviceGetMemoryInfo(self, handle: FakeGpu, version: int | None = None) -> _Struct:
        if version:  # the binding calls nvmlDeviceGetMemoryInfo_v2 in the library for this
            self._check("nvmlDeviceGetMemoryInfo_v2", handle)
            free = handle.memory_total - handle.memory_used - handle.memory_reserved
            return _Struct(
                version=version,
                total=handle.memory_total,
                reserved=handle.memory_reserved,
                free=free,
                used=handle.memory_used,
            )
        self._check("nvmlDeviceGetMemoryInfo", handle)
        used = handle.memory_used + handle.memory_reserved
        return _Struct(total=handle.memory_total, free=handle.memory_total - used, used=used)

    def nvmlDeviceGetClockInfo(self, handle: FakeGpu, type: int) -> int:
        self._check("nvmlDeviceGetClockInfo", handle)
        if type != CONSTANTS["NVML_CLOCK_SM"]:
            raise AssertionError(f"the fake has the SM clock only, not clock type {type}")
        return handle.sm_clock_mhz

    def nvmlDeviceGetCurrentClocksEventReasons(self, handle: FakeGpu) -> int:
        self._check("nvmlDeviceGetCurrentClocksEventReasons", handle)
        return handle.clock_reasons

    def nvmlDeviceGetCurrentClocksThrottleReasons(self, handle: FakeGpu) -> int:
        self._check("nvmlDeviceGetCurrentClocksThrottleReasons", handle)
        return handle.clock_reasons

    def nvmlDeviceGetTotalEccErrors(self, handle: FakeGpu, errorType: int, counterType: int) -> int:
        self._check("nvmlDeviceGetTotalEccErrors", handle)
        if (
            errorType != CONSTANTS["NVML_MEMORY_ERROR_TYPE_UNCORRECTED"]
            or counterType != CONSTANTS["NVML_VOLATILE_ECC"]
        ):
            raise AssertionError(f"the fake has volatile uncorrected ECC errors only, not {errorType}/{counterType}")
        return handle.ecc_uncorrected

    def nvmlDeviceGetPcieThroughput(self, device: FakeGpu, counter: int) -> int:
        self._check("nvmlDeviceGetPcieThroughput", device)
        rx, tx = device.pcie_kb_per_s
        return rx if counter == CONSTANTS["NVML_PCIE_UTIL_RX_BYTES"] else tx

    def _check(self, function: str, gpu: FakeGpu | None) -> None:
        """What NVML does before answering: initialised? does the driver have it? does this GPU support it?"""
        self.calls.append(function)
        if self._refcount == 0:
            raise Uninitialized()
        if function in self.driver_lacks:
            raise FunctionNotFound()
        if gpu is None:
            return
        if function in gpu.hangs:
            self._released.wait(HANG_LIMIT_SECONDS)
            raise GpuIsLost()
        if function in gpu.raises:
            raise gpu.raises[function]
        if function in gpu.not_supported:
            raise NotSupported()
