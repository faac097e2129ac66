"""The records of a JSON Lines file the monitor wrote, read strictly (a torn line raises)."""

from __future__ import annotations

import json
from pathlib import Path


def records(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]  # raises on a torn line


def steps_of(path: Path) -> list[int]:
    return [r["step"] for r in records(path) if r["type"] == "step"]
