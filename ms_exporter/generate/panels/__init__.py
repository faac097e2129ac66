"""The dashboard's panels as records (panel.py), one module per row; `rows` lists them top to bottom."""

from __future__ import annotations

from ms_exporter.core.thresholds import Thresholds
from ms_exporter.generate.panels import (
    actions,
    devices,
    goodput,
    gradients,
    hangs,
    learning_rate,
    loss,
    memory,
    overview,
    ranks,
    throughput,
)
from ms_exporter.generate.panels.panel import Row


def rows(t: Thresholds) -> tuple[Row, ...]:
    """Every row; the ones that draw an alert's threshold as a dashed line take it from `t`."""
    return (
        overview.ROW,
        loss.row(t),
        learning_rate.ROW,
        actions.ROW,
        throughput.row(t),
        devices.row(t),
        gradients.row(t),
        hangs.ROW,
        goodput.row(t),
        memory.row(t),
        ranks.row(t),
    )
