"""The checkpoint interval that loses the least time, from a run's own failures (docs/failslow.md#checkpoint-interval).

Daly's higher-order estimate (J. T. Daly, "A higher order estimate of the optimum checkpoint interval for restart
dumps", FGCS 22, 2006) for a save that takes `save` seconds and a mean time between failures `mtbf`:

    interval = sqrt(2 save mtbf) [1 + sqrt(save / 2 mtbf) / 3 + (save / 2 mtbf) / 9] - save     (save < 2 mtbf)
    interval = mtbf                                                                              (otherwise)

Young's sqrt(2 save mtbf) is its first term: it is off by a few percent once a save is more than a small share of
the MTBF (a 10-minute save of a 70B model on a 3,000-rank job that fails twice a day), and Daly's correction costs
nothing. What a failure costs besides the lost work (the time to detect it, `detect`, and to restart and reach
the last checkpoint's step, `restart`) is the same whatever the interval, so it moves no optimum; it does count in
the expected goodput, Daly's complete model with exponentially distributed failures:

    goodput(interval) = interval / (mtbf e^{(restart + detect) / mtbf} (e^{(interval + save) / mtbf} - 1))

The MTBF is the run's own: its wall time over the failures it saw. With n failures in a time T, the MTBF's
two-sided 90% interval is [2T / chi2_0.95(2n + 2), 2T / chi2_0.05(2n)] (a time-terminated test), and the advised
interval's range follows from it (the interval grows with the MTBF).
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass

import numpy as np

CONFIDENCE = 0.90  # the two-sided interval of the MTBF, and so of the advice


def daly_interval(save: float, mtbf: float) -> float:
    """Seconds of training between two saves that lose the least time (Daly's higher-order estimate)."""
    if save <= 0 or mtbf <= 0:
        raise ValueError(f"save and mtbf must be positive seconds, got {save} and {mtbf}")
    if save >= 2 * mtbf:
        return mtbf
    ratio = save / (2 * mtbf)
    return math.sqrt(2 * save * mtbf) * (1 + math.sqrt(ratio) / 3 + ratio / 9) - save


def young_interval(save: float, mtbf: float) -> float:
    """Young's first-order sqrt(2 save mtbf), for comparison."""
    return math.sqrt(2 * save * mtbf)


def expected_goodput(interval: float, save: float, mtbf: float, lost_per_failure: float = 0.0) -> float:
    """The share of wall time spent on work that is kept, with exponentially distributed failures (Daly's complete
    model); `lost_per_failure`: the seconds each failure costs besides the lost work (detection, restart)."""
    exponent = (interval + save) / mtbf
    if exponent + lost_per_failure / mtbf > 700:  # e^700 overflows a float: next to nothing is kept
        return 0.0
    return interval / (mtbf * math.exp(lost_per_failure / mtbf) * math.expm1(exponent))


def advised_interval(save: float, exposure: float, failures: int, lost_per_failure: float = 0.0) -> float:
    """The interval whose expected goodput, averaged over what the MTBF may be after `failures` failures in
    `exposure` seconds, is highest. Each quantile of the failure rate's posterior (Jeffreys: rate x 2 exposure is
    chi2 with 2 failures degrees of freedom) weighs alike; the search runs over a log grid of intervals. With many
    failures the posterior narrows and this is Daly's interval at the estimated MTBF; with few, plugging that one
    estimate in loses more (docs/failslow.md#checkpoint-interval measures both)."""
    mtbfs = 2 * exposure / _rate_quantiles(failures)
    intervals = np.geomspace(save / 4, 8 * max(exposure / failures, save), _GRID_POINTS)
    exponent = (intervals[:, None] + save) / mtbfs[None, :]
    overhead = lost_per_failure / mtbfs[None, :]
    with np.errstate(over="ignore", invalid="ignore"):
        each = intervals[:, None] / (mtbfs[None, :] * np.exp(overhead) * np.expm1(exponent))
    each = np.where(exponent + overhead > 700, 0.0, each)
    return float(intervals[int(np.argmax(each.mean(axis=1)))])


_POSTERIOR_POINTS = 32
_GRID_POINTS = 600


@functools.lru_cache(maxsize=64)
def _rate_quantiles(failures: int) -> np.ndarray:
    """The posterior's quantiles of rate x 2 exposure (chi2 with 2 failures degrees of freedom), at the midpoints
    of _POSTERIOR_POINTS equal slices of probability."""
    points = [(i + 0.5) / _POSTERIOR_POINTS for i in range(_POSTERIOR_POINTS)]
    return np.array([chi2_quantile_even(p, 2 * failures) for p in points])


def _chi2_cdf_even(x: float, dof: int) -> float:
    """P(chi2 with an even `dof` <= x): 1 - the Poisson(x / 2) probability of fewer than dof / 2 events."""
    if x <= 0:
        return 0.0
    half = x / 2
    log_half = math.log(half)
    # Each Poisson term from its logarithm: e^-half alone underflows to 0 past half = 745 (about 370 failures).
    fewer = math.fsum(math.exp(k * log_half - half - math.lgamma(k + 1)) for k in range(dof // 2))
    return 1.0 - fewer


def chi2_quantile_even(p: float, dof: int) -> float:
    """The `p` quantile of chi2 with an even number of degrees of freedom, by bisection on its exact CDF."""
    if dof <= 0 or dof % 2:
        raise ValueError(f"dof must be a positive even number, got {dof}")
    low, high = 0.0, max(1.0, 4.0 * dof)
    while _chi2_cdf_even(high, dof) < p:
        high *= 2
    for _ in range(64):
        middle = (low + high) / 2
        if _chi2_cdf_even(middle, dof) < p:
            low = middle
        else:
            high = middle
    return (low + high) / 2


def mtbf_range(exposure: float, failures: int, confidence: float = CONFIDENCE) -> tuple[float, float, float]:
    """(low, estimate, high) of the mean time between failures after `failures` in `exposure` seconds."""
    if failures < 1:
        raise ValueError("an MTBF needs at least one failure")
    tail = (1 - confidence) / 2
    low = 2 * exposure / chi2_quantile_even(1 - tail, 2 * failures + 2)
    high = 2 * exposure / chi2_quantile_even(tail, 2 * failures)
    return low, exposure / failures, high


@dataclass(frozen=True)
class Advice:
    """What the advisor says after `failures` failures in `exposure` seconds (all seconds)."""

    failures: int
    mtbf: float
    interval: float  # of highest goodput averaged over the MTBF's posterior (advised_interval)
    low: float  # Daly's interval at the low and the high end of the MTBF's 90% interval
    high: float
    goodput: float  # expected at the advised interval
    current_goodput: float | None  # ... at the interval the run uses, where known

    @property
    def loss(self) -> float | None:
        """The share of wall time the current interval loses against the advised one."""
        return None if self.current_goodput is None else max(0.0, self.goodput - self.current_goodput)


def advise(
    exposure: float, failures: int, save: float, lost_per_failure: float = 0.0, current: float | None = None
) -> Advice | None:
    """The advice for a run that saw `failures` failures in `exposure` seconds and saves in `save` seconds, each
    failure costing `lost_per_failure` seconds besides the lost work; `current`: the interval it uses now. None
    until the run has failed once and saved once (no MTBF, or no save cost, to reason from)."""
    if failures < 1 or save <= 0 or exposure <= 0:
        return None
    low_mtbf, mtbf, high_mtbf = mtbf_range(exposure, failures)
    interval = advised_interval(save, exposure, failures, lost_per_failure)
    return Advice(
        failures,
        mtbf,
        interval,
        daly_interval(save, low_mtbf),
        daly_interval(save, high_mtbf),
        expected_goodput(interval, save, mtbf, lost_per_failure),
        None if current is None or current <= 0 else expected_goodput(current, save, mtbf, lost_per_failure),
    )
