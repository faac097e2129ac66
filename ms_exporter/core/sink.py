"""The interface every sink implements: a part (core/part.py) that takes the numbers elsewhere."""

from __future__ import annotations

from ms_exporter.core.part import Part


class Sink(Part):
    """Where numbers go. Sinks read the MetricStore; probes never import them. A sink is built by its backend's
    entry in core/registry.py, and its `name` is that backend's name."""

    name = "sink"

    @property
    def metrics_url(self) -> str | None:
        """Where this sink serves /metrics (TrainingMonitor.url), if it serves it."""
        return None

    @property
    def records_path(self) -> str | None:
        """The file this sink writes step records to (TrainingMonitor.jsonl_path), if it writes one."""
        return None
