"""The leaves of the config schema: every field that is not itself a section, with its declared check."""

from __future__ import annotations

import dataclasses
from typing import Any


def leaves(kind: type, prefix: str = "") -> list[tuple[str, Any]]:
    """(dotted path, declared check) of every field that is not itself a section."""
    out = []
    for f in dataclasses.fields(kind):
        check = f.metadata["check"]
        out += leaves(check, f"{prefix}{f.name}.") if dataclasses.is_dataclass(check) else [(prefix + f.name, check)]
    return out
