"""Alerts on a rank's tokens per second: below a fixed floor, or fallen well below its own recent best."""

from __future__ import annotations

from ms_exporter.core import catalogue as c
from ms_exporter.core.thresholds import Thresholds
from ms_exporter.generate.alerts.alert import WHO, Alert, number
from ms_exporter.generate.timing import Timing


def alerts(t: Thresholds, w: Timing) -> tuple[Alert, ...]:
    tokens = c.TOKENS_PER_SECOND.name
    ratio = number(t.throughput_drop_ratio)
    return (
        Alert(
            "MindSporeTrainingThroughputLow",
            expr=f"{tokens} < {number(t.tokens_per_second_low)}",
            for_=w.slow_for,
            severity="warning",
            summary="Training throughput is low",
            description=f"{WHO} processes {{{{ $value | humanize }}}} tokens/s, below "
            f"{number(t.tokens_per_second_low)}.",
        ),
        Alert(
            "MindSporeTrainingThroughputDrop",
            expr=f"avg_over_time({tokens}[{w.drop_recent}]) < {ratio}"
            f" * max_over_time(avg_over_time({tokens}[{w.drop_smooth}])"
            f"[{w.drop_baseline}:{w.drop_recent}] offset {w.drop_recent})",
            for_=w.drop_for,
            severity="warning",
            summary="Training throughput dropped",
            description=f"{WHO} processed {{{{ $value | humanize }}}} tokens/s over the last {w.drop_recent}, less "
            f"than {ratio} of its best {w.drop_smooth} average in the {w.drop_baseline} before.",
        ),
    )
