"""The npu-smi reader against a fake npu-smi (tests/support/fake_npu_smi): values in base units, fields npu-smi leaves
out, every way a command fails, which NPUs a rank reads, and the hardware monitor driving it past a hung command."""

from __future__ import annotations

import os
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from ms_exporter.core import catalogue as c
from ms_exporter.core.device.reading import DeviceIdentity, DeviceReading, HardwareReader
from ms_exporter.core.errors import Breaker, ErrorSink
from ms_exporter.core.store import MetricStore
from ms_exporter.features.hardware.command import CommandError, CommandTimeout, trusted_command
from ms_exporter.features.hardware.npu_smi import NpuSmiReader, build, parse_table
from tests.support.fake_npu_smi import FakeNpuSmi, chip
from tests.support.waiting import wait_until

MIB = 1024 * 1024
# Generous: each call starts a Python process, and the test machine is shared.
TIMEOUT = 15.0


@pytest.fixture
def fake(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> FakeNpuSmi:
    return FakeNpuSmi(tmp_path, monkeypatch, [chip(0), chip(1)])


def reader(timeout: float = TIMEOUT, **settings: Any) -> NpuSmiReader:
    readers = build(SimpleNamespace(timeout=timeout, **settings))
    assert len(readers) == 1 and isinstance(readers[0], NpuSmiReader)
    return readers[0]


def asked(fake: FakeNpuSmi, since: int = 0) -> list[str]:
    """The commands the fake ran (after the first `since`), as typed."""
    return [" ".join([call["tool"], *call["args"]]) for call in fake.calls()[since:]]


# -- values ------------------------------------------------------------------------------------------------------------
def test_each_quantity_is_read_from_its_command_in_base_units(fake: FakeNpuSmi) -> None:
    fake.set(1, temperature=71, power=301.2, aicore=88, aicore_cur_freq=1800, hbm_used_mb=60000, hbm_bandwidth=57)
    fake.set(1, ecc_double_bit=4, link="DOWN", health="Critical")
    npu = reader()

    assert npu.devices() == [
        DeviceIdentity(
            "npu0",
            {
                "id": "0",
                "vdie_id": "42C711D4-20B03704-4A10C8D4-14CC040A-D2102000",  # npu-exporter's spelling of DCMI's words
                "pcie_bus_info": "0000:C0:00.0",
                "model_name": "910B3-Ascend-V1",
            },
        ),
        DeviceIdentity(
            "npu1",
            {
                "id": "1",
                "vdie_id": "42C711D4-20B03704-4A10C8D4-14CC040A-D2102001",
                "pcie_bus_info": "0000:C1:00.0",
                "model_name": "910B3-Ascend-V1",
            },
        ),
    ]
    assert npu.read() == [
        DeviceReading(
            "npu0",
            temperature_celsius=45.0,
            power_watts=98.5,
            utilization_ratio=0.37,
            memory_utilization_ratio=0.12,
            memory_used_bytes=3378.0 * MIB,
            memory_total_bytes=65536.0 * MIB,
            clock_hertz=1.65e9,
            ecc_uncorrected_errors=1.0,
            link_up=True,
            healthy=True,
        ),
        DeviceReading(
            "npu1",
            temperature_celsius=71.0,
            power_watts=301.2,
            utilization_ratio=0.88,
            memory_utilization_ratio=0.57,
            memory_used_bytes=60000.0 * MIB,
            memory_total_bytes=65536.0 * MIB,
            clock_hertz=1.8e9,
            ecc_uncorrected_errors=4.0,
            link_up=False,
            healthy=False,  # anything but OK
        ),
    ]


def test_a_field_npu_smi_leaves_out_or_prints_as_na_is_none_and_the_others_still_read(fake: FakeNpuSmi) -> None:
    fake.set(0, aicore_cur_freq=None, hbm_bandwidth=None, power="NA", hbm_used_mb=None, health=None)
    reading = reader().read()[0]

    assert (reading.clock_hertz, reading.memory_utilization_ratio, reading.power_watts) == (None, None, None)
    assert (reading.memory_used_bytes, reading.healthy) == (None, None)  # the table prints NA for both
    assert reading.temperature_celsius == 45.0
    assert reading.memory_total_bytes == 65536.0 * MIB


def test_an_a3_server_has_two_chips_per_npu_named_by_logic_id_and_labelled_with_the_physical_id(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    chips = [
        chip(npu, die, 2 * npu + die, phy_id=8 + 2 * npu + die, name="Ascend910") for npu in (0, 1) for die in (0, 1)
    ]
    fake = FakeNpuSmi(tmp_path, monkeypatch, chips)
    fake.family = "910_93"  # -m and the table show Chip Phy-ID; the board lists no Chip Type
    fake.write()
    npu = reader()

    identities = npu.devices()
    assert [(one.device, one.labels["id"], one.labels["model_name"]) for one in identities] == [
        ("npu0", "8", ""),
        ("npu1", "9", ""),
        ("npu2", "10", ""),
        ("npu3", "11", ""),
    ]
    readings = npu.read()
    assert [(one.device, one.temperature_celsius, one.healthy) for one in readings] == [
        ("npu0", 45.0, True),
        ("npu1", 46.0, True),
        ("npu2", 47.0, True),
        ("npu3", 48.0, True),
    ]
    assert "npu-smi info -t common -i 1 -c 1" in asked(fake)
    assert "hccn_tool -i 11 -link -g" in asked(fake)  # hccn_tool takes the physical ID


# -- failures ----------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("command", "mode", "options", "message"),
    [
        ("info -t common", "exit", {"status": 255, "message": "Error: the device is busy."}, "exited with status 255"),
        ("info", "garbage", {}, "printed no table with a Health column"),
        ("info -t usages", "garbage", {}, r"printed none of HBM Bandwidth Usage Rate\(%\)"),
        ("info -t ecc", "flood", {}, "printed more than 256 KiB"),
        ("hccn_tool -link", "exit", {"status": 2}, "exited with status 2"),
    ],
)
def test_a_command_that_fails_raises_a_clear_error_and_the_next_reading_works(
    fake: FakeNpuSmi, command: str, mode: str, options: dict[str, Any], message: str
) -> None:
    npu = reader()
    npu.devices()
    fake.fail(command, mode, **options)

    with pytest.raises(CommandError, match=message):
        npu.read()
    fake.heal()
    assert [one.device for one in npu.read()] == ["npu0", "npu1"]


def test_identification_that_fails_raises_and_is_tried_again(fake: FakeNpuSmi) -> None:
    npu = reader()
    fake.fail("info -m", "garbage")
    with pytest.raises(CommandError, match="printed no `Chip Logic ID` table"):
        npu.devices()
    with pytest.raises(CommandError, match="printed no `Chip Logic ID` table"):
        npu.read()  # a reading needs the chips first
    fake.heal()
    assert [one.device for one in npu.devices()] == ["npu0", "npu1"]


def test_a_hung_command_is_killed_at_the_timeout_and_the_next_reading_works(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    fake = FakeNpuSmi(tmp_path, monkeypatch)  # one chip: five commands a reading
    npu = reader(timeout=3.0)
    npu.devices()
    fake.fail("info -t common", "hang", seconds=60)

    started = time.monotonic()
    with pytest.raises(CommandTimeout, match=r"still running when this reading's 3 s were up"):
        npu.read()
    assert time.monotonic() - started < 3.0 + 2.0
    hung = next(call["pid"] for call in fake.calls() if call["args"][:3] == ["info", "-t", "common"])
    with pytest.raises(ProcessLookupError):
        os.kill(hung, 0)  # killed and reaped, not left behind
    fake.heal()
    assert [one.device for one in npu.read()] == ["npu0"]


def test_a_missing_command_raises_on_use_and_build_makes_no_reader_without_one(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))  # an empty folder: no npu-smi anywhere
    assert build(SimpleNamespace(timeout=5.0)) == []
    assert build(SimpleNamespace(timeout=5.0, npu_smi="npu-smi-v2")) == []
    gone = NpuSmiReader(str(tmp_path / "npu-smi"), 5.0)
    with pytest.raises(CommandError, match="could not start"):
        gone.devices()


def test_build_finds_the_command_named_in_the_config(fake: FakeNpuSmi, tmp_path: Path) -> None:
    renamed = tmp_path / "bin" / "ascend-smi"
    renamed.parent.mkdir()
    renamed.symlink_to(Path(__file__).parents[1] / "support" / "fake_npu_smi" / "npu-smi")
    npu = reader(npu_smi=str(renamed))
    assert [one.device for one in npu.devices()] == ["npu0", "npu1"]
    assert asked(fake)[0] == "npu-smi info -m"


def test_the_table_of_an_older_npu_smi_reads_by_its_own_header() -> None:
    # Atlas 800 (910A) npu-smi 21: no Hugepages column, a Memory-Usage (DDR) column before HBM-Usage.
    table = parse_table(
        "| npu-smi 21.0.2                   Version: 21.0.2                                    |\n"
        "| NPU     Name                | Health        | Power(W)     Temp(C)                  |\n"
        "| Chip                        | Bus-Id        | AICore(%)    Memory-Usage(MB)  HBM-Usage(MB) |\n"
        "+=============================+===============+======================================+\n"
        "| 4       910A                | Alarm         | 65.6         58                       |\n"
        "| 0                           | 0000:86:00.0  | 0            1809 / 15079  12 / 32768 |\n"
    )
    assert table == {
        (4, 0): {
            "NPU": "4",
            "Name": "910A",
            "Health": "Alarm",
            "Power(W)": "65.6",
            "Temp(C)": "58",
            "Chip": "0",
            "Bus-Id": "0000:86:00.0",
            "AICore(%)": "0",
            "Memory-Usage(MB)": "1809/15079",
            "HBM-Usage(MB)": "12/32768",
        }
    }


# -- optional queries --------------------------------------------------------------------------------------------------
def test_a_chip_without_an_ecc_or_link_answer_at_start_has_no_such_series_and_is_not_asked_again(
    fake: FakeNpuSmi,
) -> None:
    fake.fail("hccn_tool -link", "exit")  # e.g. a card without a RoCE port
    fake.set(1, ecc_double_bit=None)  # a model whose ECC query has no HBM line
    npu = reader()
    npu.devices()
    fake.heal()
    before = len(fake.calls())

    first, second = npu.read()
    assert (first.link_up, second.link_up) == (None, None)
    assert (first.ecc_uncorrected_errors, second.ecc_uncorrected_errors) == (1.0, None)
    assert not any(command.startswith("hccn_tool") for command in asked(fake, before))
    assert "npu-smi info -t ecc -i 1 -c 0" not in asked(fake, before)


def test_without_hccn_tool_there_is_no_link_series(fake: FakeNpuSmi) -> None:
    npu = reader(hccn_tool="hccn_tool_not_installed")
    assert [one.link_up for one in npu.read()] == [None, None]
    assert not any(command.startswith("hccn_tool") for command in asked(fake))


def test_a_host_without_npus_reads_nothing_and_runs_nothing_after_the_mapping(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    fake = FakeNpuSmi(tmp_path, monkeypatch, [])
    npu = reader()
    assert (npu.devices(), npu.read(), npu.read()) == ([], [], [])
    assert asked(fake) == ["npu-smi info -m"]


# -- which NPUs --------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("environ", "chosen"),
    [
        ({}, ["npu0", "npu1", "npu2", "npu3"]),
        ({"ASCEND_RT_VISIBLE_DEVICES": "2,3"}, ["npu2", "npu3"]),
        ({"ASCEND_RT_VISIBLE_DEVICES": "2,3", "DEVICE_ID": "1"}, ["npu3"]),  # DEVICE_ID counts the visible ones
        ({"ASCEND_RT_VISIBLE_DEVICES": "1, 2,3"}, ["npu1"]),  # as CANN: the list ends at an entry that is no ID
        ({"ASCEND_RT_VISIBLE_DEVICES": "1,3,8"}, ["npu1", "npu3"]),  # or at one that names no device
        ({"ASCEND_RT_VISIBLE_DEVICES": "3", "ASCEND_VISIBLE_DEVICES": "0"}, ["npu3"]),  # the runtime's list first
        ({"ASCEND_VISIBLE_DEVICES": "1-2"}, ["npu1", "npu2"]),
        ({"DEVICE_ID": "2"}, ["npu2"]),
        ({"DEVICE_ID": "9"}, ["npu0", "npu1", "npu2", "npu3"]),  # out of range: not this host's numbering
    ],
)
def test_the_rank_reads_the_npus_the_environment_gives_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, environ: dict[str, str], chosen: list[str]
) -> None:
    fake = FakeNpuSmi(tmp_path, monkeypatch, [chip(npu) for npu in range(4)])
    npu = NpuSmiReader(
        str(Path(__file__).parents[1] / "support" / "fake_npu_smi" / "npu-smi"), TIMEOUT, environ=environ
    )

    assert [one.device for one in npu.devices()] == chosen
    before = len(fake.calls())
    assert [one.device for one in npu.read()] == chosen
    read_ids = {command.split(" -i ")[1].split()[0] for command in asked(fake, before) if " -i " in command}
    assert read_ids == {name.removeprefix("npu") for name in chosen}  # no command for another rank's NPU


def test_the_process_environment_chooses_when_none_is_given(fake: FakeNpuSmi, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ASCEND_RT_VISIBLE_DEVICES", "1")
    assert [one.device for one in reader().devices()] == ["npu1"]


def test_a_container_that_renumbered_its_npus_takes_them_in_order_with_their_physical_ids(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    FakeNpuSmi(tmp_path, monkeypatch, [chip(0), chip(1)])  # the container sees logic IDs 0 and 1 ...
    monkeypatch.setenv("ASCEND_VISIBLE_DEVICES", "4,5")  # ... which are the host's NPUs 4 and 5
    monkeypatch.setenv("DEVICE_ID", "1")

    assert [(one.device, one.labels["id"]) for one in reader().devices()] == [("npu1", "5")]


# -- driven by the hardware monitor ------------------------------------------------------------------------------------
families = pytest.mark.skipif(
    not hasattr(c, "DEVICE_TEMPERATURE"),
    reason="the hardware families (catalogue.DEVICE_TEMPERATURE ...) are not in core/catalogue.py yet",
)


def monitored(readers: list[HardwareReader], timeout: float) -> tuple[Any, MetricStore]:
    from ms_exporter.features.hardware.monitor import HardwareMonitor  # imports the hardware families

    store = MetricStore()
    errors = ErrorSink(store)
    return HardwareMonitor(readers, store, 3600.0, timeout, Breaker(errors, store)), store


def values(store: MetricStore, family: Any) -> dict[str, float]:
    return {dict(series.labels).get("device", ""): series.value for series in store.series_of(family)}


def npu_errors(store: MetricStore) -> float:
    counted = {dict(series.labels)["component"]: series.value for series in store.series_of(c.ERRORS)}
    return counted.get("hardware.npu_smi", 0.0)


@families
def test_the_monitor_records_the_readings_and_the_join_labels_of_the_ranks_npu(
    fake: FakeNpuSmi, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("DEVICE_ID", "1")
    monitor, store = monitored(build(SimpleNamespace(timeout=TIMEOUT)), TIMEOUT)
    try:
        monitor.sample()
        wait_until(lambda: store.series_of(c.DEVICE_HEALTHY), 30, "the NPU's reading")  # the last family written
        assert values(store, c.DEVICE_TEMPERATURE) == {"npu1": 46.0}
        assert values(store, c.DEVICE_UTILIZATION) == {"npu1": 0.37}
        assert values(store, c.DEVICE_MEMORY_USED) == {"npu1": 3378.0 * MIB}
        assert values(store, c.DEVICE_CLOCK) == {"npu1": 1.65e9}
        assert values(store, c.DEVICE_LINK_UP) == {"npu1": 1.0}
        assert values(store, c.DEVICE_HEALTHY) == {"npu1": 1.0}
        (info,) = store.series_of(c.DEVICE_INFO)
        labels = dict(info.labels)
        assert (labels["device"], labels["id"], labels["model_name"]) == ("npu1", "1", "910B3-Ascend-V1")
        assert labels["pcie_bus_info"] == "0000:C1:00.0" and labels["gpu"] == ""
        assert npu_errors(store) == 0
    finally:
        monitor.close()


@families
def alive(pid: int) -> bool:
    """Whether the process runs (a zombie waiting for a parent that does not reap it has ended)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as handle:
            return handle.read().rpartition(b")")[2].split()[0] not in (b"Z", b"X")
    except OSError:
        return False


def test_a_hung_npu_smi_is_switched_off_after_three_timeouts_and_leaves_no_process_behind(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    fake = FakeNpuSmi(tmp_path, monkeypatch)
    npu = reader(timeout=3.0)  # one hardware.timeout, as build() gives the reader and the monitor alike
    npu.devices()
    monitor, store = monitored([npu], timeout=3.0)
    slowest = 0.0

    def sample() -> bool:
        nonlocal slowest
        began = time.monotonic()
        monitor.sample()
        slowest = max(slowest, time.monotonic() - began)
        return any(dict(s.labels)["component"] == "hardware.npu_smi" for s in store.series_of(c.COMPONENT_DISABLED))

    try:
        wait_until(lambda: (sample(), values(store, c.DEVICE_TEMPERATURE))[1], 30, "a first reading")
        fake.fail("info", "hang", seconds=120, orphan=True)  # each npu-smi leaves a setsid child, then hangs
        wait_until(sample, 90, "npu-smi to be switched off", every=0.05)
        assert npu_errors(store) == 3
        assert slowest < 0.5  # the caller never waited on npu-smi
        assert "hardware.npu_smi failed 3 times in a row and is switched off" in caplog.text
        hung = len([call for call in fake.calls() if call["args"] == ["info"]])
        for _ in range(5):
            sample()
        assert len([call for call in fake.calls() if call["args"] == ["info"]]) == hung  # never asked again
        assert values(store, c.DEVICE_TEMPERATURE) == {}  # its last reading is not shown as current
        assert len(store.series_of(c.DEVICE_INFO)) == 1
    finally:
        monitor.close()
    started = [call["pid"] for call in fake.calls() if call["args"] == ["info"] or call["tool"] == "orphan"]
    orphans = [call["pid"] for call in fake.calls() if call["tool"] == "orphan"]
    assert len(orphans) >= 3
    wait_until(lambda: not any(alive(pid) for pid in started), 10, "every npu-smi and every child it left to end")


# -- which file runs -------------------------------------------------------------------------------------------------
def _tool(directory: Path, name: str = "npu-smi", mode: int = 0o755) -> Path:
    directory.mkdir(exist_ok=True)
    tool = directory / name
    tool.write_text("#!/bin/sh\nexit 0\n")
    tool.chmod(mode)
    return tool


def test_device_tools_are_found_only_in_directories_no_other_user_can_write(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    shared, group, own, work = (tmp_path / name for name in ("shared", "group", "own", "work"))
    _tool(shared).parent.chmod(0o1777)  # like /tmp: sticky, but anyone may add a file
    _tool(group).parent.chmod(0o775)
    os.chown(group, -1, 4242)  # a group other than root's
    _tool(work)
    trusted = _tool(own)
    monkeypatch.chdir(work)
    monkeypatch.setattr("ms_exporter.features.hardware.command.KNOWN_LOCATIONS", ())
    path = os.pathsep.join([str(shared), "", ".", "work", str(group), str(own)])
    assert trusted_command("npu-smi", {"PATH": path}) == str(trusted)
    assert trusted_command("npu-smi", {"PATH": os.pathsep.join([str(shared), "", str(group)])}) is None
    for why in ("is writable by every user", "an empty PATH entry", "the relative PATH entry '.'", "by group 4242"):
        assert why in caplog.text
    _tool(own, mode=0o777)  # a trusted directory, but a file anyone may rewrite
    assert trusted_command("npu-smi", {"PATH": str(own)}) is None
    assert trusted_command("./work/npu-smi", {"PATH": str(own)}) is None  # relative: refused
    assert trusted_command(str(shared / "npu-smi"), {"PATH": ""}) == str(shared / "npu-smi")  # the config named it


def test_a_device_tool_off_path_is_found_where_the_driver_installs_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    installed = _tool(tmp_path / "Ascend-driver-tools", "hccn_tool")
    monkeypatch.setattr("ms_exporter.features.hardware.command.KNOWN_LOCATIONS", (str(installed.parent),))
    assert trusted_command("hccn_tool", {"PATH": "/nonexistent"}) == str(installed)
