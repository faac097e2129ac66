"""The device exporters' own metric and label names, and the versions they come from, written once: the recording
rules that join their series to ranks (generate/recording.py), the tests and docs/hardware.md read them here.

Sources (docs/hardware.md#joining-the-device-exporters cites each line):
- dcgm-exporter 4.x (NVIDIA/dcgm-exporter; README's image 4.4.0-4.5.0-ubuntu22.04): the metric name is the DCGM
  field name written in the counters CSV (METRICS.md); etc/default-counters.csv enables GPU_TEMP, POWER_USAGE and
  GPU_UTIL and ships the ECC counters commented out; the clock-event mask is no default counter, so the user adds it
  under either of its names (go-dcgm calls field 112 DCGM_FI_DEV_CLOCKS_EVENT_REASONS, DCGM before 3.3
  DCGM_FI_DEV_CLOCK_THROTTLE_REASONS). Labels from internal/pkg/collector/gpu_collector.go `toMetric`.
- npu-exporter v6.0.0 (Ascend/mind-cluster component/npu-exporter, module huawei.com/npu-exporter/v6): metric
  names from collector/metrics/collector_for_npu.go, _hbm.go and _network.go; labels `CardLabel` in
  collector/common (id, model_name, vdie_id, pcie_bus_info, namespace, pod_name, container_name).
"""

from __future__ import annotations

from dataclasses import dataclass

from ms_exporter.core.catalogue import HEAT_POWER_REASONS
from ms_exporter.features.hardware.nvml import THROTTLE_REASONS


@dataclass(frozen=True)
class DeviceExporter:
    """One device exporter: the label that names one device on every host alike, and its series per quantity (None
    where it has none). Each series is read as the catalogue's unit: `percent` series are divided by 100."""

    name: str
    key: str  # the label of its series that names one device cluster-wide
    joins_as: str  # that label's name on mindspore_train_device_info (ours are snake_case; the rules rename theirs)
    labels: tuple[str, ...]  # every label it puts on a device series (Prometheus adds job and instance)
    temperature: str | None = None  # °C
    power: str | None = None  # W
    utilization_percent: str | None = None  # the compute's busy share, in percent
    throttle_masks: tuple[str, ...] = ()  # clock-event reason bit masks, under any of these names
    ecc_uncorrected: str | None = None  # uncorrected memory errors since the driver loaded
    link_status: str | None = None  # LINK_UP while the device's network link is up


# dcgm-exporter: `UUID` is the GPU's own (GPU-...), the same on every host (our `uuid`). Its `gpu` is DCGM's GPU id
# and its `Hostname` the NODE_NAME it was given, else its container's host name: a rank's gethostname() in a pod is
# the pod's name, so (Hostname, gpu) joins nothing in Kubernetes and a bare GPU index repeats on every host.
DCGM = DeviceExporter(
    name="dcgm-exporter",
    key="UUID",
    joins_as="uuid",
    labels=(
        "gpu",
        "UUID",
        "pci_bus_id",
        "device",
        "modelName",
        "Hostname",
        "DCGM_FI_DRIVER_VERSION",
        "container",
        "namespace",
        "pod",
    ),
    temperature="DCGM_FI_DEV_GPU_TEMP",
    power="DCGM_FI_DEV_POWER_USAGE",
    utilization_percent="DCGM_FI_DEV_GPU_UTIL",
    throttle_masks=("DCGM_FI_DEV_CLOCKS_EVENT_REASONS", "DCGM_FI_DEV_CLOCK_THROTTLE_REASONS"),
    ecc_uncorrected="DCGM_FI_DEV_ECC_DBE_VOL_TOTAL",  # double-bit (uncorrectable), volatile: since the driver loaded
)

# npu-exporter: `vdie_id` is the chip's die ID, the same on every host only for that chip. `pcie_bus_info` repeats on
# every host of one model (npu-exporter has no host label, and its `instance` is not the rank's), `id` too.
NPU = DeviceExporter(
    name="npu-exporter",
    key="vdie_id",
    joins_as="vdie_id",
    labels=("id", "model_name", "vdie_id", "pcie_bus_info", "namespace", "pod_name", "container_name"),
    temperature="npu_chip_info_temperature",
    power="npu_chip_info_power",
    utilization_percent="npu_chip_info_utilization",
    ecc_uncorrected="npu_chip_info_hbm_ecc_double_bit_error_cnt",  # DCMI's real-time count, cleared at restart
    link_status="npu_chip_info_link_status",  # hccn_tool's link state: 1 UP, 0 DOWN (-1 where hccn_tool failed)
)

EXPORTERS = (DCGM, NPU)
LINK_UP = 1  # npu_chip_info_link_status of a link that is up (GetLinkStatusCode: "UP" -> 1, else 0)

# The heat-or-power reasons (catalogue.HEAT_POWER_REASONS says which and why) as bits of DCGM's mask.
HEAT_POWER_BITS = tuple(bit for bit, name in THROTTLE_REASONS if name in HEAT_POWER_REASONS)
