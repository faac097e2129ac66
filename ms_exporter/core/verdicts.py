"""Verdicts written once: each is a record of comparisons against the thresholds, from which the alert rules'
PromQL (ms_exporter/generate/alerts/verdicts.py) and the Python that `ms-exporter top` runs on scraped values
(`holds`) both come, so the rules and `top` cannot disagree. The numbers come from the Thresholds a caller passes
(the defaults, or a config's).

A verdict holds when any of its clauses holds; a clause when each of its comparisons does. A comparison reads one
quantity of the rank (a family or a recording rule, per label set of it) against a threshold, alone or times another
quantity of the same rank or of its project (the job's median, say).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

from ms_exporter.core import catalogue as c
from ms_exporter.core.thresholds import DEFAULTS, Thresholds


@dataclass(frozen=True)
class Over:
    """`quantity` over (or at least, with `inclusive`) the threshold named `threshold`, times `scale` where given: a
    quantity of the same series (`scale_of_project` False) or its project's (True)."""

    quantity: str
    threshold: str  # a Thresholds field
    scale: str | None = None
    scale_of_project: bool = False
    inclusive: bool = False

    def holds(self, values: Mapping[str, float], thresholds: Thresholds) -> bool:
        value, bound = values.get(self.quantity, math.nan), float(getattr(thresholds, self.threshold))
        if self.scale is not None:
            bound *= values.get(self.scale, math.nan)
        return value >= bound if self.inclusive else value > bound  # NaN (no reading) holds nothing


@dataclass(frozen=True)
class Verdict:
    """An alert's condition: any of `clauses`, each all of its comparisons."""

    alert: str
    clauses: tuple[tuple[Over, ...], ...]

    def holds(self, values: Mapping[str, float], thresholds: Thresholds = DEFAULTS) -> bool:
        """The verdict on one rank's values (quantity name -> value; its project's quantities by their names)."""
        return any(all(over.holds(values, thresholds) for over in clause) for clause in self.clauses)


# Synchronous ranks (a collective in every step) all take the same time per step: the one the others wait for has a
# short step and a long data wait, while theirs grows by the wait. So the step time names the wrong rank; the data
# wait, where it is a real part of the step cycle, names the right one. Ranks that do not synchronise run at their
# own pace: there the slow rank's whole cycle is longer.
STRAGGLER = Verdict(
    "MindSporeTrainingStraggler",
    (
        (
            Over(c.RANK_WAIT_MEAN, "straggler_factor", c.PROJECT_WAIT_MEDIAN, scale_of_project=True),
            Over(c.RANK_WAIT_MEAN, "straggler_wait_fraction", c.RANK_CYCLE_MEAN),
        ),
        (Over(c.RANK_CYCLE_MEAN, "straggler_factor", c.PROJECT_CYCLE_MEDIAN, scale_of_project=True),),
    ),
)
# Per memory kind: grown past the ratio over the post-warm-up baseline, and still growing.
MEMORY_GROWTH = Verdict(
    "MindSporeTrainingMemoryGrowth",
    ((Over(c.MEMORY_GROWTH_RATIO.name, "memory_growth_ratio"), Over(c.MEMORY_GROWTH_RATE.name, "memory_growth_rate")),),
)
# Per device: its temperature at or above the bound.
DEVICE_HOT = Verdict(
    "MindSporeTrainingDeviceHot", ((Over(c.RANK_DEVICE_TEMPERATURE, "device_hot_celsius", inclusive=True),),)
)
