"""Alerts on the global gradient norm: high for a while, or exploding."""

from __future__ import annotations

from ms_exporter.core import catalogue as c
from ms_exporter.core.thresholds import Thresholds
from ms_exporter.generate.alerts.alert import WHO, Alert, number
from ms_exporter.generate.timing import Timing


def alerts(t: Thresholds, w: Timing) -> tuple[Alert, ...]:
    return (
        Alert(
            "MindSporeTrainingGradNormHigh",
            expr=f"{c.GRAD_NORM.name} > {number(t.grad_norm_high)}",
            for_=w.long_for,
            severity="warning",
            summary="Gradient norm is high",
            description=f"Gradient norm of {WHO} is {{{{ $value | humanize }}}}, above {number(t.grad_norm_high)}.",
        ),
        Alert(
            "MindSporeTrainingGradNormExploding",
            expr=f"{c.GRAD_NORM.name} > {number(t.grad_norm_exploding)}",
            for_=w.spike_for,
            severity="critical",
            summary="Gradient norm is exploding",
            description=f"Gradient norm of {WHO} is {{{{ $value | humanize }}}}, above "
            f"{number(t.grad_norm_exploding)}.",
        ),
    )
