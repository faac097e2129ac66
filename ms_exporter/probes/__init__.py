"""One measured quantity per module; each writes to the MetricStore only.

Each probe module declares itself beside its builder (`PART = ProbeEntry(...)`); `make generate` collects the
declarations into core/builtin_parts.py, which core/registry.py's PROBES registers in order. What adding a probe
takes, and which test holds each part: CONTRIBUTING.md, "Where a change goes".
"""

from __future__ import annotations

from ms_exporter.config import MonitorConfig
from ms_exporter.core import registry
from ms_exporter.core.part import PartContext
from ms_exporter.core.probe import Probe


def build_probes(context: PartContext) -> list[Probe]:
    """The probes `context.config` switches on, in the registry's order."""
    config: MonitorConfig = context.config
    probes: list[Probe] = []
    for entry in registry.PROBES.values():
        if entry.groups and not any(config.wants(group) for group in entry.groups):
            continue
        probes.extend(entry.build(context))
    return probes
