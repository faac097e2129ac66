"""Alerts on the loss: non-finite, too high, rising."""

from __future__ import annotations

from ms_exporter.core import catalogue as c
from ms_exporter.core.thresholds import Thresholds
from ms_exporter.generate.alerts.alert import WHO, Alert, number
from ms_exporter.generate.timing import Timing


def alerts(t: Thresholds, w: Timing) -> tuple[Alert, ...]:
    return (
        Alert(
            "MindSporeTrainingLossNonFinite",
            expr=f"increase({c.NONFINITE_LOSS.name}[{w.events_window}]) > 0",
            for_=w.event_for,
            severity="critical",
            summary="Training loss became NaN or Inf",
            # increase() extrapolates to the window's edges: a count of steps is shown whole, never "619.8".
            description=f'{WHO} had {{{{ printf "%.0f" $value }}}} steps with a NaN/Inf loss in the last '
            f"{w.events_window}.",
        ),
        Alert(
            "MindSporeTrainingLossHigh",
            expr=f"{c.LOSS.name} > {number(t.loss_high)}",
            for_=w.short_for,
            severity="warning",
            summary="Training loss is above its threshold",
            description=f"Loss of {WHO} is {{{{ $value | humanize }}}}, above {number(t.loss_high)}.",
        ),
        Alert(
            "MindSporeTrainingLossRising",
            expr=f"{c.LOSS_RISING.name} >= {t.loss_rising_steps}",
            for_=w.short_for,
            severity="warning",
            summary="Training loss keeps rising",
            description=f"Loss of {WHO} rose {{{{ $value }}}} steps in a row.",
        ),
    )
