"""A real CPU training with the hardware monitor on: the host's utilisation and memory (and its CPU temperature
where the kernel has a sensor) on /metrics and in the JSON Lines snapshot; with a scripted NVML in place of the
binding, the GPU's values and the dcgm-exporter join labels on the same sinks; with the fake npu-smi on PATH, an
NPU's on /metrics, JSON Lines and OTLP with npu-exporter's join labels; and a GPU call that hangs costs the training
nothing. (TensorBoard and W&B keep the per-step columns only: docs/hardware.md.)"""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import Any

import mindspore as ms
import pytest
from mindspore import nn
from mindspore.train import Model

from ms_exporter import TrainingMonitor
from ms_exporter.demo import build_network, synthetic_dataset
from ms_exporter.features.hardware.monitor import HardwareMonitor
from tests.support.fake_npu_smi import FakeNpuSmi, chip
from tests.support.fake_nvml import FakeGpu, FakeNvml
from tests.support.jsonl import records
from tests.support.otlp_receiver import GrpcReceiver
from tests.support.scrape import Scrape, scrape
from tests.support.waiting import wait_until

pytestmark = pytest.mark.integration

STEPS = 30


def _train(monitor: TrainingMonitor) -> None:
    ms.set_context(mode=ms.GRAPH_MODE)
    ms.set_seed(0)
    network = build_network(layers=1, d_model=32, heads=2)
    model = Model(network, optimizer=nn.Momentum(network.trainable_params(), 0.01, 0.9))
    model.train(1, synthetic_dataset(size=STEPS * 16), callbacks=[monitor], dataset_sink_mode=False)


def _snapshot(path: Path) -> dict[str, Any]:
    return [record for record in records(path) if record["type"] == "snapshot"][-1]["metrics"]


def _run(tmp_path: Path, readers: list[str], **options: Any) -> tuple[TrainingMonitor, Scrape, dict[str, Any]]:
    monitor = TrainingMonitor(
        port=0,
        backend=options.pop("backend", ["prometheus", "local"]),
        save_dir=str(tmp_path),
        web={"cache_seconds": 0},
        hardware={"readers": readers, "interval": 0.5, "timeout": 5},
        **options,
    )
    try:
        _train(monitor)
        hardware = monitor.part_of(HardwareMonitor)
        assert hardware is not None
        hardware.sample()  # one more round after training: the page below has it, whatever the machine's load
        wait_until(lambda: all(worker.busy_since is None for worker in hardware._readers), 30, "the readers")
        page = scrape(monitor.url)
    finally:
        monitor.close()
    return monitor, page, _snapshot(Path(monitor.jsonl_path or ""))


def test_the_host_reader_in_a_real_training(tmp_path: Path) -> None:
    import psutil

    _, page, snapshot = _run(tmp_path, ["host"])
    utilization = page.value("mindspore_train_device_utilization_ratio", device="host")
    assert 0.0 <= utilization <= 1.0
    assert page.value("mindspore_train_device_memory_total_bytes", device="host") == psutil.virtual_memory().total
    assert 0 < page.value("mindspore_train_device_memory_used_bytes", device="host") < psutil.virtual_memory().total
    sensors = getattr(psutil, "sensors_temperatures", lambda: {})()
    has_cpu_sensor = any(name in sensors for name in ("coretemp", "k10temp", "zenpower", "cpu_thermal", "acpitz"))
    temperature = [s for s in page.samples if s.name == "mindspore_train_device_temperature_celsius"]
    assert bool(temperature) == has_cpu_sensor  # a machine without a sensor shows none, never a 0
    assert 'device_utilization_ratio{device="host"}' in snapshot
    [identity] = page.labels_of("mindspore_train_info")
    assert page.value("mindspore_train_device_info", device="host", hostname=identity["node"]) == 1
    assert page.value("mindspore_exporter_errors_total", component="hardware.host") == 0


def test_a_scripted_gpu_on_every_sink_with_its_join_labels(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    gpu = FakeGpu(uuid="GPU-8c6c8e4c-0000-0000-0000-000000000001", temperature_c=93, clock_reasons=0x40)
    fake = FakeNvml([gpu])
    monkeypatch.setitem(sys.modules, "pynvml", fake.module())
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0")
    monkeypatch.setenv("POD_NAME", "training-0")
    monkeypatch.setenv("POD_NAMESPACE", "ml")
    _, page, snapshot = _run(tmp_path, ["nvml"])
    assert page.value("mindspore_train_device_temperature_celsius", device="gpu0") == 93
    assert page.value("mindspore_train_device_power_watts", device="gpu0") == pytest.approx(312.5)
    assert page.value("mindspore_train_device_throttled", device="gpu0", reason="hw_thermal_slowdown") == 1
    assert (
        page.value(
            "mindspore_train_device_info", device="gpu0", gpu="0", uuid=gpu.uuid, pod="training-0", namespace="ml"
        )
        == 1
    )
    assert snapshot['device_temperature_celsius{device="gpu0"}'] == 93
    assert fake.shutdown_calls == 1  # close() let go of NVML


def test_a_scripted_npu_on_every_sink_with_its_join_labels(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    fake = FakeNpuSmi(tmp_path, monkeypatch, [chip(0, temperature=91, ecc_double_bit=2, link="DOWN")])
    monkeypatch.setenv("ASCEND_RT_VISIBLE_DEVICES", "0")
    receiver = GrpcReceiver()
    try:
        _, page, snapshot = _run(
            tmp_path / "run",
            ["npu_smi"],
            backend=["prometheus", "local", "otlp"],
            otlp={"endpoint": receiver.endpoint, "interval": 0.5, "timeout": 5},
        )
        exported = {
            point.name: point.value
            for point in receiver.last().points()
            if point.name.startswith("mindspore_train_device_") and point.attributes.get("device") == "npu0"
        }
    finally:
        receiver.stop()
    assert page.value("mindspore_train_device_temperature_celsius", device="npu0") == 91
    assert page.value("mindspore_train_device_ecc_uncorrected_errors_total", device="npu0") == 2
    assert page.value("mindspore_train_device_link_up", device="npu0") == 0
    npu = fake.chips[0]
    assert (
        page.value(
            "mindspore_train_device_info",
            device="npu0",
            pcie_bus_info=npu["pcie_bus_info"],
            model_name="910B3-Ascend-V1",
        )
        == 1
    )
    assert snapshot['device_temperature_celsius{device="npu0"}'] == 91
    assert exported["mindspore_train_device_temperature_celsius"] == 91  # OTLP: the same reading
    assert exported["mindspore_train_device_link_up"] == 0


def test_a_gpu_call_that_hangs_costs_the_training_nothing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    gpu = FakeGpu(uuid="GPU-8c6c8e4c-0000-0000-0000-000000000002", hangs={"nvmlDeviceGetPowerUsage"})
    fake = FakeNvml([gpu])
    monkeypatch.setitem(sys.modules, "pynvml", fake.module())
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0")
    monitor = TrainingMonitor(
        port=0, web={"cache_seconds": 0}, hardware={"readers": ["nvml"], "interval": 0.5, "timeout": 0.5}
    )
    try:
        began = time.monotonic()
        _train(monitor)
        took = time.monotonic() - began
        wait_until(
            lambda: scrape(monitor.url).value("mindspore_exporter_errors_total", component="hardware.nvml") >= 1,
            30,
            "the hung NVML call counted",
        )
        page = scrape(monitor.url)
        assert page.value("mindspore_train_steps_total") == STEPS  # every step trained while NVML hung
    finally:
        fake.release()
        monitor.close()
    assert took < 300, took
