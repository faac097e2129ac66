"""Adversary cases for who may read a rank and what the operator tools read: a wrong-password flood from many
addresses while a rank restarts, and an event file swapped for a link to a FIFO under `ms-exporter triage`.

Every part runs in a process of its own (`python -m benchmarks.adversary_access ROLE ...`):
    serve PORT SCRATCH          a rank's endpoint (bcrypt user from SCRATCH/users.json) until SIGTERM
    flood PORT SCRATCH          wrong passwords, each from a new 127.x.y.z address, until SIGTERM
    triage-swapped DIR FIFO     `ms-exporter triage DIR`, each event file swapped for a link to FIFO once opened
"""

from __future__ import annotations

import base64
import contextlib
import http.client
import itertools
import json
import os
import signal
import socket
import struct
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from benchmarks.adversary import Case

ROOT = Path(__file__).resolve().parents[1]
USER, PASSWORD = "prometheus", "scrape-me-please"
TRUSTED_FILE = "ms_exporter-scrapers-rank0.json"  # as sinks/prometheus.py names rank 0's
HONEST = "127.0.0.1"  # the scraper's address; the flood's start at 127.1.0.1
FLOOD_RATE = 180.0  # requests a second, each from a new address: the finding's 1,100 in 6 s
FLOOD_THREADS = 8
LOCKED_OUT_SECONDS = 45.0  # how long the scraper tries before the case calls it locked out
IN_WITHIN_SECONDS = 20.0  # the promise: one turn of the ration (2 s) and a retry, with a loaded machine's slack
THROUGHOUT_SECONDS = 8.0  # scrapes after the first login, the flood still on
_START_SECONDS = 60.0  # a child's import and start on a loaded 2-core machine
TRIAGE_TIMEOUT = 60.0


# -- a password flood from many addresses -----------------------------------------------------------------------


def _basic(user: str, password: str) -> str:
    return "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()


def _serve(port: int, scratch: Path) -> None:
    from ms_exporter.config import WebConfig
    from ms_exporter.core.store import MetricStore
    from ms_exporter.sinks.prometheus import PrometheusEndpoint

    users = json.loads((scratch / "users.json").read_text())
    errors: list[str] = []
    endpoint = PrometheusEndpoint(
        MetricStore(),
        "127.0.0.1",
        port,
        lambda component, exc: errors.append(f"{component}: {exc}"),
        WebConfig(basic_auth_users=users),
        trusted_file=scratch / TRUSTED_FILE,
    )
    if endpoint.port != port:
        endpoint.close()
        raise SystemExit(f"port {port} was taken")
    stopped = threading.Event()
    signal.signal(signal.SIGTERM, lambda signum, frame: stopped.set())
    print("serving", flush=True)
    stopped.wait()
    endpoint.close()
    print(json.dumps({"errors": errors}), flush=True)


def _flood_addresses() -> Iterator[str]:
    """127.1.0.1, 127.1.0.2, ...: a new loopback address each time (.0 and .255 left out)."""
    for high, middle, low in itertools.product(range(1, 255), range(256), range(1, 255)):
        yield f"127.{high}.{middle}.{low}"


def _flood(port: int, scratch: Path) -> None:
    """One request each from a new address, with a new wrong password, sent and left (its 401 is not awaited: an
    attacker need not wait); FLOOD_RATE a second over FLOOD_THREADS threads, until SIGTERM."""
    stopped = threading.Event()
    signal.signal(signal.SIGTERM, lambda signum, frame: stopped.set())
    addresses = _flood_addresses()
    lock = threading.Lock()
    counts = {"connected": 0, "refused": 0}
    every = FLOOD_THREADS / FLOOD_RATE

    def worker() -> None:
        next_at = time.monotonic()
        while not stopped.is_set():
            with lock:
                source = next(addresses)
                attempt = counts["connected"] + counts["refused"]
            head = (
                f"GET /metrics HTTP/1.1\r\nHost: rank\r\nAuthorization: {_basic(USER, f'guess-{attempt}')}\r\n\r\n"
            ).encode()
            try:
                with socket.create_connection(("127.0.0.1", port), timeout=2, source_address=(source, 0)) as sock:
                    sock.sendall(head)
                    sock.shutdown(socket.SHUT_WR)
                with lock:
                    counts["connected"] += 1
            except OSError:
                with lock:
                    counts["refused"] += 1  # the rank is down (restarting): an attacker keeps trying
            next_at += every
            stopped.wait(max(0.0, next_at - time.monotonic()))

    threads = [threading.Thread(target=worker, daemon=True) for _ in range(FLOOD_THREADS)]
    for thread in threads:
        thread.start()
    while not stopped.wait(0.2):
        with lock:
            (scratch / "flood.json").write_text(json.dumps(counts))
    for thread in threads:
        thread.join(10)
    with lock:
        (scratch / "flood.json").write_text(json.dumps(counts))


def _child(scratch: Path, *args: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "benchmarks.adversary_access", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )


def _started(server: subprocess.Popen[str]) -> None:
    assert server.stdout is not None
    line = server.stdout.readline()  # "serving", or nothing when it failed (its stderr says why)
    if line.strip() != "serving":
        server.kill()
        raise RuntimeError(f"the endpoint did not start: {server.communicate(timeout=30)[1][-2000:]}")


def _stop(process: subprocess.Popen[str]) -> str:
    process.send_signal(signal.SIGTERM)
    try:
        return process.communicate(timeout=30)[0]
    except subprocess.TimeoutExpired:
        process.kill()
        return process.communicate(timeout=30)[0]


def _scrape(port: int, timeout: float = 3.0) -> int:
    """The honest scraper's GET /metrics from its own address on a new connection; 0 when it got no answer."""
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout, source_address=(HONEST, 0))
    try:
        connection.request("GET", "/metrics", headers={"Authorization": _basic(USER, PASSWORD)})
        response = connection.getresponse()
        response.read()
        return response.status
    except (OSError, http.client.HTTPException):
        return 0
    finally:
        connection.close()


def _until_in(port: int, patience: float) -> float | None:
    """Seconds until the scraper's first 200 (a try every half second), None if not within `patience`."""
    began = time.monotonic()
    while time.monotonic() - began < patience:
        if _scrape(port) == 200:
            return time.monotonic() - began
        time.sleep(0.5)
    return None


def _flood_counts(scratch: Path) -> dict[str, int]:
    with contextlib.suppress(OSError, ValueError):
        return dict(json.loads((scratch / "flood.json").read_text()))
    return {"connected": 0, "refused": 0}


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def run_password_flood(scratch: Path) -> dict[str, Any]:
    """The rank serves its scraper once, then restarts on its port while wrong passwords come from a new address
    each, 180 a second; the scraper keeps trying from its address. Observed: the seconds to its first 200 after
    the restart, and its scrapes after that with the flood still on."""
    import bcrypt

    (scratch / "users.json").write_text(
        json.dumps({USER: bcrypt.hashpw(PASSWORD.encode(), bcrypt.gensalt(10)).decode()})
    )
    port = _free_port()
    facts: dict[str, Any] = {"port": port}
    server = _child(scratch, "serve", str(port), str(scratch))
    flood: subprocess.Popen[str] | None = None
    try:
        _started(server)
        facts["first_start_in_seconds"] = _until_in(port, _START_SECONDS)  # no flood yet: one bcrypt check
        trusted = scratch / TRUSTED_FILE
        facts["trusted_file"] = json.loads(trusted.read_text()) if trusted.exists() else None
        facts["first_process"] = json.loads(_stop(server).splitlines()[-1])
        flood = _child(scratch, "flood", str(port), str(scratch))
        server = _child(scratch, "serve", str(port), str(scratch))  # the rank restarts on its fixed port
        _started(server)
        restarted = _flood_counts(scratch)["connected"]
        deadline = time.monotonic() + _START_SECONDS
        # The scraper comes back after the flood has filled the restarted rank's queue of bcrypt claims.
        while _flood_counts(scratch)["connected"] - restarted < 600 and time.monotonic() < deadline:
            time.sleep(0.1)
        facts["flood_before_scraper"] = _flood_counts(scratch)["connected"] - restarted
        facts["in_after_restart_seconds"] = _until_in(port, LOCKED_OUT_SECONDS)
        statuses = []
        until = time.monotonic() + THROUGHOUT_SECONDS
        while facts["in_after_restart_seconds"] is not None and time.monotonic() < until:
            statuses.append(_scrape(port, timeout=5.0))
            time.sleep(0.25)
        facts["throughout"] = {"scrapes": len(statuses), "ok": statuses.count(200)}
        facts["flood"] = _flood_counts(scratch)
    finally:
        if flood is not None:
            _stop(flood)
        facts["second_process"] = json.loads((_stop(server).splitlines() or ["{}"])[-1])
    facts["flood"] = _flood_counts(scratch)
    return facts


def password_flood_holds(facts: dict[str, Any]) -> bool:
    seconds = facts.get("in_after_restart_seconds")
    throughout = facts.get("throughout", {})
    return (
        facts.get("trusted_file") == {"trusted": [HONEST]}
        and facts.get("flood_before_scraper", 0) >= 600
        and seconds is not None
        and seconds <= IN_WITHIN_SECONDS
        and throughout.get("scrapes", 0) > 0
        and throughout.get("ok") == throughout.get("scrapes")
    )


def password_flood_shown(facts: dict[str, Any]) -> str:
    seconds = facts.get("in_after_restart_seconds")
    login = f"in {seconds:.1f} s after the restart" if seconds is not None else f"locked out > {LOCKED_OUT_SECONDS:g} s"
    throughout = facts.get("throughout", {})
    return (
        f"{facts.get('flood', {}).get('connected', 0)} flood requests from as many addresses; the scraper {login}, "
        f"then {throughout.get('ok', 0)}/{throughout.get('scrapes', 0)} scrapes ok"
    )


# -- triage and an event file swapped for a link to a FIFO -----------------------------------------------------


def _event_file(path: Path, losses: list[float]) -> None:
    """An event file as TensorBoard writers lay it out: TFRecords (length, its masked CRC, the data, its CRC) of
    Event messages, a version record first, one `loss` scalar per step."""
    try:
        from tensorboard.compat.proto.event_pb2 import Event
        from tensorboard.compat.proto.summary_pb2 import Summary
        from tensorboard.compat.tensorflow_stub.pywrap_tensorflow import masked_crc32c
    except ImportError:
        from tensorboardX.proto.event_pb2 import Event
        from tensorboardX.proto.summary_pb2 import Summary
        from tensorboardX.record_writer import masked_crc32c

    def record(event: Any) -> bytes:
        data: bytes = event.SerializeToString()
        header = struct.pack("<Q", len(data))
        return header + struct.pack("<I", masked_crc32c(header)) + data + struct.pack("<I", masked_crc32c(data))

    start = time.time() - len(losses)
    records = [record(Event(wall_time=start, file_version="brain.Event:2"))]
    for step, loss in enumerate(losses, start=1):
        summary = Summary(value=[Summary.Value(tag="loss", simple_value=loss)])
        records.append(record(Event(wall_time=start + step, step=step, summary=summary)))
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(b"".join(records))


def _triage_swapped(directory: str, fifo: str) -> int:
    """`ms-exporter triage DIRECTORY`, where every event file is replaced by a link to `fifo` right after the
    triage opened it: the moment between its check and any second open by name, made certain."""
    from ms_exporter import cli
    from ms_exporter.tools import triage

    checked_open: Callable[..., int] = triage.open_regular
    swapped: list[str] = []

    def open_then_swap(path: Any, *args: Any, **kwargs: Any) -> int:
        fd = checked_open(path, *args, **kwargs)
        if "tfevents" in Path(path).name:
            link = Path(path).with_name(".swap")
            link.symlink_to(fifo)
            os.replace(link, path)
            swapped.append(str(path))
        return fd

    triage.open_regular = open_then_swap
    code = cli.main(["triage", directory])
    print(json.dumps({"swapped": swapped}), flush=True)
    return code


def run_triage_fifo(scratch: Path) -> dict[str, Any]:
    """A run's TensorBoard events, and a FIFO nobody writes to; triage runs as a child process and its event file
    becomes a link to the FIFO once the triage has opened and checked it."""
    runs = scratch / "runs"
    steps = 40
    _event_file(
        runs / "tensorboard" / "swapped-run" / "rank0" / "events.out.tfevents.1.host",
        [1.0 / s for s in range(1, steps + 1)],
    )
    fifo = scratch / "fifo"
    os.mkfifo(fifo)
    began = time.monotonic()
    child = _child(scratch, "triage-swapped", str(runs), str(fifo))
    facts: dict[str, Any] = {"steps_written": steps}
    try:
        out, err = child.communicate(timeout=TRIAGE_TIMEOUT)
        facts["timed_out"] = False
    except subprocess.TimeoutExpired:
        child.kill()
        out, err = child.communicate(timeout=30)
        facts["timed_out"] = True
    facts["seconds"] = round(time.monotonic() - began, 1)
    facts["rc"] = child.returncode
    lines = out.splitlines()
    facts["swapped"] = len(json.loads(lines[-1])["swapped"]) if lines and lines[-1].startswith("{") else 0
    row = [line for line in lines if "swapped-run" in line]
    facts["row"] = row[0].strip() if row else None
    facts["read_steps"] = bool(row) and f" {steps} " in f" {row[0]} "
    facts["stderr"] = err[-500:]
    return facts


def triage_fifo_holds(facts: dict[str, Any]) -> bool:
    return not facts["timed_out"] and facts["rc"] == 0 and facts["swapped"] >= 1 and facts["read_steps"]


def triage_fifo_shown(facts: dict[str, Any]) -> str:
    if facts["timed_out"]:
        return f"hung: killed after {TRIAGE_TIMEOUT:g} s"
    read = f"its {facts['steps_written']} steps read" if facts["read_steps"] else "the run not read"
    return f"swapped {facts['swapped']} file(s); triage ended in {facts['seconds']:g} s (rc {facts['rc']}), {read}"


CASES: tuple[Case, ...] = (
    Case(
        "password-flood",
        "a rank restarts on its port while wrong passwords come at 180/s, each from a new 127.x.y.z address "
        "(one bcrypt claim each), and its scraper comes back with the right password",
        "the scraper is in within one turn of the bcrypt ration and a retry, and stays in, however many addresses",
        run_password_flood,
        password_flood_holds,
        password_flood_shown,
    ),
    Case(
        "triage-fifo",
        "a swept TensorBoard event file is replaced by a link to a FIFO right after `ms-exporter triage` checked it",
        "triage reads what it checked, through the checked descriptor, and ends; it never opens the FIFO",
        run_triage_fifo,
        triage_fifo_holds,
        triage_fifo_shown,
    ),
)


def main(argv: list[str]) -> int:
    role, *args = argv
    if role == "serve":
        _serve(int(args[0]), Path(args[1]))
    elif role == "flood":
        _flood(int(args[0]), Path(args[1]))
    elif role == "triage-swapped":
        return _triage_swapped(args[0], args[1])
    else:
        raise SystemExit(f"unknown role {role}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
