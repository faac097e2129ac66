"""Alerts on learning itself: the global gradient norm high for a while or exploding; a layer that stopped moving."""

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
        Alert(
            "MindSporeTrainingLayerFrozen",
            # Against the same rank's median layer: the ratio's size depends on the learning rate and on how many
            # steps lie between samples, a share of the median does not. A median of 0 (nothing moves: the
            # learning rate is 0) is no layer's fault.
            expr=f"{c.LAYER_UPDATE_RATIO.name} < on (job, instance) group_left () "
            f"({number(t.update_ratio_frozen_fraction)} * {c.UPDATE_RATIO_MEDIAN.name})",
            for_=w.long_for,
            severity="warning",
            summary="A layer stopped learning",
            description=f"Layer {{{{ $labels.layer }}}} of {WHO} moved {{{{ $value | humanize }}}} of its size "
            f"between samples, under {number(t.update_ratio_frozen_fraction)} of the median layer's: its learning "
            "rate may be too small for it, or it is frozen.",
        ),
    )
