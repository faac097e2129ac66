"""Test helpers for real servers: a free loopback port, and polling with a deadline instead of sleeping."""

from __future__ import annotations

import socket
import time
from typing import Any


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def wait_until(condition: Any, seconds: float, what: str, every: float = 0.1) -> Any:
    """condition() until it returns something true, or fail after `seconds` naming `what` was awaited."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        result = condition()
        if result:
            return result
        time.sleep(every)
    raise AssertionError(f"timed out after {seconds:.0f} s waiting for {what}")
