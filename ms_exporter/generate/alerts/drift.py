"""Alerts on the training's state drifting over a run: memory that keeps growing, a learning-rate schedule that does
not move, a collapsing loss scale, a LayerNorm scale on the move."""

from __future__ import annotations

from ms_exporter.core import catalogue as c
from ms_exporter.core.thresholds import Thresholds
from ms_exporter.core.verdicts import MEMORY_GROWTH
from ms_exporter.generate.alerts.alert import WHO, Alert, number
from ms_exporter.generate.alerts.verdicts import promql
from ms_exporter.generate.timing import Timing

# Loss-scale collapse by overflow fraction needs this many steps in its window: a dynamic scaler overflows on its
# first steps by design (it starts high and halves), and with slow steps those few would be most of a minute.
OVERFLOW_MIN_STEPS = 20


def alerts(t: Thresholds, w: Timing) -> tuple[Alert, ...]:
    return (
        Alert(
            "MindSporeTrainingMemoryGrowth",
            expr=promql(MEMORY_GROWTH, t),
            for_=w.trend_for,
            severity="warning",
            summary="Memory keeps growing",
            description=f"{{{{ $labels.kind }}}} memory of {WHO} is {{{{ $value | humanizePercentage }}}} above "
            f"its baseline and still growing.",
        ),
        Alert(
            "MindSporeTrainingLearningRateFlat",
            expr=f"({c.LEARNING_RATE_SCHEDULED.name} == 1)"
            f" and (changes({c.LEARNING_RATE.name}[{w.lr_flat_window}]) == 0)"
            f" and on (job, instance) (increase({c.STEPS.name}[{w.lr_flat_window}]) > 0)",
            for_=w.long_for,
            severity="warning",
            summary="The learning-rate schedule is not moving",
            description=f"The learning rate of {WHO} is a schedule but has not changed for {w.lr_flat_window} "
            f"while training went on.",
        ),
        Alert(
            "MindSporeTrainingLossScaleCollapse",
            expr=f"(increase({c.OVERFLOW_STEPS.name}[{w.overflow_window}])"
            f" / (increase({c.STEPS.name}[{w.overflow_window}])"
            f" >= {OVERFLOW_MIN_STEPS}) > {number(t.overflow_fraction)}) or ({c.LOSS_SCALE.name} < 1)",
            for_=w.trend_for,
            severity="warning",
            summary="Loss scaling is collapsing",
            description=f"{WHO}: overflow on more than {number(t.overflow_fraction)} of recent steps, or a loss "
            f'scale below 1 (value {{{{ printf "%.3g" $value }}}}).',
        ),
        Alert(
            "MindSporeTrainingLayerNormDrift",
            expr=f"abs({c.LAYERNORM_DRIFT.name}) > {number(t.layernorm_drift)}",
            for_=w.long_for,
            severity="warning",
            summary="A LayerNorm scale is drifting",
            description=f"LayerNorm {{{{ $labels.layer }}}} of {WHO} moved its scale mean by "
            f"{{{{ $value | humanizePercentage }}}} within its window.",
        ),
    )
