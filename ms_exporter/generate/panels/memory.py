"""The Memory row: memory by kind, its growth over the baseline against the MemoryGrowth line, its growth rate."""

from __future__ import annotations

from ms_exporter.core import catalogue as c
from ms_exporter.core.thresholds import Thresholds
from ms_exporter.generate.panels.panel import SELECTOR, Query, Row, TimeSeries


def row(t: Thresholds) -> Row:
    return Row(
        "Memory",
        (
            TimeSeries(
                "Memory by kind",
                "bytes",
                (Query(f"{c.MEMORY_BYTES.name}{{{SELECTOR}}}", "{{kind}} rank {{rank}}"),),
                width=8,
                height=8,
            ),
            TimeSeries(
                "Growth over baseline",
                "percentunit",
                (Query(f"{c.MEMORY_GROWTH_RATIO.name}{{{SELECTOR}}}", "{{kind}} rank {{rank}}"),),
                width=8,
                height=8,
                above=t.memory_growth_ratio,
            ),
            TimeSeries(
                "Growth rate",
                "Bps",
                (Query(f"{c.MEMORY_GROWTH_RATE.name}{{{SELECTOR}}}", "{{kind}} rank {{rank}}"),),
                width=8,
                height=8,
            ),
        ),
    )
