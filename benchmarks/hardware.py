"""What a hardware reading costs: each reader's own time per sample, on the hardware monitor's thread.

Never on the step path (docs/hardware.md), so this is CPU time taken beside training, once every
`hardware.interval` seconds (10 by default). The host reader runs for real here. NVML runs against the scripted
binding of tests/support/fake_nvml.py (this machine has no GPU): what it measures is the reader's own Python side,
without the driver's time. npu-smi is not timed: its cost is the npu-smi process's on an Ascend host (the source
article: about 80 ms for nvidia-smi), which the fake script here cannot stand in for.
"""

from __future__ import annotations

import sys
import time
from typing import Any

from benchmarks.report import table
from benchmarks.stats import summary


def _timed(read: Any, samples: int, apart: float = 0.0) -> dict[str, float]:
    """Median etc. of `samples` readings, `apart` seconds between them (not timed)."""
    read()  # the first reading primes what the reader keeps (psutil's CPU interval, NVML's handles)
    times = []
    for _ in range(samples):
        time.sleep(apart)
        began = time.perf_counter()
        read()
        times.append(time.perf_counter() - began)
    return summary(times)


def measure(samples: int) -> list[dict[str, Any]]:
    from ms_exporter.config import load_config
    from ms_exporter.features.hardware import host, nvml
    from tests.support.fake_nvml import FakeGpu, FakeNvml

    section = load_config({}).hardware
    rows: list[dict[str, Any]] = []
    reader = host.HostReader()
    sensors = "with" if reader.read()[0].temperature_celsius is not None else "without"
    # Readings come hardware.interval apart: one sooner than MIN_CPU_INTERVAL_SECONDS after the last waits that long
    # for psutil's CPU share (host.py), which back-to-back readings would measure instead of the reading itself.
    rows.append(
        {
            "case": f"host (psutil, {sensors} a CPU temperature sensor here)",
            **_timed(reader.read, min(samples, 100), apart=host.MIN_CPU_INTERVAL_SECONDS * 1.2),
        }
    )

    gpus = [FakeGpu(uuid=f"GPU-00000000-0000-0000-0000-00000000000{index}") for index in range(8)]
    saved = sys.modules.get("pynvml")
    sys.modules["pynvml"] = FakeNvml(gpus).module()
    try:
        [gpu_reader] = nvml.build(section)
        rows.append(
            {
                "case": "nvml, 8 GPUs, scripted binding (the reader's Python side, no driver time)",
                **_timed(gpu_reader.read, samples),
            }
        )
        gpu_reader.close()
    finally:
        if saved is None:
            sys.modules.pop("pynvml", None)
        else:
            sys.modules["pynvml"] = saved
    for row in rows:
        row["share_at_default"] = row["median"] / 1e3 / section.interval  # of one core, at hardware.interval
    return rows


def hardware_section(
    readers: list[dict[str, Any]], steps_tables: list[tuple[str, int, int, list[dict[str, Any]]]]
) -> list[str]:
    """The hardware monitor (docs/hardware.md): each reader's time per sample, and whole trainings with it off."""
    rows = [
        (title, row)
        for title, _, _, table_rows in steps_tables
        for row in table_rows
        if "hardware" in row["case"] or row["case"] == "TrainingMonitor, defaults"
    ]
    lines = [
        "## Hardware readers",
        "",
        "The hardware monitor is on by default and reads on threads of its own, never on the step path",
        "(docs/hardware.md). Each reader's time per sample, on its thread, and that time as a share of one core at",
        "the default `hardware.interval` (10 s). The host reader ran for real; NVML against the scripted binding",
        "of tests/support/fake_nvml.py (no GPU here: the reader's own Python side, without the driver's time);",
        "npu-smi is not timed here (its cost is the npu-smi process's on an Ascend host).",
        "",
        table(
            readers,
            [
                ("case", "reader", ""),
                ("median", "median ms", ".3f"),
                ("p90", "p90 ms", ".3f"),
                ("p99", "p99 ms", ".3f"),
                ("n", "samples", "d"),
                ("share_at_default", "share of a core at 10 s", ".2e"),
            ],
        ),
        "",
        "Whole trainings (the rounds of the step-time tables above) with the default monitor, with its hardware",
        "monitor off, and with it reading every 0.5 s (20 times the default rate): the ratio to no callbacks.",
        "The step-interleaved figures cannot see a thread that runs beside every step alike; these rounds can,",
        "within the spread of the no-callbacks control.",
        "",
    ]
    lines += [
        f"- {title}: {row['case']}: {row['ratio']:.3f} ({row['ratio_low']:.3f} to {row['ratio_high']:.3f})"
        for title, row in rows
    ]
    return [*lines, ""]


if __name__ == "__main__":
    for row in measure(500):
        print(
            f"| {row['case']} | {row['median']:.3f} | {row['p90']:.3f} | {row['p99']:.3f} | {row['n']} "
            f"| {row['share_at_default']:.2e} |"
        )
