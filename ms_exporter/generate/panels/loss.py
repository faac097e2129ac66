"""The Loss row: the loss and the smoothed loss per rank against the LossHigh line, and non-finite losses."""

from __future__ import annotations

from ms_exporter.core import catalogue as c
from ms_exporter.core.thresholds import Thresholds
from ms_exporter.generate.panels.panel import RATE, SELECTOR, Query, Row, TimeSeries


def row(t: Thresholds) -> Row:
    return Row(
        "Loss",
        (
            TimeSeries(
                "Loss per rank",
                "none",
                (Query(f"{c.LOSS.name}{{{SELECTOR}}}", "rank {{rank}}"),),
                width=8,
                height=8,
                above=t.loss_high,
            ),
            TimeSeries(
                "Smoothed loss",
                "none",
                (Query(f"{c.LOSS_SMOOTHED.name}{{{SELECTOR}}}", "rank {{rank}}"),),
                width=8,
                height=8,
                above=t.loss_high,
            ),
            TimeSeries(
                "Non-finite losses",
                "none",
                (Query(f"increase({c.NONFINITE_LOSS.name}{{{SELECTOR}}}[{RATE}])", "rank {{rank}}"),),
                width=8,
                height=8,
            ),
        ),
    )
