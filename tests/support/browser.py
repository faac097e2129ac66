"""Test helper: Debian's Chromium, headless, loading a page of ours and giving back its DOM or a screenshot."""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from pathlib import Path

# Screenshots are kept for a human to look at, outside the checkout: tests/conftest.py names a folder in the
# session's temporary directory; run alone, the system's temporary directory.
ARTIFACTS_VARIABLE = "TESTS_ARTIFACTS_DIR"


def artifacts() -> Path:
    return Path(os.environ.get(ARTIFACTS_VARIABLE) or Path(tempfile.gettempdir()) / "ms_exporter_test_artifacts")


# What the machine's closed network needs: without the background-networking flags Chromium keeps trying to reach
# Google's hosts; a fresh profile per call keeps runs independent.
FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--disable-default-apps",
    "--mute-audio",
]


def chromium() -> str:
    found = shutil.which("chromium") or shutil.which("chromium-browser")
    if found is None:
        raise RuntimeError("Chromium is not installed: `make test` installs Debian's chromium package")
    return found


def _run(url: str, extra: list[str], budget_ms: int) -> subprocess.CompletedProcess[str]:
    with tempfile.TemporaryDirectory(prefix="ms_exporter_chromium_") as profile:
        return subprocess.run(
            [chromium(), *FLAGS, f"--user-data-dir={profile}", f"--virtual-time-budget={budget_ms}", *extra, url],
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )


def dom(url: str, budget_ms: int = 3000) -> str:
    """The page's DOM after its scripts ran for `budget_ms` of virtual time (fetches included)."""
    done = _run(url, ["--dump-dom"], budget_ms)
    if done.returncode != 0:
        raise RuntimeError(f"chromium --dump-dom failed ({done.returncode}): {done.stderr[-1000:]}")
    return done.stdout


def screenshot(url: str, name: str, width: int, height: int, budget_ms: int = 3000) -> Path:
    """A PNG of the page in artifacts() (kept for a human to look at; the path is returned)."""
    folder = artifacts()
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / name
    done = _run(url, [f"--screenshot={path}", f"--window-size={width},{height}"], budget_ms)
    if done.returncode != 0 or not path.exists():
        raise RuntimeError(f"chromium --screenshot failed ({done.returncode}): {done.stderr[-1000:]}")
    return path
