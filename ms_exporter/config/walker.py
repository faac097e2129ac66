"""The walker: a mapping through each field's declared check into a section, every problem named with its source."""

from __future__ import annotations

import dataclasses
import math
import reprlib
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, TypeVar

from ms_exporter.config.checks import _UNSHOWN, _Bad, _close

if TYPE_CHECKING:
    from _typeshed import DataclassInstance
    from typing_extensions import TypeGuard  # typing's own from Python 3.10


_SHOWN = reprlib.Repr()
_SHOWN.maxlevel, _SHOWN.maxdict, _SHOWN.maxlist, _SHOWN.maxtuple = 3, 6, 6, 6
_SHOWN.maxstring = _SHOWN.maxother = 120


def shown_value(value: Any) -> str:
    """A bad value as an error message shows it: short whatever it is (a YAML alias bomb, a 400-digit number), a
    string quoted, a number as written."""
    if isinstance(value, int) and not isinstance(value, bool) and value.bit_length() > 64:
        try:
            return f"an integer of {len(str(abs(value)))} digits"
        except ValueError:  # past Python's int-to-text limit (4,300 digits)
            return f"an integer of about {int(value.bit_length() * math.log10(2)) + 1} digits"
    return _SHOWN.repr(value)


class _Problems:
    """Every problem found, each naming its key and the source that set it."""

    def __init__(self) -> None:
        self.found: list[str] = []
        # key path (a top-level key, or section.key) -> the environment variable, keyword argument or MindSpore
        # Transformers key that set it; a path not here was set where its longest listed prefix was
        self.origin: dict[str, str] = {}

    def set_origin(self, path: str, where: str, value: Any = None) -> None:
        """`path` was set by `where`; with a section's mapping `value`, only the sub-keys it names are (they are
        merged into what was there)."""
        for known in [known for known in self.origin if known.startswith(path + ".")]:
            if not isinstance(value, Mapping) or known[len(path) + 1 :].split(".")[0] in value:
                del self.origin[known]
        self.origin[path] = where

    def _where(self, path: str) -> str:
        parts = path.split(".")
        for end in range(len(parts), 0, -1):
            if (where := self.origin.get(".".join(parts[:end]))) is not None:
                return where
        return "monitor_config"

    def add(self, path: str, message: str, value: Any = _UNSHOWN) -> None:
        shown = "" if value is _UNSHOWN else f", got {shown_value(value)}"
        self.found.append(f"monitor_config.{path}: {message}{shown} (from {self._where(path)})")

    def unknown(self, path: str, key: Any, allowed: list[str]) -> None:
        close = _close(key, allowed)
        hint = f"did you mean '{close}'? " if close else ""
        self.found.append(
            f"monitor_config.{path}: unknown key ({self._where(path)}); {hint}allowed keys: {', '.join(allowed)}"
        )


_T = TypeVar("_T", bound="DataclassInstance")


def _is_section(check: object) -> TypeGuard[type[DataclassInstance]]:
    """A field whose declared check is a section class (a nested dataclass) rather than a check function."""
    return isinstance(check, type) and dataclasses.is_dataclass(check)


def _build(kind: type[_T], value: Any, path: str, problems: _Problems) -> _T | None:
    """The config (path "") or one section of it: each field through its declared check, unknown keys with a
    did-you-mean hint, then the class's cross-field rules. None when anything was wrong, all of it reported."""
    fields = dataclasses.fields(kind)
    allowed = [f.name for f in fields]

    def say(key: str, message: str, shown: Any = _UNSHOWN) -> None:
        problems.add(f"{path}.{key}" if path and key else path or key, message, shown)

    if value is None:
        value = {}
    elif isinstance(value, kind):
        value = {name: getattr(value, name) for name in allowed}
    elif not isinstance(value, Mapping):
        say("", f"must be a mapping (keys: {', '.join(allowed)})", value)
        return None
    before = len(problems.found)
    expand = getattr(kind, "_expand", None)
    if expand is not None:
        value = expand(value, say)
    for key in value:
        if key not in allowed:
            problems.unknown(f"{path}.{key}" if path else str(key), key, allowed)
    clean = {}
    for f in fields:
        if f.name not in value:
            continue
        check = f.metadata["check"]
        if _is_section(check):
            clean[f.name] = _build(check, value[f.name], f"{path}.{f.name}" if path else f.name, problems)
            continue
        try:
            clean[f.name] = check(value[f.name])
        except _Bad as bad:
            for message, shown in bad.problems:
                say(f.name, message, shown)
    if len(problems.found) > before:
        return None
    config = kind(**clean)
    if hasattr(config, "_cross_check"):
        config._cross_check(say)
    return config if len(problems.found) == before else None
