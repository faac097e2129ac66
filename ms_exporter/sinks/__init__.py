"""Where numbers go. Sinks read the MetricStore; probes never import them.

Each sink module declares itself beside its builder (`PART = BackendEntry(...)`, collected by `make generate`).
Which sinks a configuration gets is core/registry.py's BACKENDS: the `backend:` values in the order the user
listed them, then the sinks a setting adds (file_sd with file_sd_dir, the Pushgateway with its URL). What adding
a sink takes, and which test holds each part: CONTRIBUTING.md, "Where a change goes".
"""

from __future__ import annotations

import contextlib

from ms_exporter.config import ConfigError, MonitorConfig
from ms_exporter.core import registry
from ms_exporter.core.part import PartContext
from ms_exporter.core.sink import Sink


def build_sinks(context: PartContext) -> list[Sink]:
    """The sinks `context.config` asks for.

    A sink that cannot start (no address to bind, an unreachable OTLP setting) is counted and left out: training
    goes on without it. A missing optional package raises ConfigError naming the pip extra: that is the user's
    install to fix, and nothing a builder started outlives the error.
    """
    config: MonitorConfig = context.config
    named = [registry.BACKENDS[name] for name in config.backend]
    added = [entry for entry in registry.BACKENDS.values() if not entry.selectable]
    sinks: list[Sink] = []
    try:
        for entry in (*named, *added):
            sinks.extend(entry.build(context))
    except BaseException as exc:
        for sink in sinks:  # the monitor is not constructed: release the port, the files and threads it took
            with contextlib.suppress(Exception):
                sink.close()
        if isinstance(exc, registry.MissingExtra):
            raise ConfigError([str(exc)]) from exc
        raise
    return sinks
