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
