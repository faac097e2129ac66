"""What the per-layer features cost as the model grows: 1 M to 400 M parameters, every per-layer feature on.

`python -m benchmarks.model_size` (make bench-model-size) trains a stack of Dense + LayerNorm blocks (6 blocks, the
width chosen for the size) with Adam through GradNormTrainOneStepCell, GRAPH mode, each size in a process of its own,
twice: with the monitor and every per-layer feature sampled every 5 steps (gradient norms per layer, weight norms,
update ratios, LayerNorm statistics, activation statistics, replica fingerprints, TensorBoard weight histograms), and
without a monitor (the baseline for step time and peak RSS). It counts every byte the monitor reads from tensors
(`Tensor.asnumpy`/`item`/`tolist` called from ms_exporter's code: on a device each is a device-to-host copy) and
times each part's hooks at the sampled steps. It rewrites its section of docs/benchmarks.md and draws the log-log
plot docs/model-size.svg (matplotlib, from requirements-bench.txt).
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import resource
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks.report import machine, write_section

BLOCKS = 6
BATCH = 8
EVERY = 5
# Width per target size: 6 x (w^2 + 3w) parameters.
WIDTHS = {"1M": 408, "25M": 2040, "100M": 4084, "400M": 8168}
BEGIN, END = "<!-- model-size:begin -->", "<!-- model-size:end -->"


def _network(width: int) -> Any:
    import mindspore as ms
    from mindspore import nn, ops

    class Block(nn.Cell):
        def __init__(self) -> None:
            super().__init__()
            self.dense = nn.Dense(width, width)
            self.norm = nn.LayerNorm((width,))

        def construct(self, x: Any) -> Any:
            return self.norm(ops.relu(self.dense(x)))

    class Stack(nn.Cell):
        def __init__(self) -> None:
            super().__init__()
            self.blocks = nn.CellList([Block() for _ in range(BLOCKS)])

        def construct(self, x: Any) -> Any:
            for block in self.blocks:
                x = block(x)
            return x

    ms.set_seed(0)
    return Stack()


def _dataset(width: int, steps: int) -> Any:
    import mindspore.dataset as ds

    rng = np.random.default_rng(0)
    inputs = rng.normal(size=(BATCH * 4, width)).astype(np.float32)
    targets = rng.normal(size=(BATCH * 4, width)).astype(np.float32)

    def rows() -> Any:
        for i in range(steps * BATCH):
            yield inputs[i % len(inputs)], targets[i % len(targets)]

    return ds.GeneratorDataset(rows, ["x", "y"], shuffle=False).batch(BATCH)


class _Counter:
    """Bytes and calls of tensor reads made from ms_exporter's code, by the part whose hook made them."""

    def __init__(self) -> None:
        self.bytes: collections.Counter[str] = collections.Counter()
        self.calls: collections.Counter[str] = collections.Counter()
        self.current = threading.local()
        self.lock = threading.Lock()
        self.peak_growth: collections.defaultdict[str, float] = collections.defaultdict(float)  # MB of peak RSS
        # first reached in a hook, by part
        self.by_step: collections.Counter[tuple[str, int]] = collections.Counter()  # (part, step) -> bytes
        self.step = 0  # the step whose end the training thread is in (publication runs inside it)

    def patch(self) -> None:
        from mindspore import Tensor

        package = os.sep + "ms_exporter" + os.sep
        for method in ("asnumpy", "item", "tolist"):
            original = getattr(Tensor, method)

            def counted(tensor: Any, *args: Any, _original: Any = original, **kwargs: Any) -> Any:
                value = _original(tensor, *args, **kwargs)
                if package in sys._getframe(1).f_code.co_filename:
                    part = getattr(self.current, "part", "monitor")
                    with self.lock:
                        self.bytes[part] += int(tensor.nbytes)
                        self.by_step[(part, self.step)] += int(tensor.nbytes)
                        self.calls[part] += 1
                return value

            setattr(Tensor, method, counted)


def _timed(parts: list[Any], counter: _Counter, times: dict[str, dict[int, float]]) -> None:
    """Each part's on_step_end (training thread) and on_step (publication) timed by step, and its reads counted."""
    for part in parts:
        for hook in ("on_step_end", "on_step"):
            original = getattr(part, hook, None)
            if original is None:
                continue

            def wrapped(*args: Any, _original: Any = original, _name: str = part.name, **kwargs: Any) -> Any:
                step = args[0] if isinstance(args[0], int) else int(getattr(args[0], "step", -1))
                counter.current.part = _name
                peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
                began = time.perf_counter()
                try:
                    return _original(*args, **kwargs)
                finally:
                    spent = time.perf_counter() - began
                    grew = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - peak
                    if grew > 0:  # the process's peak memory rose inside this part's hook
                        counter.peak_growth[_name] += grew / 1024
                    counter.current.part = "monitor"
                    per_step = times.setdefault(_name, {})
                    per_step[step] = per_step.get(step, 0.0) + spent

            setattr(part, hook, wrapped)


def one(size: str, monitored: bool, steps: int, scratch: str, in_place: bool = False) -> dict[str, Any]:
    """One training of one size, with or without the monitor (run in a process of its own); the monitor's reductions
    compiled as on an accelerator, or (`in_place`) reading the weights in place as on MindSpore's CPU target."""
    import mindspore as ms
    from mindspore import nn
    from mindspore.train import Callback, Model

    from ms_exporter import GradNormTrainOneStepCell
    from ms_exporter.core.device import device_reductions

    device_reductions.read_in_place = in_place

    ms.set_context(mode=ms.GRAPH_MODE)
    width = WIDTHS[size]
    network = _network(width)
    parameters = sum(int(p.size) for p in network.trainable_params())
    optimizer = nn.Adam(network.trainable_params(), learning_rate=1e-4)
    cell = GradNormTrainOneStepCell(nn.WithLossCell(network, nn.MSELoss()), optimizer, every_n_steps=EVERY)
    ends: list[float] = []

    class StepEnds(Callback):
        def on_train_step_end(self, run_context: Any) -> None:
            outputs = run_context.original_args().net_outputs
            (outputs[0] if isinstance(outputs, tuple) else outputs).asnumpy()  # GRAPH mode does not synchronise
            ends.append(time.perf_counter())

    timing = _MonitorTiming(scratch) if monitored else None
    callbacks: list[Any] = [timing.monitor] if timing is not None else []
    callbacks.append(StepEnds())
    model = Model(cell)
    try:
        model.train(1, _dataset(width, steps), callbacks=callbacks, dataset_sink_mode=False)
    finally:
        if timing is not None:
            timing.monitor.close()
    result: dict[str, Any] = {
        "size": size,
        "parameters": parameters,
        "tensors": len(network.trainable_params()),
        "monitored": monitored,
        "in_place": in_place,
        "step_ms": float(np.median(np.diff(ends[2:]))) * 1e3,
        "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
    }
    if timing is not None:
        result.update(timing.figures(steps))
    return result


class _MonitorTiming:
    """The monitor with every per-layer feature sampled every EVERY steps, its step-end hook timed, each part's hooks
    timed and the bytes each reads from tensors counted per step (patched in at train begin)."""

    def __init__(self, scratch: str) -> None:
        from ms_exporter import TrainingMonitor

        self.counter = _Counter()
        self.part_times: dict[str, dict[int, float]] = {}
        self.hook_times: dict[int, float] = {}
        self.monitor = TrainingMonitor(
            {
                "port": 0,
                "save_dir": scratch,
                "backend": ["prometheus", "tensorboard"],
                "grad_norm": {"every_n_steps": EVERY, "layers": [".*"], "max_series": 40, "top_k": 3},
                "weight_norm": True,
                "update_ratio": {"enable": True, "every_n_steps": EVERY},
                "layernorm": {"every_n_steps": EVERY},
                "activations": {"enable": True, "layers": [r"blocks\.\d+\.dense"], "every_n_steps": EVERY},
                "divergence": {"every_n_steps": EVERY, "replica_group": "0"},
                "tensorboard": {"collect_freq": EVERY, "histogram_regular": ".*weight"},
            }
        )
        original_end, original_begin = self.monitor.on_train_step_end, self.monitor.on_train_begin

        def step_end(run_context: Any) -> None:
            self.counter.step = run_context.original_args().cur_step_num
            began = time.perf_counter()
            original_end(run_context)
            self.hook_times[run_context.original_args().cur_step_num] = time.perf_counter() - began

        def train_begin(run_context: Any) -> None:
            original_begin(run_context)
            core = self.monitor._core
            assert core is not None, "the monitor is enabled: its configuration turns every part on"
            _timed(list(core.parts), self.counter, self.part_times)

        self.monitor.on_train_step_end = step_end  # type: ignore[method-assign]
        self.monitor.on_train_begin = train_begin  # type: ignore[method-assign]
        self.counter.patch()

    def figures(self, steps: int) -> dict[str, Any]:
        """The hook's time at sampled and other steps; bytes and time per sample, in all and per part."""
        counter, hook_times = self.counter, self.hook_times
        sampled = [s for s in range(2 * EVERY, steps + 1) if s % EVERY == 0]  # past each reduction's compilation
        others = [hook_times[s] for s in hook_times if s % EVERY and s > 2]

        # Past each reduction's first sample (compiling reads constants once): what every later sample moves.
        def per_sample(parts: list[str]) -> float:
            return float(np.median([sum(counter.by_step[(p, s)] for p in parts) for s in sampled]))

        every_part = sorted({part for part, _ in counter.by_step})
        return {
            "hook_sampled_ms": float(np.median([hook_times[s] for s in sampled])) * 1e3,
            "hook_other_ms": float(np.median(others)) * 1e3,
            "bytes_per_sample": per_sample(every_part),
            "first_sample_bytes": sum(counter.by_step[(p, EVERY)] for p in every_part),
            "parts": {
                name: {
                    "sampled_ms": float(np.median([by_step.get(s, 0.0) for s in sampled])) * 1e3,
                    "bytes_per_sample": per_sample([name]),
                    "peak_growth_mb": counter.peak_growth.get(name, 0.0),
                }
                for name, by_step in self.part_times.items()
            },
            "unattributed_bytes_per_sample": per_sample(["monitor"]),
        }


def measure(sizes: list[str], steps: int) -> list[dict[str, Any]]:
    rows = []
    for size in sizes:
        for monitored, in_place in ((False, False), (True, False), (True, True)):
            with tempfile.TemporaryDirectory(prefix="ms_exporter_size_") as scratch:
                out = Path(scratch) / "result.json"
                command = [sys.executable, "-m", "benchmarks.model_size", "--one", size, "--steps", str(steps)]
                command += ["--output-json", str(out), "--scratch", scratch] + (["--monitored"] if monitored else [])
                command += ["--in-place"] if in_place else []
                variant = "baseline" if not monitored else ("read in place" if in_place else "compiled")
                print(f"model size {size}, {variant} ...", flush=True)
                finished = subprocess.run(command, check=False, stdout=subprocess.DEVNULL)
                if finished.returncode != 0:  # a size that does not fit this machine is said, not skipped quietly
                    why = "killed (out of memory)" if finished.returncode == -9 else f"exit {finished.returncode}"
                    rows.append({"size": size, "monitored": monitored, "in_place": in_place, "failed": why})
                    continue
                rows.append(json.loads(out.read_text()))
    return rows


def _pairs(rows: list[dict[str, Any]], in_place: bool = False) -> list[tuple[dict[str, Any], dict[str, Any]]]:
    """(baseline, monitored) per size that ran both: the compiled reductions', or those read in place."""
    base = {r["size"]: r for r in rows if not r["monitored"] and "failed" not in r}
    return [
        (base[r["size"]], r)
        for r in rows
        if r["monitored"] and r.get("in_place", False) == in_place and "failed" not in r and r["size"] in base
    ]


def render(rows: list[dict[str, Any]], command: str, seconds: float, machine: str) -> str:
    pairs = _pairs(rows)
    lines = [
        BEGIN,
        f"Measured by `{command}` on {machine} ({seconds / 60:.0f} min). {BLOCKS} blocks of Dense + LayerNorm, batch "
        f"{BATCH}, Adam through GradNormTrainOneStepCell, GRAPH mode; every per-layer feature on and sampled every "
        f"{EVERY} steps; each size in a process of its own, without the monitor, with it as an accelerator runs it "
        "(every reduction compiled), and with it as MindSpore's CPU target runs it (weight norms and fingerprints "
        "read the weights in place with numpy: there `asnumpy` is a view, no copy). Bytes: what ms_exporter read "
        "from tensors (`asnumpy`, `item`, `tolist`) at a sampled step past the first, compiled (median; on an "
        "accelerator each is a copy to the host; the first sample also reads the constants MindSpore folds while it "
        "compiles each reduction). Sampled step end: the monitor's step-end hook at a sampled step (median); other "
        "step end: at the steps between samples, where the replica checks of every step are what reads the weights "
        "(docs/sdc.md#what-it-costs). Peak RSS added: with the monitor (compiled) less without.",
        "",
        *_sizes_table(rows, pairs),
        "",
        *_parts_table(pairs),
        "",
        *_extrapolation(pairs),
        "",
        "![cost against model size, log-log](model-size.svg)",
        END,
    ]
    return "\n".join(lines)


def _sizes_table(rows: list[dict[str, Any]], pairs: list[tuple[dict[str, Any], dict[str, Any]]]) -> list[str]:
    """A row per size that ran with and without the monitor, then a row per run that failed."""
    lines = [
        "| parameters | step (no monitor) | bytes to the host per sample | sampled step end | share of a step "
        "| sampled step end, read in place | share of a step | other step end | peak RSS added |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    in_place = {r["size"]: r for _, r in _pairs(rows, in_place=True)}
    for base, r in pairs:
        here = in_place.get(r["size"])
        read = (
            f"{here['hook_sampled_ms']:.1f} ms | {here['hook_sampled_ms'] / base['step_ms']:.1%}" if here else "— | —"
        )
        lines.append(
            f"| {r['parameters'] / 1e6:.1f} M | {base['step_ms']:.0f} ms | {r['bytes_per_sample'] / 1e3:.1f} KB "
            f"| {r['hook_sampled_ms']:.1f} ms | {r['hook_sampled_ms'] / base['step_ms']:.1%} | {read} "
            f"| {r['hook_other_ms']:.2f} ms | {r['peak_rss_mb'] - base['peak_rss_mb']:.0f} MB |"
        )
    for r in rows:
        if "failed" in r:
            variant = "baseline" if not r["monitored"] else ("read in place" if r.get("in_place") else "compiled")
            lines.append(f"| {r['size']} ({variant}) | {r['failed']} | | | | | | | |")
    return lines


def _parts_table(pairs: list[tuple[dict[str, Any], dict[str, Any]]]) -> list[str]:
    """Each part's time and bytes at a sampled step, by size; parts that took no measurable time left out."""
    names = sorted({name for _, r in pairs for name in r["parts"]})
    lines = [
        "Each part at a sampled step, compiled (training thread and publication together): milliseconds, bytes read.",
        "",
        "| part | " + " | ".join(f"{r['parameters'] / 1e6:.0f} M" for _, r in pairs) + " |",
        "|---|" + "---|" * len(pairs),
    ]
    for name in names:
        cells = []
        for _, r in pairs:
            part = r["parts"].get(name, {"sampled_ms": 0.0, "bytes_per_sample": 0})
            cells.append(f"{part['sampled_ms']:.2f} ms, {part['bytes_per_sample'] / 1e3:.1f} KB")
        if any(r["parts"].get(name, {}).get("sampled_ms", 0) > 0.005 for _, r in pairs):
            lines.append(f"| {name} | " + " | ".join(cells) + " |")
    return lines


def _extrapolation(pairs: list[tuple[dict[str, Any], dict[str, Any]]]) -> list[str]:
    """The sampled step end and the step fitted as powers of the parameter count, carried to 7B and 70B; the bytes
    carried by the number of weight tensors."""
    if len(pairs) < 2:
        return []
    n = np.log([r["parameters"] for _, r in pairs])
    fitted: dict[str, dict[float, float]] = {}
    lines = ["Carried to 7 B and 70 B per rank (times fitted as powers of the parameter count N over the sizes):", ""]
    for key, label, unit, scale, value in (
        ("hook", "sampled step end", "ms", 1.0, lambda b, r: r["hook_sampled_ms"]),
        ("step", "training step without the monitor", "ms", 1.0, lambda b, r: b["step_ms"]),
    ):
        slope, intercept = np.polyfit(n, np.log([max(value(b, r), 1e-9) for b, r in pairs]), 1)
        fitted[key] = {big: float(np.exp(intercept + slope * np.log(big))) for big in (7e9, 70e9)}
        at = fitted[key]
        carried = f"7 B: {at[7e9] * scale:,.0f} {unit}, 70 B: {at[70e9] * scale:,.0f} {unit}"
        lines.append(f"- {label}: ~ N^{slope:.2f}; {carried}")
    largest = pairs[-1][1]
    per_tensor = largest["bytes_per_sample"] / largest["tensors"]
    lines.append(
        "- bytes to the host per sample follow the number of weight tensors, not their sizes: "
        f"{per_tensor / 1e3:.1f} KB a tensor at {largest['parameters'] / 1e6:.0f} M ({largest['tensors']} tensors); "
        "a Llama-2-7B layout (291 weight tensors)"
        f" {per_tensor * 291 / 1e6:.1f} MB, 70B (723) {per_tensor * 723 / 1e6:.1f} MB per rank, every "
        "per-layer feature on"
    )
    share = {big: fitted["hook"][big] / fitted["step"][big] for big in (7e9, 70e9)}
    lines += [
        f"- the sampled step end as a share of the step: 7 B: {share[7e9]:.0%}, 70 B: {share[70e9]:.0%}.",
        "",
        "The bytes are a property of the reductions (a few per tensor, the sketch's 4 KB a weight) and carry to any "
        "device. The times are this CPU's: here the device is the host's two cores, so every reduction's pass over "
        "the weights competes with training for the same memory bandwidth; on an accelerator those passes run at the "
        "device memory's speed and only the transfer above reaches the host (not measured: no accelerator here).",
    ]
    return lines


def plot(rows: list[dict[str, Any]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    pairs = _pairs(rows)
    sizes = [r["parameters"] for _, r in pairs]
    figure, axis = plt.subplots(figsize=(6.5, 4.2))
    axis.loglog(sizes, [r["bytes_per_sample"] for _, r in pairs], "o-", label="bytes to the host per sample")
    axis.loglog(sizes, [r["hook_sampled_ms"] * 1e3 for _, r in pairs], "s-", label="sampled step end (µs)")
    in_place = _pairs(rows, in_place=True)
    if in_place:
        axis.loglog(
            [r["parameters"] for _, r in in_place],
            [r["hook_sampled_ms"] * 1e3 for _, r in in_place],
            "d-",
            label="sampled step end, read in place (µs)",
        )
    axis.loglog(sizes, [b["step_ms"] * 1e3 for b, _ in pairs], "^--", label="training step, no monitor (µs)")
    axis.loglog(sizes, [4.0 * 4 * s for s in sizes], ":", label="4 B x (weights + moments + grads): a host copy")
    axis.set_xlabel("parameters")
    axis.grid(True, which="both", alpha=0.3)
    axis.legend(fontsize=8)
    figure.tight_layout()
    figure.savefig(path, format="svg", metadata={"Date": None})
    plt.close(figure)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--sizes", default=",".join(WIDTHS))
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--output", default="docs/benchmarks.md")
    parser.add_argument("--one")
    parser.add_argument("--monitored", action="store_true")
    parser.add_argument("--in-place", action="store_true")
    parser.add_argument("--output-json")
    parser.add_argument("--scratch")
    args = parser.parse_args(argv)
    if args.one:
        result = one(args.one, args.monitored, args.steps, args.scratch or tempfile.mkdtemp(), args.in_place)
        Path(args.output_json).write_text(json.dumps(result))
        return 0
    started = time.monotonic()
    sizes = args.sizes.split(",")
    rows = measure(sizes, args.steps)

    every_size = args.sizes == ",".join(WIDTHS)
    command = "make bench-model-size" if every_size else f"python -m benchmarks.model_size --sizes {args.sizes}"
    section = render(rows, command, time.monotonic() - started, machine())
    output = Path(args.output)
    write_section(section, output, BEGIN, END, heading="## Cost against model size")
    plot(rows, output.parent / "model-size.svg")
    (output.parent / "model-size.json").write_text(json.dumps(rows, indent=1) + "\n")
    print(section)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
