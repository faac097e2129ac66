"""The Learning rate row: each rank's learning rate per parameter group."""

from __future__ import annotations

from ms_exporter.core import catalogue as c
from ms_exporter.generate.panels.panel import SELECTOR, Query, Row, TimeSeries

ROW = Row(
    "Learning rate",
    (
        TimeSeries(
            "Learning rate",
            "none",
            (Query(f"{c.LEARNING_RATE.name}{{{SELECTOR}}}", "rank {{rank}} {{group}}"),),
            width=24,
            height=7,
        ),
    ),
)
