"""What a hardware reader hands the hardware monitor: one reading per device, and who each device is.

A reader (features/hardware/: NVML for NVIDIA GPUs, npu-smi for Ascend NPUs, psutil for the host) runs only on the
hardware monitor's own thread, never on the step path. It fills the fields its interface has and leaves the
others None: a quantity a device does not report is no series, never a 0.

`device` names the device as this rank sees it: `gpu0`, `npu3`, `host`. `DeviceIdentity` carries the labels the
device exporters put on their own series, in snake_case (dcgm-exporter's `gpu`, `UUID` as `uuid`, `pci_bus_id`,
`modelName` as `model_name`, `Hostname` as `hostname`; npu-exporter's `id`, `vdie_id`, `pcie_bus_info`,
`model_name`), so that a rank's `mindspore_train_device_info` joins their series; the recording rules rename the
exporters' camelCase labels to these with label_replace (docs/hardware.md).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ms_exporter.core.compat import SLOTS

HOST = "host"  # the `device` label of the host's own reading (features/hardware/host.py)


@dataclass(frozen=True, **SLOTS)
class DeviceReading:
    """One device's quantities at one moment; None where the interface does not say."""

    device: str
    temperature_celsius: float | None = None
    power_watts: float | None = None
    power_limit_watts: float | None = None
    utilization_ratio: float | None = None  # compute (GPU SMs, NPU AI cores, host CPUs), 0 to 1
    memory_utilization_ratio: float | None = None  # the memory bus or controller, 0 to 1
    memory_used_bytes: float | None = None
    memory_total_bytes: float | None = None
    clock_hertz: float | None = None  # the compute clock (GPU SM, NPU AI core)
    # Why the clock is held down now: () not throttled, None unknown. Names are the interface's, lower case.
    throttle_reasons: tuple[str, ...] | None = None
    ecc_uncorrected_errors: float | None = None  # since the driver loaded (a count the device keeps)
    pcie_rx_bytes_per_second: float | None = None
    pcie_tx_bytes_per_second: float | None = None
    link_up: bool | None = None  # the device's network link (Ascend RoCE); None where it has none
    healthy: bool | None = None  # the interface's own health verdict


@dataclass(frozen=True, **SLOTS)
class DeviceIdentity:
    """Who a device is, in the device exporters' own label names (empty where unknown)."""

    device: str  # gpu0, npu3, host
    labels: dict[str, str] = field(default_factory=dict)  # e.g. {"gpu": "0", "uuid": "GPU-...", "model_name": ...}


class HardwareReader:
    """One interface to the hardware. Called on the hardware thread only; each call may be slow (it is timed out
    and counted there), may raise (counted under `hardware.<name>`), and is retried at the next interval."""

    name = "reader"  # the `component` label is hardware.<name>

    def devices(self) -> list[DeviceIdentity]:
        """The devices this rank uses, read once before the first reading."""
        return []

    def read(self) -> list[DeviceReading]:
        """The current reading of each device."""
        return []

    def close(self) -> None:
        """Let go of the interface (NVML shutdown); safe to call twice."""
