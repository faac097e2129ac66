"""Test helpers for real servers: a free loopback port, and polling with a deadline instead of sleeping."""

from __future__ import annotations

import socket
import time
from typing import Any


def free_port(count: int = 1) -> int:
    """A loopback port p such that p .. p+count-1 are all free (a base port for `count` ranks)."""
    for _ in range(100):
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            base = int(probe.getsockname()[1])
        if base + count > 65535:
            continue
        try:
            for offset in range(1, count):
                with socket.socket() as other:
                    other.bind(("127.0.0.1", base + offset))
            return base
        except OSError:
            continue
    raise RuntimeError("no free port range")


def wait_until(
    condition: Any,
    seconds: float,
    what: str,
    every: float = 0.1,
    tolerate: tuple[type[Exception], ...] = (OSError,),
) -> Any:
    """condition() until it returns something true (an exception of `tolerate` counts as not yet: by default an
    OSError, a server not up yet), or fail after `seconds` naming `what` was awaited."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        try:
            result = condition()
        except tolerate:  # a server not up yet, or gone for a moment; an answer not complete yet: ask again
            result = None
        if result:
            return result
        time.sleep(every)
    raise AssertionError(f"timed out after {seconds:.0f} s waiting for {what}")
