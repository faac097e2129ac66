"""The Devices row: each rank's device temperature against the DeviceHot line, power, utilisation and throttling."""

from __future__ import annotations

from ms_exporter.core import catalogue as c
from ms_exporter.core.thresholds import Thresholds
from ms_exporter.generate.panels.panel import SELECTOR, Query, Row, TimeSeries

_LEGEND = "{{device}} rank {{rank}}"


def rank_device(recorded: str, own: c.MetricFamily) -> str:
    """A quantity per (project, rank, device): the recording (the rank's own reader, else npu-exporter's or
    dcgm-exporter's reading of its device), and the rank's own series for any device the recording leaves out (the
    host, or every device where Prometheus does not run the shipped rules). `or` keeps a recorded device once."""
    return f"{recorded}{{{SELECTOR}}} or max by (project, rank, device) ({own.name}{{{SELECTOR}}})"


def row(t: Thresholds) -> Row:
    return Row(
        "Devices",
        (
            TimeSeries(
                "Device temperature",
                "celsius",
                (Query(rank_device(c.RANK_DEVICE_TEMPERATURE, c.DEVICE_TEMPERATURE), _LEGEND),),
                width=6,
                height=8,
                description="Each device a rank trains on (gpu<N>, npu<N>) and its host's CPUs where the kernel has a "
                "sensor (docs/hardware.md); the dashed line is MindSporeTrainingDeviceHot's threshold.",
                above=t.device_hot_celsius,
            ),
            TimeSeries(
                "Device power",
                "watt",
                (Query(rank_device(c.RANK_DEVICE_POWER, c.DEVICE_POWER), _LEGEND),),
                width=6,
                height=8,
                description="Power draw of each device; a rank whose device draws less than its peers' at the same "
                "step is held back (throttled, or waiting).",
            ),
            TimeSeries(
                "Device utilisation",
                "percentunit",
                (Query(rank_device(c.RANK_DEVICE_UTILIZATION, c.DEVICE_UTILIZATION), _LEGEND),),
                width=6,
                height=8,
                description="Share of the last sample interval the device's compute (GPU SMs, NPU AI cores, the "
                "host's CPUs) was busy.",
            ),
            TimeSeries(
                "Device throttled",
                "bool_yes_no",
                (Query(f"{c.RANK_DEVICE_THROTTLED}{{{SELECTOR}}}", _LEGEND),),
                width=6,
                height=8,
                description="Yes while the device holds its clock down for heat or power "
                "(MindSporeTrainingDeviceThrottling); an idle GPU's clock or an applications-clock setting does not "
                "count. Needs the shipped recording rules.",
            ),
        ),
    )
