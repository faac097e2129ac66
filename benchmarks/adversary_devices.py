"""Adversary cases for the device readers: a sick GPU's nvmlShutdown, a reader that fails for good, a hung npu-smi
that leaves a setsid child, and an npu-smi planted where another local user can write.

Each `run` plays its scenario for real in an empty scratch directory: real child Pythons, real npu-smi processes
(small scripts written to the scratch directory), a real PATH and working directory. NVML is not here: the child
that closes it uses the scripted binding of tests/support/fake_nvml.py, loaded from the checkout by path in the
child, made to hang in nvmlShutdown.

    python -m benchmarks.adversary_devices nvml-child SCRATCH MODE      the child of `nvml_shutdown_hangs`
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

from benchmarks.adversary import Case

REPO = Path(__file__).resolve().parent.parent
TIMEOUT = 1.0  # hardware.timeout in the scenarios: the bound every hang is held to
EXIT_BOUND = 20.0  # seconds from "closing" to the child's exit that a bounded close keeps, load and all
CHILD_LIMIT = 90.0  # a child still running after this long is killed (and reported as never ending)
HANG_SECONDS = 300  # how long a hung npu-smi (and the child it leaves) would sleep if nobody killed them


# -- 3: nvmlShutdown hangs at exit -------------------------------------------------------------------------------------
def _nvml_child(scratch: str, mode: str) -> None:
    """A monitor on one scripted GPU whose nvmlShutdown hangs; it says when it starts closing, then closes by `mode`:
    `explicit` (close() then return) or `atexit` (return, and let the interpreter's exit close it)."""
    sys.path.insert(0, str(REPO))
    from tests.support.fake_nvml import FakeGpu, FakeNvml

    fake = FakeNvml([FakeGpu(uuid="GPU-5fd4c9e1-0b5e-2f6a-8e4c-1c2d3e4f5a60")], shutdown_hangs=True)
    sys.modules["pynvml"] = fake.module()
    from ms_exporter import TrainingMonitor
    from ms_exporter.features.hardware.monitor import HardwareMonitor

    monitor = TrainingMonitor(
        backend=["local"],
        save_dir=scratch,
        hardware={"readers": ["nvml"], "interval": 0.5, "timeout": TIMEOUT},
    )
    hardware = monitor.part_of(HardwareMonitor)
    assert hardware is not None, "no NVML reader: the scripted binding was not used"
    hardware.sample()  # one reading, as at train begin
    deadline = time.monotonic() + 30
    while any(worker.busy_since is not None for worker in hardware._readers) and time.monotonic() < deadline:
        time.sleep(0.05)
    print(json.dumps({"closing": True, "shutdown_calls": fake.shutdown_calls}), flush=True)
    if mode == "explicit":
        monitor.close()
        print(json.dumps({"closed": True}), flush=True)


def _exit_seconds(scratch: Path, mode: str) -> dict[str, Any]:
    """Runs one child; the seconds from its "closing" line to its exit, None if it did not exit within the limit."""
    (scratch / mode).mkdir()
    process = subprocess.Popen(
        [sys.executable, "-m", "benchmarks.adversary_devices", "nvml-child", str(scratch / mode), mode],
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    closing: list[float] = []
    lines: list[str] = []

    def read() -> None:
        assert process.stdout is not None
        for line in process.stdout:
            lines.append(line)
            if '"closing"' in line:
                closing.append(time.monotonic())

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    try:
        rc: int | None = process.wait(timeout=CHILD_LIMIT)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()
        rc = None
    ended = time.monotonic()
    reader.join(5)
    stderr = process.stderr.read() if process.stderr is not None else ""
    return {
        "rc": rc,
        "seconds": round(ended - closing[0], 2) if closing and rc is not None else None,
        "closed_line": any('"closed"' in line for line in lines),
        "stderr_tail": stderr[-400:] if rc != 0 else "",
    }


def _run_nvml(scratch: Path) -> dict[str, Any]:
    return {mode: _exit_seconds(scratch, mode) for mode in ("atexit", "explicit")}


def _nvml_holds(facts: dict[str, Any]) -> bool:
    return all(
        run["rc"] == 0 and run["seconds"] is not None and run["seconds"] < EXIT_BOUND
        for run in (facts["atexit"], facts["explicit"])
    ) and bool(facts["explicit"]["closed_line"])


def _nvml_shown(facts: dict[str, Any]) -> str:
    def one(run: dict[str, Any]) -> str:
        return "never" if run["seconds"] is None else f"{run['seconds']:.1f} s (rc {run['rc']})"

    return f"exit after atexit close {one(facts['atexit'])}, after close() {one(facts['explicit'])}"


# -- 8: a reader switched off leaves no frozen reading -----------------------------------------------------------------
def _run_stale(scratch: Path) -> dict[str, Any]:
    """An Ascend-like reader reads 91 C, healthy, link up, then fails for good: what stays on the rank's page."""
    from ms_exporter.core import catalogue as c
    from ms_exporter.core.errors import Breaker, ErrorSink
    from ms_exporter.core.store import MetricStore
    from ms_exporter.features.hardware.monitor import HardwareMonitor

    store = MetricStore((("rank", "0"), ("project", "adversary")))
    reader = _fails_for_good()
    monitor = HardwareMonitor([reader], store, 3600.0, TIMEOUT, Breaker(ErrorSink(store), store))
    try:
        monitor.sample()
        _settle(monitor)
        before = _device_readings(store)
        reader.broken = True
        rounds = 0
        while rounds < 10 and "hardware.npu_smi" not in {
            dict(s.labels)["component"] for s in store.series_of(c.COMPONENT_DISABLED)
        }:
            monitor.sample()
            _settle(monitor)
            rounds += 1
        disabled = rounds < 10
        after = _device_readings(store)
        info = len(store.series_of(c.DEVICE_INFO))
    finally:
        monitor.close()
    return {"before": before, "disabled": disabled, "failed_readings": rounds, "after": after, "info_series": info}


def _fails_for_good() -> Any:
    """An npu_smi reader of one device that reads 91 C, healthy, link up until `broken` is set, then only fails."""
    from ms_exporter.core.device.reading import DeviceIdentity, DeviceReading, HardwareReader

    class FailsForGood(HardwareReader):
        name = "npu_smi"
        broken = False

        def devices(self) -> list[DeviceIdentity]:
            return [DeviceIdentity("npu0", {"id": "0", "vdie_id": "185011D4-21104518-A0C4ED94-14CC040A-56102003"})]

        def read(self) -> list[DeviceReading]:
            if self.broken:
                raise RuntimeError("npu-smi: dcmi module initialize failed")
            return [DeviceReading("npu0", temperature_celsius=91.0, healthy=True, link_up=True)]

    return FailsForGood()


def _device_readings(store: Any) -> dict[str, float]:
    """The device's temperature, health and link series on the page, by family name."""
    from ms_exporter.core import catalogue as c

    found = {}
    for family in (c.DEVICE_TEMPERATURE, c.DEVICE_HEALTHY, c.DEVICE_LINK_UP):
        for series in store.series_of(family):
            found[family.name] = series.value
    return found


def _settle(monitor: Any) -> None:
    """Waits (30 s at most) until no reader of the monitor is busy."""
    deadline = time.monotonic() + 30
    while any(worker.busy_since is not None for worker in monitor._readers) and time.monotonic() < deadline:
        time.sleep(0.02)


def _stale_holds(facts: dict[str, Any]) -> bool:
    return bool(facts["before"]) and facts["disabled"] and facts["after"] == {} and facts["info_series"] == 1


def _stale_shown(facts: dict[str, Any]) -> str:
    after = ", ".join(
        f"{name.removeprefix('mindspore_train_device_')} {value:g}" for name, value in facts["after"].items()
    )
    return f"switched off after {facts['failed_readings']} failed readings; left on the page: {after or 'none'}"


# -- 13: a hung npu-smi that leaves a setsid child --------------------------------------------------------------------
HUNG_NPU_SMI = """#!{python}
import os, sys, time
with open({log!r}, "a") as log:
    log.write(f"{{os.getpid()}}\\n")
if os.fork() == 0:
    os.setsid()  # a helper in a session of its own: out of npu-smi's process group
    with open({log!r}, "a") as log:
        log.write(f"{{os.getpid()}}\\n")
    time.sleep({seconds})
    os._exit(0)
time.sleep({seconds})
"""


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat", "rb") as handle:
            return handle.read().rpartition(b")")[2].split()[0] not in (b"Z", b"X")
    except OSError:
        return False


def _run_hung(scratch: Path) -> dict[str, Any]:
    from ms_exporter.core.errors import Breaker, ErrorSink
    from ms_exporter.core.store import MetricStore
    from ms_exporter.features.hardware.monitor import HardwareMonitor
    from ms_exporter.features.hardware.npu_smi import NpuSmiReader

    log = scratch / "pids"
    tool = _hung_npu_smi(scratch, log)
    store = MetricStore((("rank", "0"), ("project", "adversary")))
    monitor = HardwareMonitor(
        [NpuSmiReader(str(tool), timeout=TIMEOUT, hccn_tool=None)],
        store,
        3600.0,
        TIMEOUT,
        Breaker(ErrorSink(store), store),
    )
    began = time.monotonic()
    try:
        while time.monotonic() - began < 40 and not _npu_smi_counted(store)[1]:
            monitor.sample()
            time.sleep(0.1)
        timeouts, disabled = _npu_smi_counted(store)
        switched_off_after = round(time.monotonic() - began, 1)
        runs_before = len(log.read_text().split()) if log.exists() else 0
        for _ in range(10):  # a switched-off reader is never asked again
            monitor.sample()
            time.sleep(0.05)
    finally:
        monitor.close()
    pids, left = _reap(log)
    return {
        "timeouts": timeouts,
        "disabled": disabled,
        "seconds_to_off": switched_off_after,
        "processes_started": len(pids),
        "started_after_off": len(pids) - runs_before,
        "processes_left": len(left),
    }


def _hung_npu_smi(scratch: Path, log: Path) -> Path:
    """SCRATCH/bin/npu-smi: HUNG_NPU_SMI, writing the pids it starts to `log`."""
    tool = scratch / "bin" / "npu-smi"
    tool.parent.mkdir()
    tool.write_text(HUNG_NPU_SMI.format(python=sys.executable, log=str(log), seconds=HANG_SECONDS))
    tool.chmod(0o755)
    return tool


def _npu_smi_counted(store: Any) -> tuple[float, bool]:
    """The npu_smi reader's errors counted, and whether it is switched off."""
    from ms_exporter.core import catalogue as c

    errors = {dict(s.labels)["component"]: s.value for s in store.series_of(c.ERRORS)}
    disabled = {dict(s.labels)["component"] for s in store.series_of(c.COMPONENT_DISABLED)}
    return errors.get("hardware.npu_smi", 0.0), "hardware.npu_smi" in disabled


def _reap(log: Path) -> tuple[list[int], list[int]]:
    """The processes the hung tool started (from `log`), and those still alive 15 s on, which are then killed."""
    pids = [int(word) for word in log.read_text().split()] if log.exists() else []
    deadline = time.monotonic() + 15
    while any(_alive(pid) for pid in pids) and time.monotonic() < deadline:
        time.sleep(0.1)
    left = [pid for pid in pids if _alive(pid)]
    for pid in left:  # the scenario's own processes: never leave them behind, whatever the verdict
        with contextlib.suppress(OSError):
            os.kill(pid, signal.SIGKILL)
    return pids, left


def _hung_holds(facts: dict[str, Any]) -> bool:
    return (
        bool(facts["disabled"])
        and facts["timeouts"] == 3
        and facts["processes_left"] == 0
        and facts["started_after_off"] == 0
        and facts["processes_started"] >= 2
    )


def _hung_shown(facts: dict[str, Any]) -> str:
    state = "switched off" if facts["disabled"] else "still on"
    return (
        f"{facts['timeouts']:g} timeouts, {state} after {facts['seconds_to_off']:g} s; "
        f"{facts['processes_left']} of {facts['processes_started']} processes left"
    )


# -- 12: an npu-smi planted in a world-writable PATH directory and in the working directory ---------------------------
PLANTED = """#!/bin/sh
touch {marker}
"""
PLANTED_CHILD = """
import json, logging, sys
logging.basicConfig(level=logging.INFO, stream=sys.stderr)
from ms_exporter.config import load_config
from ms_exporter.features.hardware import npu_smi
readers = npu_smi.build(load_config({}).hardware)
for reader in readers:
    try:
        reader.devices()
        reader.read()
    except Exception as exc:
        print("reader:", exc, file=sys.stderr)
print(json.dumps({"readers": len(readers), "commands": [getattr(r, "_command", None) for r in readers]}))
"""


def _run_planted(scratch: Path) -> dict[str, Any]:
    shared = scratch / "shared-bin"  # a directory every local user can write to, on the training user's PATH
    work = scratch / "work"  # the job's working directory, reached through an empty PATH entry
    facts: dict[str, Any] = {}
    for where, directory, path in (
        ("world-writable PATH entry", shared, f"{shared}{os.pathsep}/usr/bin{os.pathsep}/bin"),
        ("empty PATH entry (working directory)", work, f"/usr/bin{os.pathsep}{os.pathsep}/bin"),
    ):
        directory.mkdir(exist_ok=True)
        directory.chmod(0o777 if directory == shared else 0o755)
        marker = scratch / f"ran-{directory.name}"
        planted = directory / "npu-smi"
        planted.write_text(PLANTED.format(marker=marker))
        planted.chmod(0o755)
        env = {**os.environ, "PATH": path, "PYTHONPATH": str(REPO)}
        done = subprocess.run(
            [sys.executable, "-c", PLANTED_CHILD],
            cwd=work if directory == work else scratch,
            env=env,
            capture_output=True,
            text=True,
            timeout=CHILD_LIMIT,
        )
        said = json.loads(done.stdout.strip().splitlines()[-1]) if done.returncode == 0 else {}
        facts[where] = {
            "rc": done.returncode,
            "ran": marker.exists(),
            "readers": said.get("readers"),
            "refusal_logged": "not run" in done.stderr,
        }
        planted.unlink()
    return facts


def _planted_holds(facts: dict[str, Any]) -> bool:
    return all(
        run["rc"] == 0 and not run["ran"] and run["readers"] == 0 and run["refusal_logged"] for run in facts.values()
    )


def _planted_shown(facts: dict[str, Any]) -> str:
    return "; ".join(
        f"{where}: {'RAN' if run['ran'] else 'not run'}{', refusal logged' if run['refusal_logged'] else ''}"
        for where, run in facts.items()
    )


CASES: tuple[Case, ...] = (
    Case(
        "nvml_shutdown_hangs",
        "nvmlShutdown hangs (a sick GPU) when the monitor closes, at exit and by close()",
        f"the process still exits: the shutdown is waited for hardware.timeout at most (within {EXIT_BOUND:g} s here)",
        _run_nvml,
        _nvml_holds,
        _nvml_shown,
    ),
    Case(
        "stale_device_reading",
        "a device reader reads 91 C, healthy, link up, then fails for good",
        "it is switched off and its readings leave the page (the exporters' live ones take their place in the rules)",
        _run_stale,
        _stale_holds,
        _stale_shown,
    ),
    Case(
        "npu_smi_hangs_with_setsid_child",
        "npu-smi hangs on every call and leaves a child in a session of its own each time",
        "three timeouts switch the reader off; each hung npu-smi is killed with the child it left",
        _run_hung,
        _hung_holds,
        _hung_shown,
    ),
    Case(
        "planted_npu_smi",
        "another local user plants npu-smi in a world-writable PATH directory, or in the working directory",
        "it never runs: device tools come from trusted directories only, and the refusal is logged",
        _run_planted,
        _planted_holds,
        _planted_shown,
    ),
)


if __name__ == "__main__":
    if len(sys.argv) == 4 and sys.argv[1] == "nvml-child":
        _nvml_child(sys.argv[2], sys.argv[3])
    else:
        sys.exit(f"usage: python -m benchmarks.adversary_devices nvml-child SCRATCH MODE (cases: {REPO}/benchmarks)")
