"""What activation statistics cost per step, and what the other ways MindSpore offers would cost (docs/activations.md).

On the demo model (a 2-layer d_model-64 Transformer classifier, batch 16 x 32 tokens) with four layers watched (embed,
both encoder layers, head), each variant trains in rounds interleaved with the others (so a neighbour's load falls on
all of them alike); a row gives the wall time of a step (median and 10th percentile of every step timed alone) and its
difference from the plain step's. GRAPH mode: the plain step; the ordinary graph with the wrappers in place (every step
between two measured ones); the measured graph with the read after it (a measured step); and two ways not taken, an
in-graph `if` on a Parameter flag and summary operators (TensorSummary). PYNATIVE mode: the plain step; a measured step
(hooks that keep the outputs, registered and removed around it, and the reduction after it); and hooks that reduce with
operators one by one inside the step. Then the probe's own step-end call between measured steps, and the time to
compile the measured graph.

python -m benchmarks.activations [--steps N] [--rounds R] prints the rows as a Markdown table.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
import timeit
from collections.abc import Callable
from typing import Any

import numpy as np

LAYERS = ("embed", "encoder.layers.0", "encoder.layers.1", "head")


def _inputs() -> tuple[Any, ...]:
    from mindspore import Tensor

    from ms_exporter.demo import BATCH, SEQ_LEN, PaddedTokens

    source = PaddedTokens(size=BATCH, seq_len=SEQ_LEN, seed=0)
    rows = [source[i] for i in range(BATCH)]
    return tuple(Tensor(np.stack([row[k] for row in rows])) for k in range(3))


def _train_cell(network: Any) -> Any:
    from mindspore import nn

    cell = nn.TrainOneStepCell(network, nn.AdamWeightDecay(network.trainable_params(), 1e-3))
    cell.set_train()
    cell.phase = "train"
    return cell


def _selected(network: Any) -> tuple[dict[str, Any], list[tuple[str, Any]]]:
    from ms_exporter.cells.activation_stats import named_cells

    named = named_cells(network)
    parents = {name: (parent, attribute) for name, _, parent, attribute in named}
    return parents, [(name, cell) for name, cell, _, _ in named if name in LAYERS]


class _Alternative:
    """A way not taken, for the comparison: wrappers that compute the statistics under an in-graph `if` on a
    Parameter flag, or hand them to a summary operator."""

    @staticmethod
    def wrap(network: Any, how: str) -> Any:
        from mindspore import Parameter, Tensor, nn, ops

        from ms_exporter.cells.activation_stats import SIZE, activation_statistics

        flag = Parameter(Tensor(False), name="benchmark_flag", requires_grad=False)

        class Flagged(nn.Cell):
            def __init__(self, inner: Any, layer: str) -> None:
                super().__init__(auto_prefix=False)
                self.inner = inner
                statistics = Parameter(Tensor(np.zeros(SIZE, np.float32)), name=f"bench.{layer}", requires_grad=False)
                object.__setattr__(self, "statistics", statistics)
                object.__setattr__(self, "flag", flag)

            def construct(self, *args: Any, **kwargs: Any) -> Any:
                output = self.inner(*args, **kwargs)
                if self.flag:
                    output = ops.depend(output, ops.assign(self.statistics, activation_statistics(output)))
                return output

        class Summarised(nn.Cell):
            def __init__(self, inner: Any, layer: str) -> None:
                super().__init__(auto_prefix=False)
                self.inner = inner
                self.tag = layer
                self.summary = ops.TensorSummary()

            def construct(self, *args: Any, **kwargs: Any) -> Any:
                output = self.inner(*args, **kwargs)
                self.summary(self.tag, activation_statistics(output))
                return output

        kind = Flagged if how == "flag" else Summarised
        parents, selected = _selected(network)
        for layer, cell in selected:
            parent, attribute = parents[layer]
            parent.insert_child_to_cell(attribute, kind(cell, layer))
        return flag


def _variants_graph() -> dict[str, tuple[Callable[[], None], str]]:
    from ms_exporter.cells.activation_stats import MeasuredGraph, wrap
    from ms_exporter.demo import build_network

    inputs = _inputs()
    variants: dict[str, tuple[Callable[[], None], str]] = {}

    plain = _train_cell(build_network())
    variants["plain step"] = (lambda: plain(*inputs).asnumpy(), "")

    network = build_network()
    parents, selected = _selected(network)
    cell = _train_cell(network)
    graph = MeasuredGraph(cell, wrap(parents, selected, {}))
    variants["between measured steps: the ordinary graph, wrappers in place"] = (lambda: cell(*inputs).asnumpy(), "")

    measured_network = build_network()
    parents, selected = _selected(measured_network)
    measured_cell = _train_cell(measured_network)
    measured = MeasuredGraph(measured_cell, wrap(parents, selected, {}))
    measured.arm()

    def measured_step() -> None:
        measured_cell(*inputs).asnumpy()
        measured.statistics()

    variants["a measured step: the measured graph and the read"] = (measured_step, "")

    flagged_network = build_network()
    flag = _Alternative.wrap(flagged_network, "flag")
    flagged = _train_cell(flagged_network)
    variants["not taken: in-graph `if` on a Parameter flag, flag off"] = (lambda: flagged(*inputs).asnumpy(), "")

    summarised_network = build_network()
    _Alternative.wrap(summarised_network, "summary")
    summarised = _train_cell(summarised_network)
    variants["not taken: TensorSummary of the statistics, every step"] = (lambda: summarised(*inputs).asnumpy(), "")

    del graph, flag
    return variants


def _variants_pynative() -> dict[str, tuple[Callable[[], None], str]]:
    from mindspore import ops

    from ms_exporter.cells.activation_stats import OutputHooks, activation_statistics
    from ms_exporter.demo import build_network

    inputs = _inputs()
    variants: dict[str, tuple[Callable[[], None], str]] = {}
    plain = _train_cell(build_network())
    variants["plain step (also every step between measured ones: no hook registered)"] = (
        lambda: plain(*inputs).asnumpy(),
        "",
    )

    network = build_network()
    _, selected = _selected(network)
    cell = _train_cell(network)
    hooks = OutputHooks(selected)

    def measured_step() -> None:
        hooks.arm()
        cell(*inputs).asnumpy()
        hooks.disarm()
        hooks.statistics()

    variants["a measured step: hooks keep the outputs, one compiled reduction a layer after it"] = (measured_step, "")

    eager_network = build_network()
    _, eager_selected = _selected(eager_network)
    eager = _train_cell(eager_network)
    kept: list[Any] = []
    for _, layer in eager_selected:
        layer.register_forward_hook(lambda c, a, output: kept.append(activation_statistics(ops.stop_gradient(output))))

    def eager_step() -> None:
        eager(*inputs).asnumpy()
        for values in kept:
            values.asnumpy()
        kept.clear()

    variants["not taken: hooks that reduce operator by operator inside the step"] = (eager_step, "")
    return variants


def _interleaved(variants: dict[str, tuple[Callable[[], None], str]], steps: int, rounds: int) -> list[dict[str, Any]]:
    """Each step timed alone, the variants taking turns in rounds; the median and the 10th percentile of the steps
    (on a shared machine the low percentile is the step without a neighbour's interference)."""
    for run, _ in variants.values():  # compile and warm up
        for _ in range(3):
            run()
    times: dict[str, list[float]] = {name: [] for name in variants}
    for _ in range(rounds):
        for name, (run, _) in variants.items():
            for _ in range(steps):
                began = time.perf_counter()
                run()
                times[name].append((time.perf_counter() - began) * 1e3)
    rows: list[dict[str, Any]] = []
    for name in variants:
        rows.append(
            {
                "case": name,
                "median": statistics.median(times[name]),
                "p10": float(np.percentile(times[name], 10)),
            }
        )
    base = rows[0]
    for row in rows:
        for key in ("median", "p10"):
            row["added_" + key] = row[key] - base[key]
    return rows


def _probe_between_steps(calls: int) -> float:
    """µs of the probe's on_step_end on a step that is neither measured nor the one before."""
    import mindspore as ms
    from mindspore import nn

    from ms_exporter.config.sections import ActivationsConfig
    from ms_exporter.core.store import MetricStore
    from ms_exporter.probes.activations import ActivationsProbe

    ms.set_context(mode=ms.PYNATIVE_MODE)
    network = nn.SequentialCell([nn.Dense(4, 4), nn.ReLU()])
    cell = _train_cell(nn.WithLossCell(network, nn.MSELoss()))
    probe = ActivationsProbe(MetricStore(), ActivationsConfig(enable=True, every_n_steps=1_000_000))
    probe.on_train_begin({"train_network": cell, "network": network, "cur_step_num": 0})
    try:
        return min(timeit.repeat(lambda: probe.on_step_end(10, None), number=calls, repeat=5)) / calls * 1e6
    finally:
        probe.close()


def _compile_seconds() -> tuple[float, float]:
    """Seconds to compile the ordinary graph (the first step) and then the measured graph (compile_ahead)."""
    import mindspore as ms

    from ms_exporter.cells.activation_stats import MeasuredGraph, wrap
    from ms_exporter.demo import build_network

    ms.set_context(mode=ms.GRAPH_MODE)
    inputs = _inputs()
    network = build_network()
    parents, selected = _selected(network)
    cell = _train_cell(network)
    graph = MeasuredGraph(cell, wrap(parents, selected, {}))
    began = time.perf_counter()
    cell.compile(*inputs)
    ordinary = time.perf_counter() - began
    began = time.perf_counter()
    graph.compile_ahead(list(inputs))
    return ordinary, time.perf_counter() - began


def measure(steps: int, rounds: int) -> dict[str, Any]:
    import mindspore as ms

    ordinary, measured = _compile_seconds()
    ms.set_context(mode=ms.GRAPH_MODE)
    graph = _interleaved(_variants_graph(), steps, rounds)
    ms.set_context(mode=ms.PYNATIVE_MODE)
    pynative = _interleaved(_variants_pynative(), max(1, steps // 10), rounds)
    return {
        "graph": graph,
        "pynative": pynative,
        "probe_us": _probe_between_steps(200_000),
        "compile": (ordinary, measured),
        "load": os.getloadavg(),
    }


def render(result: dict[str, Any], steps: int, rounds: int) -> str:
    out = [
        f"{rounds} interleaved rounds of {steps} GRAPH steps ({max(1, steps // 10)} PYNATIVE) per variant; "
        f"load average at the end {result['load'][0]:.1f} on {os.cpu_count()} CPUs.",
        "",
        "| mode | case | ms/step: median | 10th percentile | added: median | added: 10th percentile |",
        "|---|---|---|---|---|---|",
    ]
    for mode in ("graph", "pynative"):
        for row in result[mode]:
            out.append(
                f"| {mode.upper()} | {row['case']} | {row['median']:.2f} | {row['p10']:.2f} | "
                f"{row['added_median']:+.2f} | {row['added_p10']:+.2f} |"
            )
    ordinary, measured = result["compile"]
    out += [
        "",
        f"The probe's on_step_end between measured steps: {result['probe_us']:.3f} µs.",
        f"Compiling the ordinary graph: {ordinary:.1f} s; then the measured graph (compile_ahead): {measured:.1f} s.",
    ]
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=50)
    parser.add_argument("--rounds", type=int, default=8)
    args = parser.parse_args(argv)
    print(render(measure(args.steps, args.rounds), args.steps, args.rounds))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
