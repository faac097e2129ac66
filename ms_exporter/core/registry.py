"""The registries: every backend (sink) and every probe by name, with what switches it on and what builds it.

The configuration's allowed `backend` names and `metrics` groups, the `component` label values of errors, and the
order in which probes see a step are all read from here; nothing else lists them. Adding a built-in one:
CONTRIBUTING.md, "Where a change goes". A user's own probe or sink registers exactly as the built-in ones below do
(`register_probe`, `register_backend`), before the monitor is built: docs/development.md, "Your own probe or
sink".

A built-in part declares its entry in its own module (`PART = ...`, its builder beside it); `make generate` writes
them into core/builtin_parts.py as "module:function" names, imported only when a configuration asks for the part,
so this base module imports nothing above it, and an operator command that only checks a config imports no sink. A
builder takes the monitor's `PartContext` (ms_exporter/monitor/assembly.py) and returns the parts it made (an empty
list: nothing for this configuration, e.g. its section is off).
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from ms_exporter.core import builtin_parts

Builder = Callable[[Any], Sequence[Any]]


def _load(builder: str | Builder) -> Builder:
    loaded: Builder = load_named(builder)
    return loaded


def load_named(named: Any) -> Any:
    """A "module:name" string imported (a builder, a section class), or the object itself."""
    if not isinstance(named, str):
        return named
    module, _, name = named.partition(":")
    return getattr(importlib.import_module(module), name)


@dataclass(frozen=True)
class BackendEntry:
    """A sink. `selectable` ones are `backend:` values; the others come with a setting (file_sd_dir, a URL)."""

    name: str  # the `backend:` value and its sinks' `component` label
    builder: str | Builder  # "module:function" or a callable(PartContext) -> list of sinks
    extra: str | None = None  # the pip extra that installs its optional library (`ms-exporter[<extra>]`)
    selectable: bool = True
    python: tuple[int, int] = (3, 9)  # the oldest Python the extra's packages are served for
    order: int = 1000  # a built-in's place among the built-ins (the generated index is sorted by it)
    section: str | type | None = None  # its own config section, read under its name (config/part_sections.py)

    def build(self, context: Any) -> list[Any]:
        """The sinks for this configuration; a missing optional library raises MissingExtra naming the extra."""
        try:
            builder = _load(self.builder)
            return list(builder(context))
        except ImportError as exc:
            if self.extra is None:
                raise
            raise MissingExtra(self.name, self.extra, exc.name or str(exc), self.python) from exc


@dataclass(frozen=True)
class ProbeEntry:
    """A probe. `groups`: the `metrics` groups that switch it on (any one does); none: its builder decides (a
    section of its own, such as grad_norm.enable, or always on)."""

    name: str  # its `component` label
    builder: str | Builder  # "module:function" or a callable(PartContext) -> list of probes
    groups: tuple[str, ...] = ()
    order: int = 1000  # a built-in's place among the built-ins: the order probes see each step
    section: str | type | None = None  # its own config section, read under its name (config/part_sections.py)

    def build(self, context: Any) -> list[Any]:
        return list(_load(self.builder)(context))


@dataclass(frozen=True)
class ReaderEntry:
    """A hardware reader (features/hardware/): its builder takes the `hardware` config section and returns the
    readers it found devices for, an empty list where its interface is absent (no library, no command, no device)."""

    name: str  # `hardware.readers` value; its errors count under component="hardware.<name>"
    builder: str | Builder
    extra: str | None = None  # the pip extra that installs its library, for the docs
    order: int = 1000

    def build(self, section: Any) -> list[Any]:
        return list(_load(self.builder)(section))


class MissingExtra(ImportError):
    """A configured backend needs an optional library that is not installed."""

    def __init__(self, backend: str, extra: str, missing: str, python: tuple[int, int] = (3, 9)) -> None:
        where = ""
        if sys.version_info < python:  # pip would only say that it finds no such version
            here = ".".join(map(str, sys.version_info[:3]))
            where = f" on Python >= {python[0]}.{python[1]} (its packages are not served for {here})"
        super().__init__(
            f"monitor_config.backend: {backend} needs {missing}, which is not installed; "
            f"install it with: pip install 'ms-exporter[{extra}]'{where}"
        )
        self.backend, self.extra, self.missing = backend, extra, missing


BACKENDS: dict[str, BackendEntry] = {}
PROBES: dict[str, ProbeEntry] = {}
READERS: dict[str, ReaderEntry] = {}


def register_backend(entry: BackendEntry) -> BackendEntry:
    """Add (or replace, by name) a backend; selectable ones become allowed `backend:` values."""
    _check_name(entry.name, PROBES, "a probe")
    BACKENDS[entry.name] = entry
    return entry


def register_probe(entry: ProbeEntry) -> ProbeEntry:
    """Add (or replace, by name) a probe; it sees each step after the probes registered before it."""
    _check_name(entry.name, BACKENDS, "a backend")
    PROBES[entry.name] = entry
    return entry


def register_reader(entry: ReaderEntry) -> ReaderEntry:
    """Add (or replace, by name) a hardware reader; it becomes an allowed `hardware.readers` value."""
    READERS[entry.name] = entry
    return entry


def unregister(name: str) -> None:
    """Remove a user's probe, backend or hardware reader (tests, plug-ins that are switched off)."""
    PROBES.pop(name, None)
    BACKENDS.pop(name, None)
    READERS.pop(name, None)


def _check_name(name: str, other: dict[str, Any], what: str) -> None:
    # One name, one component label: an error counted for it must say which part failed.
    if not name or not name.replace("_", "").isalnum():
        raise ValueError(f"a part's name must be letters, digits and '_', got {name!r}")
    if name in other or name in MONITOR_COMPONENTS:
        raise ValueError(f"{name!r} is already {what if name in other else 'a part of the monitor itself'}")


def selectable_backends() -> tuple[str, ...]:
    """The allowed `backend:` values, in registration order."""
    return tuple(name for name, entry in BACKENDS.items() if entry.selectable)


def metric_groups() -> tuple[str, ...]:
    """The allowed `metrics` groups: every probe's groups, in registration order."""
    return tuple(dict.fromkeys(group for entry in PROBES.values() for group in entry.groups))


def hardware_readers() -> tuple[str, ...]:
    """The allowed `hardware.readers` values, in registration order."""
    return tuple(READERS)


def part_sections() -> dict[str, str | type]:
    """The config sections parts declare beside their class, by part name (the section's key), in registration
    order: what config/part_sections.py reads a monitor_config's keys against."""
    entries: list[ProbeEntry | BackendEntry] = [*PROBES.values(), *BACKENDS.values()]
    return {entry.name: entry.section for entry in entries if entry.section is not None}


def components() -> tuple[str, ...]:
    """Every `component` label value: the monitor's own parts, each probe, each sink, each hardware reader."""
    return (*MONITOR_COMPONENTS, *PROBES, *BACKENDS, *(f"hardware.{name}" for name in READERS))


# The monitor's own parts, as the `component` label names them (the callback's loss read counts under `loss`).
MONITOR_COMPONENTS = ("callback", "sampler", "watchdog", "actions", "goodput", "divergence")

# -- the built-in parts: each declares itself in its own module (`PART = ProbeEntry(...)` beside its builder);
# `make generate` collects the declarations into core/builtin_parts.py (ms_exporter/generate/parts.py), so that
# nothing here imports a part before a configuration asks for it.
_SECTIONS = dict(builtin_parts.SECTIONS)
for _name, _builder, _groups in builtin_parts.PROBES:
    PROBES[_name] = ProbeEntry(_name, _builder, _groups, section=_SECTIONS.get(_name))
for _name, _builder, _extra, _selectable, _python in builtin_parts.BACKENDS:
    BACKENDS[_name] = BackendEntry(_name, _builder, _extra, _selectable, _python, section=_SECTIONS.get(_name))
for _name, _builder, _extra in builtin_parts.READERS:
    READERS[_name] = ReaderEntry(_name, _builder, _extra)
