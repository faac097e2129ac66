"""The registries: every backend (sink) and every probe by name, with what switches it on and what builds it.

The configuration's allowed `backend` names and `metrics` groups, the `component` label values of errors, and the
order in which probes see a step are all read from here; nothing else lists them. Adding a built-in one:
CONTRIBUTING.md, "Where a change goes". A user's own probe or sink registers exactly as the built-in ones below do
(`register_probe`, `register_backend`), before the monitor is built: docs/development.md, "Your own probe or
sink".

A built-in entry names its builder as "module:function" and is imported only when a configuration asks for it, so
this base module imports nothing above it, and an operator command that only checks a config imports no sink. A
builder takes the monitor's `PartContext` (ms_exporter/monitor/assembly.py) and returns the parts it made (an empty
list: nothing for this configuration, e.g. its section is off).
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

Builder = Callable[[Any], Sequence[Any]]


def _load(builder: str | Builder) -> Builder:
    if not isinstance(builder, str):
        return builder
    module, _, function = builder.partition(":")
    loaded: Builder = getattr(importlib.import_module(module), function)
    return loaded


@dataclass(frozen=True)
class BackendEntry:
    """A sink. `selectable` ones are `backend:` values; the others come with a setting (file_sd_dir, a URL)."""

    name: str  # the `backend:` value and its sinks' `component` label
    builder: str | Builder  # "module:function" or a callable(PartContext) -> list of sinks
    extra: str | None = None  # the pip extra that installs its optional library (`ms-exporter[<extra>]`)
    selectable: bool = True
    python: tuple[int, int] = (3, 9)  # the oldest Python the extra's packages are served for

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

    def build(self, context: Any) -> list[Any]:
        return list(_load(self.builder)(context))


@dataclass(frozen=True)
class ReaderEntry:
    """A hardware reader (features/hardware/): its builder takes the `hardware` config section and returns the
    readers it found devices for, an empty list where its interface is absent (no library, no command, no device)."""

    name: str  # `hardware.readers` value; its errors count under component="hardware.<name>"
    builder: str | Builder
    extra: str | None = None  # the pip extra that installs its library, for the docs

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


def components() -> tuple[str, ...]:
    """Every `component` label value: the monitor's own parts, each probe, each sink, each hardware reader."""
    return (*MONITOR_COMPONENTS, *PROBES, *BACKENDS, *(f"hardware.{name}" for name in READERS))


# The monitor's own parts, as the `component` label names them (the callback's loss read counts under `loss`).
MONITOR_COMPONENTS = ("callback", "sampler", "watchdog", "actions", "goodput", "divergence")

# -- the built-in probes, in the order they are built and see each step --------------------------------------------
_PROBES = "ms_exporter.probes.builders"
for _entry in (
    # The rank's identity series, written once at construction (it builds no probe that follows the steps).
    ProbeEntry("identity", f"{_PROBES}:identity", ("global_rank",)),
    ProbeEntry("progress", f"{_PROBES}:progress"),
    ProbeEntry("hang_deadline", f"{_PROBES}:hang_deadline"),
    ProbeEntry("loss", f"{_PROBES}:loss", ("loss",)),
    ProbeEntry("learning_rate", f"{_PROBES}:learning_rate", ("lr",)),
    ProbeEntry("step_time", f"{_PROBES}:step_time", ("step_time",)),
    ProbeEntry("slowness", f"{_PROBES}:slowness"),
    ProbeEntry("throughput", f"{_PROBES}:throughput", ("samples_per_second", "tokens_per_second")),
    ProbeEntry("mfu", f"{_PROBES}:mfu"),
    ProbeEntry("loss_scale", f"{_PROBES}:loss_scale"),
    ProbeEntry("grad_norm", f"{_PROBES}:grad_norm"),
    ProbeEntry("weight_norm", f"{_PROBES}:weight_norm"),
    ProbeEntry("update_ratio", f"{_PROBES}:update_ratio"),
    ProbeEntry("layernorm", f"{_PROBES}:layernorm"),
    ProbeEntry("activations", f"{_PROBES}:activations"),
    ProbeEntry("memory", f"{_PROBES}:memory", ("memory_usage",)),
    ProbeEntry("eval", f"{_PROBES}:evaluation", ("eval",)),
    # The batch each step consumed (data_quality section). Built in actions/: its list_batches switch hands the
    # probe rollback's skipped-batches list, which a probe (a lower layer) cannot import.
    ProbeEntry("data_quality", "ms_exporter.actions.data_quality:build"),
    # The user's own measurements (monitor_config.strategies, by import path): last, so that they read the step's
    # numbers the built-in probes wrote.
    ProbeEntry("strategies", "ms_exporter.probes.strategies:build"),
):
    PROBES[_entry.name] = _entry

# -- the built-in sinks: the backends in the order `backend:` lists them by default, then the ones a setting adds --
for _backend in (
    BackendEntry("prometheus", "ms_exporter.sinks.prometheus:build"),
    BackendEntry("otlp", "ms_exporter.sinks.otlp:build", extra="otlp", python=(3, 10)),
    BackendEntry("local", "ms_exporter.sinks.jsonl:build"),
    BackendEntry("tensorboard", "ms_exporter.sinks.tensorboard:build", extra="tensorboard"),
    BackendEntry("wandb", "ms_exporter.sinks.wandb:build", extra="wandb", python=(3, 10)),
    BackendEntry("console", "ms_exporter.sinks.console:build"),
    BackendEntry("file_sd", "ms_exporter.sinks.file_sd:build", selectable=False),
    BackendEntry("pushgateway", "ms_exporter.sinks.pushgateway:build", selectable=False),
):
    BACKENDS[_backend.name] = _backend

# -- the built-in hardware readers: every one that finds a device runs --------------------------------------------
for _reader in (
    ReaderEntry("nvml", "ms_exporter.features.hardware.nvml:build", extra="nvml"),
    ReaderEntry("npu_smi", "ms_exporter.features.hardware.npu_smi:build"),
    ReaderEntry("host", "ms_exporter.features.hardware.host:build"),
):
    READERS[_reader.name] = _reader
