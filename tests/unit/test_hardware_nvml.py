"""The NVML reader over a fake `pynvml` (tests/support/fake_nvml.py): NVML's units come out as base units, what a GPU
does not support is None, CUDA_VISIBLE_DEVICES and DEVICE_ID choose the GPUs, build() gives [] where NVML is not
there, close() shuts NVML down once, and the hardware monitor writes the readings into a store. Where the real
binding (nvidia-ml-py) is installed, every name the reader and the fake use is held to it."""

from __future__ import annotations

import ast
import dataclasses
import importlib
import inspect
import sys
import time
from pathlib import Path
from types import ModuleType, SimpleNamespace
from typing import Any

import pytest

from ms_exporter.core import catalogue
from ms_exporter.core.store import MetricStore
from ms_exporter.features.hardware import nvml as nvml_reader
from ms_exporter.features.hardware.nvml import NvmlReader, build, reason_names
from tests.support.fake_nvml import (
    DriverNotLoaded,
    FakeGpu,
    FakeNvml,
    GpuIsLost,
)
from tests.support.waiting import wait_until

READER_SOURCE = Path(nvml_reader.__file__)
CONFIG = SimpleNamespace(timeout=5.0)
UUIDS = (
    "GPU-8932f937-d72c-4106-c12f-20bd9faed9f6",
    "GPU-11aa22bb-0000-1111-2222-333344445555",
    "GPU-11ab0000-0000-1111-2222-333344445555",
    "GPU-77cc88dd-0000-1111-2222-333344445555",
)
# Every function the reader may call on a GPU, for "supports nothing".
QUANTITY_FUNCTIONS = {
    "nvmlDeviceGetTemperatureV",
    "nvmlDeviceGetTemperature",
    "nvmlDeviceGetPowerUsage",
    "nvmlDeviceGetEnforcedPowerLimit",
    "nvmlDeviceGetUtilizationRates",
    "nvmlDeviceGetMemoryInfo_v2",
    "nvmlDeviceGetMemoryInfo",
    "nvmlDeviceGetClockInfo",
    "nvmlDeviceGetCurrentClocksEventReasons",
    "nvmlDeviceGetCurrentClocksThrottleReasons",
    "nvmlDeviceGetTotalEccErrors",
    "nvmlDeviceGetPcieThroughput",
}


@pytest.fixture(autouse=True)
def _no_device_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("CUDA_VISIBLE_DEVICES", "DEVICE_ID"):
        monkeypatch.delenv(name, raising=False)


def _install(monkeypatch: pytest.MonkeyPatch, fake: FakeNvml) -> FakeNvml:
    monkeypatch.setitem(sys.modules, "pynvml", fake.module())
    return fake


def _gpus(count: int) -> list[FakeGpu]:
    return [FakeGpu(uuid=UUIDS[index], pci=(0, 0x1B + index, 0)) for index in range(count)]


def _reader(monkeypatch: pytest.MonkeyPatch, fake: FakeNvml) -> NvmlReader:
    _install(monkeypatch, fake)
    (reader,) = build(CONFIG)
    assert isinstance(reader, NvmlReader)
    return reader


# -- values ------------------------------------------------------------------------------------------------------


def test_scripted_values_come_out_in_base_units(monkeypatch: pytest.MonkeyPatch) -> None:
    gpu = FakeGpu(uuid=UUIDS[0], clock_reasons=0, ecc_uncorrected=2)
    reader = _reader(monkeypatch, FakeNvml([gpu]))
    (reading,) = reader.read()
    assert reading.device == "gpu0"
    assert reading.temperature_celsius == 61.0
    assert reading.power_watts == pytest.approx(312.5)  # 312 500 mW
    assert reading.power_limit_watts == pytest.approx(700.0)
    assert reading.utilization_ratio == pytest.approx(0.87)
    assert reading.memory_utilization_ratio == pytest.approx(0.34)
    assert reading.memory_used_bytes == 20 * 2**30  # v2's used, without the driver's reserved memory
    assert reading.memory_total_bytes == 80 * 2**30
    assert reading.clock_hertz == pytest.approx(1.98e9)
    assert reading.throttle_reasons == ()
    assert reading.ecc_uncorrected_errors == 2.0
    assert reading.pcie_rx_bytes_per_second == 1500 * 1024.0
    assert reading.pcie_tx_bytes_per_second == 2500 * 1024.0
    assert (reading.link_up, reading.healthy) == (None, None)  # NVML has neither: no invented values


def test_the_identity_carries_dcgm_exporters_labels(monkeypatch: pytest.MonkeyPatch) -> None:
    reader = _reader(monkeypatch, FakeNvml(_gpus(2)))
    identities = reader.devices()
    assert [identity.device for identity in identities] == ["gpu0", "gpu1"]
    assert identities[1].labels == {
        "gpu": "1",
        "uuid": UUIDS[1],
        "pci_bus_id": "00000000:1C:00.0",  # NVML_DEVICE_PCI_BUS_ID_FMT, as dcgm-exporter shows it
        "model_name": "NVIDIA H100 80GB HBM3",
    }


@pytest.mark.parametrize(
    ("mask", "names"),
    [
        (0x0, ()),
        (0x4, ("sw_power_cap",)),
        (0x1 | 0x40 | 0x80, ("gpu_idle", "hw_thermal_slowdown", "hw_power_brake_slowdown")),
        (0x8 | 0x1000, ("hw_slowdown", "0x1000")),  # a bit nvml.h does not name yet still shows
    ],
)
def test_the_clock_event_mask_becomes_reason_names(mask: int, names: tuple[str, ...]) -> None:
    assert reason_names(mask) == names


def test_throttle_reasons_are_read_from_the_gpu(monkeypatch: pytest.MonkeyPatch) -> None:
    gpu = FakeGpu(uuid=UUIDS[0], clock_reasons=0x4 | 0x20)
    (reading,) = _reader(monkeypatch, FakeNvml([gpu])).read()
    assert reading.throttle_reasons == ("sw_power_cap", "sw_thermal_slowdown")


# -- what a GPU does not support -----------------------------------------------------------------------------------


def test_what_the_gpu_does_not_support_is_none(monkeypatch: pytest.MonkeyPatch) -> None:
    gpu = FakeGpu(uuid=UUIDS[0], not_supported=set(QUANTITY_FUNCTIONS))
    reader = _reader(monkeypatch, FakeNvml([gpu]))
    (reading,) = reader.read()
    assert reading.device == "gpu0"
    values = {f.name: getattr(reading, f.name) for f in dataclasses.fields(reading) if f.name != "device"}
    assert values == dict.fromkeys(values)  # every field None, no 0 in its place
    assert reader.devices()[0].labels["uuid"] == UUIDS[0]


def test_one_unsupported_quantity_leaves_the_others(monkeypatch: pytest.MonkeyPatch) -> None:
    # A GeForce board: no ECC, no enforced power limit.
    gpu = FakeGpu(uuid=UUIDS[0], not_supported={"nvmlDeviceGetTotalEccErrors", "nvmlDeviceGetEnforcedPowerLimit"})
    (reading,) = _reader(monkeypatch, FakeNvml([gpu])).read()
    assert (reading.ecc_uncorrected_errors, reading.power_limit_watts) == (None, None)
    assert reading.power_watts == pytest.approx(312.5)
    assert reading.temperature_celsius == 61.0


def test_an_older_binding_uses_the_older_functions(monkeypatch: pytest.MonkeyPatch) -> None:
    fake = FakeNvml(
        [FakeGpu(uuid=UUIDS[0], clock_reasons=0x4)],
        binding_lacks={"nvmlDeviceGetTemperatureV", "nvmlDeviceGetCurrentClocksEventReasons", "nvmlMemory_v2"},
    )
    (reading,) = _reader(monkeypatch, fake).read()
    assert reading.temperature_celsius == 61.0
    assert reading.throttle_reasons == ("sw_power_cap",)
    assert reading.memory_used_bytes == 20 * 2**30 + 2**29  # v1's used includes the reserved memory


def test_an_older_driver_is_asked_for_a_missing_function_once(monkeypatch: pytest.MonkeyPatch) -> None:
    lacking = {"nvmlDeviceGetTemperatureV", "nvmlDeviceGetCurrentClocksEventReasons", "nvmlDeviceGetMemoryInfo_v2"}
    fake = FakeNvml([FakeGpu(uuid=UUIDS[0])], driver_lacks=lacking)
    reader = _reader(monkeypatch, fake)
    first, second = reader.read()[0], reader.read()[0]
    assert first == second
    assert first.temperature_celsius == 61.0 and first.throttle_reasons == ()
    assert first.memory_used_bytes == 20 * 2**30 + 2**29
    assert sorted(name for name in fake.calls if name in lacking) == sorted(lacking)  # once each, not every read


def test_an_nvml_error_other_than_not_supported_reaches_the_monitor(monkeypatch: pytest.MonkeyPatch) -> None:
    gpu = FakeGpu(uuid=UUIDS[0], raises={"nvmlDeviceGetPowerUsage": GpuIsLost()})
    reader = _reader(monkeypatch, FakeNvml([gpu]))
    with pytest.raises(GpuIsLost):
        reader.read()


# -- which GPUs ---------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("visible", "devices"),
    [
        ("2,0", ["gpu2", "gpu0"]),  # CUDA's order, not NVML's
        (" 3 ", ["gpu3"]),
        (UUIDS[3], ["gpu3"]),
        ("GPU-8932f937", ["gpu0"]),  # a unique UUID prefix
        (f"1,{UUIDS[2]}", ["gpu1", "gpu2"]),
        ("1,7,2", ["gpu1"]),  # CUDA stops at the first entry that names no GPU
        ("GPU-11a,0", []),  # an ambiguous prefix names no GPU
        ("0,0", ["gpu0"]),  # nor does a repeat
    ],
)
def test_cuda_visible_devices_chooses_the_gpus(
    monkeypatch: pytest.MonkeyPatch, visible: str, devices: list[str]
) -> None:
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", visible)
    fake = _install(monkeypatch, FakeNvml(_gpus(4)))
    readers = build(CONFIG)
    assert [identity.device for reader in readers for identity in reader.devices()] == devices
    assert [reading.device for reader in readers for reading in reader.read()] == devices
    if not devices:
        assert fake.shutdown_calls == fake.init_calls == 1  # nothing to read: NVML let go at once


@pytest.mark.parametrize("visible", ["", "-1", "NoDevFiles"])
def test_cuda_visible_devices_that_hides_every_gpu_gives_no_reader(
    monkeypatch: pytest.MonkeyPatch, visible: str
) -> None:
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", visible)
    fake = _install(monkeypatch, FakeNvml(_gpus(2)))
    assert build(CONFIG) == []
    assert fake.shutdown_calls == 1


@pytest.mark.parametrize(
    ("visible", "device_id", "devices"),
    [
        (None, "2", ["gpu2"]),
        ("3,1", "1", ["gpu1"]),  # MindSpore's device id counts the visible GPUs
        ("3,1", "5", ["gpu3", "gpu1"]),  # out of range: it does not say which, so all the visible ones
        (None, "x", ["gpu0", "gpu1", "gpu2", "gpu3"]),
    ],
)
def test_device_id_picks_this_processs_gpu(
    monkeypatch: pytest.MonkeyPatch, visible: str | None, device_id: str, devices: list[str]
) -> None:
    if visible is not None:
        monkeypatch.setenv("CUDA_VISIBLE_DEVICES", visible)
    monkeypatch.setenv("DEVICE_ID", device_id)
    reader = _reader(monkeypatch, FakeNvml(_gpus(4)))
    assert [reading.device for reading in reader.read()] == devices


# -- build and close ----------------------------------------------------------------------------------------------


def test_build_gives_no_reader_without_the_binding(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "pynvml", None)  # what `import pynvml` meets where it is not installed
    assert build(CONFIG) == []


def test_build_gives_no_reader_when_nvml_does_not_start(monkeypatch: pytest.MonkeyPatch) -> None:
    fake = _install(monkeypatch, FakeNvml(_gpus(1), init_error=DriverNotLoaded()))
    assert build(CONFIG) == []
    assert (fake.init_calls, fake.shutdown_calls) == (1, 0)  # an init that failed has nothing to shut down


def test_build_gives_no_reader_on_a_machine_without_gpus(monkeypatch: pytest.MonkeyPatch) -> None:
    fake = _install(monkeypatch, FakeNvml([]))
    assert build(CONFIG) == []
    assert (fake.init_calls, fake.shutdown_calls) == (1, 1)


def test_build_gives_up_on_an_init_that_hangs_and_shuts_it_down_when_it_returns(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    fake = _install(monkeypatch, FakeNvml(_gpus(1), init_hangs=True))
    began = time.monotonic()
    assert build(SimpleNamespace(timeout=0.2)) == []
    assert time.monotonic() - began < 2.0
    fake.release()
    wait_until(lambda: fake.shutdown_calls == 1, 5.0, "the late init to be shut down")


def test_nothing_happens_on_import(monkeypatch: pytest.MonkeyPatch) -> None:
    fake = _install(monkeypatch, FakeNvml(_gpus(1)))
    package = importlib.import_module("ms_exporter.features.hardware")
    monkeypatch.setattr(package, "nvml", nvml_reader)  # put back after the fresh import below rebinds it
    monkeypatch.delitem(sys.modules, nvml_reader.__name__)
    importlib.import_module(nvml_reader.__name__)
    assert fake.init_calls == 0
    assert "pynvml" not in {node.names[0].name for node in ast.walk(_tree()) if isinstance(node, ast.Import)}


def test_close_shuts_nvml_down_once(monkeypatch: pytest.MonkeyPatch) -> None:
    fake = FakeNvml(_gpus(1))
    reader = _reader(monkeypatch, fake)
    reader.read()
    reader.close()
    reader.close()
    assert (fake.init_calls, fake.shutdown_calls) == (1, 1)


# -- through the hardware monitor ---------------------------------------------------------------------------------


def _monitor(reader: NvmlReader, store: MetricStore, timeout: float = 5.0) -> Any:
    if not hasattr(catalogue, "DEVICE_TEMPERATURE"):
        pytest.skip("the device families are not in ms_exporter/core/catalogue.py yet (the lead engineer adds them)")
    from ms_exporter.core.errors import Breaker, ErrorSink
    from ms_exporter.features.hardware.monitor import HardwareMonitor

    return HardwareMonitor([reader], store, interval=3600.0, timeout=timeout, breaker=Breaker(ErrorSink(store), store))


def _value(store: MetricStore, family: Any, **labels: str) -> float | None:
    wanted = set(labels.items())
    found = [series.value for series in store.series_of(family) if wanted <= set(series.labels)]
    return found[0] if found else None


def test_the_monitor_writes_nvml_readings_into_the_store(monkeypatch: pytest.MonkeyPatch) -> None:
    gpu = FakeGpu(uuid=UUIDS[1], clock_reasons=0x4, not_supported={"nvmlDeviceGetTotalEccErrors"})
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "1")
    fake = FakeNvml([FakeGpu(uuid=UUIDS[0]), gpu])
    reader = _reader(monkeypatch, fake)
    store = MetricStore()
    monitor = _monitor(reader, store)
    monitor.sample()
    wait_until(lambda: _value(store, catalogue.DEVICE_PCIE, device="gpu1", direction="tx"), 5.0, "a reading")
    assert _value(store, catalogue.DEVICE_TEMPERATURE, device="gpu1") == 61.0
    assert _value(store, catalogue.DEVICE_POWER, device="gpu1") == pytest.approx(312.5)
    assert _value(store, catalogue.DEVICE_UTILIZATION, device="gpu1") == pytest.approx(0.87)
    assert _value(store, catalogue.DEVICE_CLOCK, device="gpu1") == pytest.approx(1.98e9)
    assert _value(store, catalogue.DEVICE_THROTTLED, device="gpu1", reason="sw_power_cap") == 1.0
    assert _value(store, catalogue.DEVICE_PCIE, device="gpu1", direction="rx") == 1500 * 1024.0
    assert _value(store, catalogue.DEVICE_ECC_UNCORRECTED, device="gpu1") is None  # not supported: no series
    assert _value(store, catalogue.DEVICE_TEMPERATURE, device="gpu0") is None  # not this rank's GPU
    info = _value(store, catalogue.DEVICE_INFO, device="gpu1", gpu="1", uuid=UUIDS[1], pci_bus_id="00000000:1B:00.0")
    assert info == 1.0
    monitor.close()
    assert fake.shutdown_calls == 1


def test_the_monitor_counts_an_nvml_call_that_hangs(monkeypatch: pytest.MonkeyPatch) -> None:
    gpu = FakeGpu(uuid=UUIDS[0], hangs={"nvmlDeviceGetPowerUsage"})
    fake = FakeNvml([gpu])
    reader = _reader(monkeypatch, fake)
    store = MetricStore()
    monitor = _monitor(reader, store, timeout=0.1)
    try:
        monitor.sample()
        wait_until(lambda: "nvmlDeviceGetPowerUsage" in fake.calls, 5.0, "the reader to reach the hung call")

        def counted() -> bool:
            monitor.sample()  # a round past the monitor's timeout counts the busy reader, once
            return _value(store, catalogue.ERRORS, component="hardware.nvml") == 1.0

        wait_until(counted, 5.0, "the hung reader to be counted", every=0.05)
        monitor.sample()
        assert _value(store, catalogue.ERRORS, component="hardware.nvml") == 1.0  # not again while it still hangs
    finally:
        fake.release()
        monitor.close()


# -- the fake against the real binding ---------------------------------------------------------------------------


def _tree() -> ast.Module:
    return ast.parse(READER_SOURCE.read_text(encoding="utf-8"))


def _names_the_reader_uses() -> set[str]:
    """Every `nvml.<name>` / `self._nvml.<name>` the reader touches, and every NVML name it holds as a string."""
    names: set[str] = set()
    for node in ast.walk(_tree()):
        if isinstance(node, ast.Attribute) and ast.unparse(node.value) in ("nvml", "self._nvml"):
            names.add(node.attr)
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) and _is_nvml_name(node.value):
            names.add(node.value)
    return names


def _is_nvml_name(text: str) -> bool:
    return text.startswith(("nvml", "NVML")) and text.isidentifier() and text != NvmlReader.name


def _shape(function: Any) -> list[tuple[str, bool]]:
    """Parameter names, each with whether the caller must pass it."""
    return [(p.name, p.default is inspect.Parameter.empty) for p in inspect.signature(function).parameters.values()]


def _real_pynvml() -> ModuleType:
    real = pytest.importorskip("pynvml", reason="nvidia-ml-py is not installed here")
    assert getattr(real, "__file__", None), "sys.modules holds a fake pynvml"
    return real


def test_every_name_the_reader_uses_is_in_the_real_binding() -> None:
    real = _real_pynvml()
    used = _names_the_reader_uses()
    assert {"nvmlInit", "nvmlShutdown", "nvmlDeviceGetPowerUsage", "NVMLError_NotSupported"} <= used
    assert sorted(name for name in used if not hasattr(real, name)) == []


def test_every_name_the_fake_has_is_in_the_real_binding_with_its_signature() -> None:
    real = _real_pynvml()
    fake = FakeNvml([]).module()
    for name in dir(fake):
        if name.startswith("__"):
            continue
        assert hasattr(real, name), f"the fake has {name}, the binding does not"
        ours, theirs = getattr(fake, name), getattr(real, name)
        if isinstance(theirs, int):
            assert ours == theirs, f"{name} is {theirs} in the binding, {ours} in the fake"
        elif isinstance(theirs, type):
            assert issubclass(theirs, real.NVMLError) and issubclass(ours, fake.NVMLError), name
        else:
            assert _shape(ours) == _shape(theirs), name
    assert _names_the_reader_uses() <= set(dir(fake)), "the fake lacks a name the reader uses"


def test_the_reason_bits_are_the_bindings() -> None:
    real = _real_pynvml()
    for bit, name in nvml_reader.THROTTLE_REASONS:
        constant = "nvmlClocksThrottleReason" + "".join(part.capitalize() for part in name.split("_"))
        assert getattr(real, constant) == bit, constant


def test_the_real_binding_without_a_driver_gives_no_reader() -> None:
    _real_pynvml()
    if Path("/dev/nvidiactl").exists():
        pytest.skip("this machine has an NVIDIA driver")
    assert build(CONFIG) == []
