"""What replica fingerprints and checks cost (docs/divergence.md, docs/sdc.md): one CRC-32 over the demo model's
trained parameters, against the demo model's own step time, per `divergence.every_n_steps` (100) steps; and one
step's replica check (the bit sums of every weight and optimizer state tensor), against one step.

Both are timed in one process after a few GRAPH-mode steps, so the parameters are the compiled graph's.
"""

from __future__ import annotations

import time
from typing import Any

import numpy as np


def measure(fingerprints: int, steps: int, every_n_steps: int = 100) -> dict[str, Any]:
    from benchmarks.opt_in import trained
    from ms_exporter.core.cb_params import optimizer_state_of
    from ms_exporter.features.fingerprint import fingerprint
    from ms_exporter.features.replica_checks import StepChecks

    model, step_ms = trained(2, 64, steps)
    parameters = list(model.train_network.trainable_params())
    times = []
    for _ in range(fingerprints):
        began = time.perf_counter()
        fingerprint(parameters)
        times.append(time.perf_counter() - began)
    fingerprint_ms = float(np.median(times)) * 1e3
    run = {"train_network": model.train_network}
    tensors = {"weights": parameters, "optimizer": optimizer_state_of(run, parameters)}
    checks = StepChecks(tensors, buckets=8, window_steps=64)
    check_times = []
    for step in range(fingerprints):
        began = time.perf_counter()
        checks.read(step)
        check_times.append(time.perf_counter() - began)
    check_ms = float(np.median(check_times)) * 1e3
    return {
        "parameters": int(sum(int(np.prod(p.shape)) for p in parameters)),
        "tensors": len(parameters),
        "fingerprint_ms": fingerprint_ms,
        "fingerprint_p90_ms": float(np.percentile(times, 90)) * 1e3,
        "step_ms": step_ms,
        "every_n_steps": every_n_steps,
        "share": fingerprint_ms / (every_n_steps * step_ms),
        "n": fingerprints,
        "check_tensors": sum(len(t) for t in tensors.values()),
        "check_values": int(sum(int(np.prod(p.shape)) for t in tensors.values() for p in t)),
        "check_ms": check_ms,
        "check_p90_ms": float(np.percentile(check_times, 90)) * 1e3,
        "check_share": check_ms / step_ms,
    }
