"""The second virtual environment: MindSpore Transformers 1.8.0 (which pins MindSpore 2.7.2) and ms_exporter.

Built once at .venv-mindformers and kept while what it was built from is unchanged (a stamp holds a digest of the
requirements and pyproject.toml). `make test` builds it beside the unit tests, before the integration tests (`python -m
tests.support.mindformers_venv`); the tests that run in it call `ensure()` and are skipped, with pip's own words, only
where it cannot be built (no package index, say). docs/mindformers.md says what runs in it.
"""

from __future__ import annotations

import hashlib
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
VENV = REPO / ".venv-mindformers"
PYTHON = VENV / "bin" / "python"
MINDFORMERS = "mindformers==1.8.0"
# MindSpore's data pipeline needs numpy < 2 (as in the main venv); the extras the unit suite imports.
REQUIREMENTS = (MINDFORMERS, "numpy<2", f"-e{REPO}[test,otlp]")
_STAMP = VENV / ".installed"


class Unavailable(RuntimeError):
    """The environment cannot be built here; the message says why."""


def _digest() -> str:
    text = "\n".join(REQUIREMENTS) + (REPO / "pyproject.toml").read_text()
    return hashlib.sha256(text.encode()).hexdigest()


def _run(command: list[str]) -> None:
    done = subprocess.run(command, capture_output=True, text=True, timeout=1800)
    if done.returncode != 0:
        tail = "\n".join((done.stderr or done.stdout).strip().splitlines()[-6:])
        raise Unavailable(f"{' '.join(command[:4])} ... failed (exit {done.returncode}):\n{tail}")


def ensure() -> Path:
    """The environment's python, built or rebuilt first when needed. Unavailable when it cannot be built."""
    digest = _digest()
    if PYTHON.exists() and _STAMP.exists() and _STAMP.read_text() == digest:
        return PYTHON
    if not PYTHON.exists():
        _run([sys.executable, "-m", "venv", str(VENV)])
    _run([str(PYTHON), "-m", "pip", "install", "--quiet", "--upgrade", "pip"])
    # --no-compile: what the tests import is compiled on first use (byte-compiling all of it took ~30 s more)
    _run([str(PYTHON), "-m", "pip", "install", "--quiet", "--no-compile", *REQUIREMENTS])
    _STAMP.write_text(digest)
    return PYTHON


if __name__ == "__main__":
    try:
        print(f"MindSpore Transformers environment: {ensure()}")
    except Unavailable as exc:  # the tests say the same when they skip; make test goes on
        print(f"MindSpore Transformers environment not built: {exc}", file=sys.stderr)
