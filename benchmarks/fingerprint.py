"""What a replica fingerprint costs (docs/divergence.md): one CRC-32 over the demo model's trained parameters,
against the demo model's own step time, per `divergence.every_n_steps` (100) steps.

Both are timed in one process after a few GRAPH-mode steps, so the parameters are the compiled graph's.
"""

from __future__ import annotations

import time
from typing import Any

import numpy as np


def measure(fingerprints: int, steps: int, every_n_steps: int = 100) -> dict[str, Any]:
    from benchmarks.opt_in import trained
    from ms_exporter.features.fingerprint import fingerprint

    model, step_ms = trained(2, 64, steps)
    parameters = list(model.train_network.trainable_params())
    times = []
    for _ in range(fingerprints):
        began = time.perf_counter()
        fingerprint(parameters)
        times.append(time.perf_counter() - began)
    fingerprint_ms = float(np.median(times)) * 1e3
    return {
        "parameters": int(sum(int(np.prod(p.shape)) for p in parameters)),
        "tensors": len(parameters),
        "fingerprint_ms": fingerprint_ms,
        "fingerprint_p90_ms": float(np.percentile(times, 90)) * 1e3,
        "step_ms": step_ms,
        "every_n_steps": every_n_steps,
        "share": fingerprint_ms / (every_n_steps * step_ms),
        "n": fingerprints,
    }
