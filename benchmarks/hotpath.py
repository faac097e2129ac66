"""Microseconds per step (step-begin and step-end hooks) on a synthetic step, and the loss's device read alone.

The step-end hook keeps a record and publishes the records to the probes every second (or every 1,024 steps):
the median is a step that only records, the mean spreads the publications over every step and is the figure
the target is judged on."""

from __future__ import annotations

import tempfile
import time
from typing import Any

import numpy as np

from benchmarks.harness import SyntheticRun


def _time_hook(monitor: Any, run: SyntheticRun, steps: int) -> list[float]:
    run.begin(monitor)
    times = []
    context = run.run_context
    for _ in range(steps):
        run.cb_params.cur_step_num += 1
        began = time.perf_counter()
        monitor.on_train_step_begin(context)
        monitor.on_train_step_end(context)
        times.append(time.perf_counter() - began)
    return times


def measure(steps: int) -> list[dict[str, Any]]:
    from ms_exporter import TrainingMonitor
    from ms_exporter.core.sample import read_loss

    rows = []
    workspace = tempfile.TemporaryDirectory(prefix="ms_exporter_bench_")  # removed when measure returns
    cases = [
        ("default settings", "scalar", {}),
        ("grad norm every 10 steps, 7-tuple outputs", "tuple", {"grad_norm": {"every_n_steps": 10}}),
        ("grad norm every step, 7-tuple outputs", "tuple", {"grad_norm": {"every_n_steps": 1}}),
        (
            "everything on (local backend, weight norm, every step)",
            "tuple",
            {
                "backend": ["prometheus", "local"],
                "save_dir": workspace.name,
                "weight_norm": True,
                "grad_norm": {"every_n_steps": 1, "layers": ["block.1.*"]},
            },
        ),
    ]
    for label, outputs, options in cases:
        run = SyntheticRun(outputs)
        monitor = TrainingMonitor(port=0, **options)
        try:
            _time_hook(monitor, run, 200)  # warm-up: tables, series creation
            times = np.asarray(_time_hook(monitor, run, steps)) * 1e6
            monitor.on_train_end(run.run_context)
        finally:
            monitor.close()
        rows.append(
            {
                "case": label,
                "mean_us": float(np.mean(times)),
                "median_us": float(np.median(times)),
                "p90_us": float(np.percentile(times, 90)),
                "p99_us": float(np.percentile(times, 99)),
                "n": steps,
            }
        )
    run = SyntheticRun()
    reads = []
    for _ in range(steps):
        began = time.perf_counter()
        read_loss(run.loss_tensor)
        reads.append(time.perf_counter() - began)
    times = np.asarray(reads) * 1e6
    rows.append(
        {
            "case": "the loss's device-to-host read alone (read_loss on a Tensor; excluded above)",
            "mean_us": float(np.mean(times)),
            "median_us": float(np.median(times)),
            "p90_us": float(np.percentile(times, 90)),
            "p99_us": float(np.percentile(times, 99)),
            "n": steps,
        }
    )
    return rows
