"""Small statistics shared by the benchmark sections."""

from __future__ import annotations

import numpy as np


def summary(values_seconds: list[float]) -> dict[str, float]:
    """Median, p90 and p99 in milliseconds, and the sample count."""
    array = np.asarray(values_seconds, dtype=np.float64) * 1e3
    return {
        "median": float(np.median(array)),
        "p90": float(np.percentile(array, 90)),
        "p99": float(np.percentile(array, 99)),
        "n": int(array.size),
    }


def bootstrap_medians(values: np.ndarray, rng: np.random.Generator, resamples: int = 1000) -> np.ndarray:
    """The medians of `resamples` bootstrap resamples of `values` (each as long as `values`)."""
    medians: np.ndarray = np.median(rng.choice(values, size=(resamples, len(values))), axis=1)
    return medians


def median_interval(values: np.ndarray, rng: np.random.Generator) -> tuple[float, float]:
    """A bootstrap 95% interval of the median of `values`."""
    low, high = np.percentile(bootstrap_medians(values, rng), [2.5, 97.5])
    return float(low), float(high)
