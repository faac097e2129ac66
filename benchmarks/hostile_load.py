"""Hostile clients for `make reliability`, each in a process of its own (so the benchmark can pause it).

    python -m benchmarks.hostile_load slowloris HOST PORT N   # N sockets, each sending one header byte a second
    python -m benchmarks.hostile_load silent HOST PORT N      # N sockets that connect and never send
    python -m benchmarks.hostile_load scrape URL [USER:PASSWORD]  # a well-behaved scraper, 4 scrapes a second

Attackers reopen what the server closes, so the pressure never lets up. The scraper prints one JSON line of its
scrape latencies (seconds; a failed scrape counts as its 5 s timeout) when it gets SIGTERM.
"""

from __future__ import annotations

import base64
import json
import signal
import socket
import sys
import time
import urllib.request
from typing import Any

SCRAPE_EVERY = 0.25
SCRAPE_TIMEOUT = 5.0


def _open(host: str, port: int) -> socket.socket | None:
    try:
        sock = socket.create_connection((host, port), timeout=2)
        sock.setblocking(False)
        return sock
    except OSError:
        return None


def attack(mode: str, host: str, port: int, count: int) -> None:
    """Keep `count` connections open; in slowloris mode each drips one byte of an endless header a second."""
    sockets: list[socket.socket | None] = [None] * count
    request = b"GET /metrics HTTP/1.1\r\nHost: x\r\nX-Slow: "
    sent = [0] * count
    while True:
        for index in range(count):
            sock = sockets[index]
            if sock is None:
                sockets[index] = sock = _open(host, port)
                sent[index] = 0
                if sock is None:
                    continue
            try:
                if mode == "slowloris":
                    byte = request[sent[index] : sent[index] + 1] or b"a"
                    sock.send(byte)
                    sent[index] += 1
                elif sock.recv(1, socket.MSG_PEEK) == b"":  # silent: has the server closed it?
                    raise ConnectionResetError
            except BlockingIOError:
                pass  # silent and still open
            except OSError:
                sock.close()
                sockets[index] = None
        time.sleep(1.0)


def scrape(url: str, credentials: str | None) -> None:
    latencies: list[float] = []
    stopping = False

    def stop(*_: Any) -> None:
        nonlocal stopping
        stopping = True

    signal.signal(signal.SIGTERM, stop)
    headers = {"Authorization": "Basic " + base64.b64encode(credentials.encode()).decode()} if credentials else {}
    while not stopping:
        began = time.perf_counter()
        try:
            with urllib.request.urlopen(
                urllib.request.Request(url, headers=headers), timeout=SCRAPE_TIMEOUT
            ) as response:
                ok = response.status == 200 and b"mindspore_train_steps_total" in response.read()
        except OSError:
            ok = False
        latencies.append(time.perf_counter() - began if ok else SCRAPE_TIMEOUT)
        time.sleep(max(0.0, SCRAPE_EVERY - (time.perf_counter() - began)))
    print(json.dumps({"latencies": latencies}), flush=True)


def main(argv: list[str]) -> int:
    if argv[0] == "scrape":
        scrape(argv[1], argv[2] if len(argv) > 2 else None)
    else:
        attack(argv[0], argv[1], int(argv[2]), int(argv[3]))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
