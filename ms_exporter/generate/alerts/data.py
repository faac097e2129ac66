"""Alerts on the training data: a quality the rank measures on each batch dropped and stayed down."""

from __future__ import annotations

from ms_exporter.core import catalogue as c
from ms_exporter.core.thresholds import Thresholds
from ms_exporter.generate.alerts.alert import WHO, Alert
from ms_exporter.generate.timing import Timing


def alerts(t: Thresholds, w: Timing) -> tuple[Alert, ...]:
    return (
        Alert(
            "MindSporeTrainingDataQualityDrop",
            # The rank compares each batch with its own baseline (data_quality.drop_ratio, streak: each rank's
            # config), and its low flag says when the streak is long enough; the streak is the value shown. A dip
            # shorter than the streak never sets the flag, and the flag must hold a minute on top.
            expr=f"({c.DATA_QUALITY_LOW_STREAK.name} > 0) and ({c.DATA_QUALITY_LOW.name} == 1)",
            for_=w.short_for,
            severity="warning",
            summary="The training data's quality dropped",
            description=f"The {{{{ $labels.quantity }}}} of the batches of {WHO} has been below its baseline "
            f"for {{{{ $value }}}} measured batches in a row.",
        ),
    )
