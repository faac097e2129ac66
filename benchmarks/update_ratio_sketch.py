"""The update ratio's sketch against the exact ratio, on every layer of real trainings (the demo model and a larger
one): `python -m benchmarks.update_ratio_sketch` rewrites its section of docs/update-ratio.md.

The exact ratio is computed here the way the monitor no longer does: full host copies of every weight at both
samples, norms in float64. The estimate is the probe's own Sketch at the default sketch_size (and two others).
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks.report import write_section
from ms_exporter.config import UpdateRatioConfig
from ms_exporter.probes.grad_norm import LayerIndex
from ms_exporter.probes.update_ratio import Sketch

BEGIN, END = "<!-- sketch-error:begin -->", "<!-- sketch-error:end -->"
SIZES = (256, UpdateRatioConfig().sketch_size, 4096)


class _Training:
    """A demo-shaped classifier trained with Adam in GRAPH mode, one batch at a time."""

    def __init__(self, layers: int, d_model: int, learning_rate: float) -> None:
        import mindspore as ms
        from mindspore import nn

        from ms_exporter.demo import build_network, synthetic_dataset

        ms.set_context(mode=ms.GRAPH_MODE)
        ms.set_seed(0)
        self.network = build_network(layers=layers, d_model=d_model, heads=4)
        self.weights = list(self.network.trainable_params())
        optimizer = nn.Adam(self.weights, learning_rate=learning_rate)
        self.cell = nn.TrainOneStepCell(self.network, optimizer)
        self.batches = list(synthetic_dataset(size=512).create_tuple_iterator())

    def steps(self, count: int, start: int) -> None:
        for i in range(count):
            self.cell(*self.batches[(start + i) % len(self.batches)]).asnumpy()


def _exact(weights: list[np.ndarray], before: list[np.ndarray], index: LayerIndex) -> np.ndarray:
    moved = np.asarray([np.linalg.norm((w - b).astype(np.float64)) for w, b in zip(weights, before)])
    size = np.asarray([np.linalg.norm(w.astype(np.float64)) for w in weights])
    return _ratios(index.layer_norms(moved), index.layer_norms(size))


def _ratios(moved: np.ndarray, size: np.ndarray) -> np.ndarray:
    return np.divide(moved, size, out=np.full_like(moved, np.nan), where=size > 0)


def measure(models: list[tuple[str, int, int]], steps: int, samples: int) -> list[dict[str, Any]]:
    rows = []
    for title, layers, d_model in models:
        training = _Training(layers, d_model, 1e-3)
        names = [p.name for p in training.weights]
        index = LayerIndex(names, (), 0)
        sketches = {size: Sketch(training.weights, size) for size in SIZES}
        errors: dict[int, list[float]] = {size: [] for size in SIZES}
        done = 0
        training.steps(10, done)  # past Adam's first steps
        done += 10
        for _ in range(samples):
            before = [np.array(p.asnumpy(), dtype=np.float32) for p in training.weights]
            kept = {size: sketch.read() for size, sketch in sketches.items()}
            training.steps(steps, done)
            done += steps
            after = [np.array(p.asnumpy(), dtype=np.float32) for p in training.weights]
            exact = _exact(after, before, index)
            for size, sketch in sketches.items():
                now = sketch.read()
                moved, size_now = sketch.norms(now - kept[size]), sketch.norms(now)
                estimate = _ratios(index.layer_norms(moved), index.layer_norms(size_now))
                known = np.isfinite(exact) & (exact > 0)
                errors[size].extend((np.abs(estimate[known] - exact[known]) / exact[known]).tolist())
        largest = max(int(p.size) for p in training.weights)
        parameters = sum(int(p.size) for p in training.weights)
        for size in SIZES:
            found = np.asarray(errors[size])
            sketched = sum(1 for p in training.weights if int(p.size) > size)
            rows.append(
                {
                    "model": title,
                    "parameters": parameters,
                    "layers": len(index.layer_names),
                    "largest": largest,
                    "sketch_size": size,
                    "sketched": sketched,
                    "tensors": len(training.weights),
                    "median": float(np.median(found)),
                    "p95": float(np.percentile(found, 95)),
                    "max": float(found.max()),
                    "stated": 1 / np.sqrt(2 * size),
                    "compared": len(found),
                }
            )
    return rows


def render(rows: list[dict[str, Any]], command: str, seconds: float, steps: int, samples: int) -> str:
    lines = [
        BEGIN,
        f"Measured by `{command}` ({seconds:.0f} s): {samples} samples {steps} steps apart of Adam at 1e-3, each "
        "layer's estimate against its exact ratio (full float64 copies); |estimate - exact| / exact over every layer "
        "and sample.",
        "",
        "| model | parameters | layers | sketch_size | tensors sketched / all | median error | 95th pct | max | "
        "1/sqrt(2k) |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r['model']} | {r['parameters']:,} | {r['layers']} | {r['sketch_size']} "
            f"| {r['sketched']} / {r['tensors']} | {r['median']:.2%} | {r['p95']:.2%} | {r['max']:.2%} "
            f"| {r['stated']:.1%} |"
        )
    lines.append(END)
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--output", default="docs/update-ratio.md")
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args(argv)
    started = time.monotonic()
    models = [("demo (2 layers, d_model 64)", 2, 64), ("larger (6 layers, d_model 256)", 6, 256)]
    steps, samples = (5, 1) if args.quick else (20, 4)
    rows = measure(models if not args.quick else models[:1], steps, samples)
    command = "python -m benchmarks.update_ratio_sketch" + (" --quick" if args.quick else "")
    section = render(rows, command, time.monotonic() - started, steps, samples)
    write_section(section, Path(args.output), BEGIN, END)
    print(section)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
