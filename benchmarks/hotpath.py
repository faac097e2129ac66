"""Microseconds per step (step-begin and step-end hooks) on a synthetic step, and the loss's device read alone.

The step-end hook keeps a record and publishes the records to the probes every second (or every 1,024 steps):
the median is a step that only records, the mean spreads the publications over every step and is the figure
the target is judged on."""

from __future__ import annotations

import itertools
import tempfile
import time
from typing import Any

import numpy as np

from benchmarks.harness import SyntheticRun
from benchmarks.report import TARGETS, table, verdict


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


def _time_loop(monitor: Any, run: SyntheticRun, steps: int, grads: Any) -> list[float]:
    """The loop API on the same step: from one step_end's return to the next, which holds the iterator's next()
    (the step's begin) and step_end; the batches themselves cost nothing here."""
    batch = tuple(run.cb_params.train_dataset_element)
    times = []
    began = time.perf_counter()
    for _ in monitor.steps(itertools.repeat(batch, steps), optimizer=run.cb_params.optimizer):
        monitor.step_end(0.5, grads=grads)
        now = time.perf_counter()
        times.append(now - began)
        began = now
    return times


def _gradients(count: int, shape: tuple[int, int]) -> tuple[Any, ...]:
    from mindspore import Tensor

    rng = np.random.default_rng(0)
    return tuple(Tensor(rng.normal(0, 0.01, shape).astype(np.float32)) for _ in range(count))


def _row(label: str, times: np.ndarray, steps: int) -> dict[str, Any]:
    return {
        "case": label,
        "mean_us": float(np.mean(times)),
        "median_us": float(np.median(times)),
        "p90_us": float(np.percentile(times, 90)),
        "p99_us": float(np.percentile(times, 99)),
        "n": steps,
    }


def measure_loop(steps: int) -> list[dict[str, Any]]:
    """The loop API's cost per step beside the Callback's, on the same synthetic step."""
    from ms_exporter import TrainingMonitor

    rows = []
    cases: list[tuple[str, dict[str, Any], tuple[int, int] | None]] = [
        ("loop API: steps() + step_end(loss), default settings", {}, None),
        (
            "loop API: step_end(loss, grads=40 tensors of 4 x 4), grad norm every 10 steps",
            {"grad_norm": {"every_n_steps": 10}},
            (4, 4),
        ),
        (
            "loop API: step_end(loss, grads=40 tensors of 512 x 512), grad norm every 10 steps",
            {"grad_norm": {"every_n_steps": 10}},
            (512, 512),
        ),
    ]
    for label, options, shape in cases:
        run = SyntheticRun()
        grads = _gradients(len(run.params), shape) if shape is not None else None
        monitor = TrainingMonitor(port=0, **options)
        try:
            _time_loop(monitor, run, 200, grads)  # warm-up: tables, series creation
            times = np.asarray(_time_loop(monitor, run, steps, grads)) * 1e6
        finally:
            monitor.close()
        rows.append(_row(label, times, steps))
    return rows


def measure(steps: int) -> list[dict[str, Any]]:
    from ms_exporter import TrainingMonitor
    from ms_exporter.core.sample import read_loss

    rows = []
    workspace = tempfile.TemporaryDirectory(prefix="ms_exporter_bench_")  # removed when measure returns
    cases: list[tuple[str, str, dict[str, Any]]] = [
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
        rows.append(_row(label, times, steps))
    run = SyntheticRun()
    reads = []
    for _ in range(steps):
        began = time.perf_counter()
        read_loss(run.loss_tensor)
        reads.append(time.perf_counter() - began)
    times = np.asarray(reads) * 1e6
    rows.append(_row("the loss's device-to-host read alone (read_loss on a Tensor; excluded above)", times, steps))
    return rows


def target_row(hot: list[dict[str, Any]]) -> str:
    """The hot path's line of the targets table: the default configuration's mean per step."""
    return (
        f"| hot path < 30 µs | {verdict(hot[0]['mean_us'], TARGETS['hot_path_us'], 'µs')} (mean per step with the "
        f"publications, defaults; median {hot[0]['median_us']:.1f} µs) |"
    )


def hot_path_section(hot: list[dict[str, Any]]) -> list[str]:
    """The hot path's section: the Callback's hooks and the loop API on the same synthetic step."""
    return [
        "## The hot path alone",
        "",
        "`on_train_step_begin` + `on_train_step_end` on a synthetic step: real MindSpore optimizer (decaying LR",
        "schedule), a real padded batch (the attention mask is read), 40 parameters. The loss is handed over as",
        "a float; reading it from a Tensor is measured on its own in the fifth row. Most steps only record; the",
        "records go through the probes every second, so the mean (publications spread over every step) is the",
        "cost per step and the median the cost of a step that only records.",
        "",
        table(
            hot,
            [
                ("case", "case", ""),
                ("mean_us", "mean µs", ".1f"),
                ("median_us", "median µs", ".1f"),
                ("p90_us", "p90 µs", ".1f"),
                ("p99_us", "p99 µs", ".1f"),
                ("n", "calls", "d"),
            ],
        ),
        "",
        "With 7-tuple outputs (MindSpore Transformers' shape) the overflow flag is read every step; at sampled",
        "steps the norms are moved to the host and turned into layer series. The loop API rows drive the same step",
        "through `monitor.steps()` (the step's begin) and `monitor.step_end()`, from one step_end's return to the",
        "next; with `grads=` the gradients' norms are taken on the device by one compiled reduction at the sampled",
        "steps (every 10th) and read in one transfer: its cost grows with the gradients' bytes (the last loop row:",
        "10.5 M parameters, a CPU reading them at memory speed).",
        "",
    ]


if __name__ == "__main__":
    # The section make bench writes into docs/benchmarks.md, on its own (about 3 minutes).
    import os

    with tempfile.TemporaryDirectory(prefix="ms_exporter_bench_") as scratch:
        os.environ.setdefault("MS_EXPORTER_SAVE_DIR", scratch)
        print("\n".join(hot_path_section(measure(20_000) + measure_loop(20_000))))
