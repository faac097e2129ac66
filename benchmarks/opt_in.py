"""What each opt-in, sampled feature costs per sample: the update ratio's copy and norms, the
TensorBoard histograms' reduction on the device (training thread) and their records (writer thread), and the
data-quality probe on one batch, on the demo model and the larger one, against that model's own step time at the
feature's default sampling interval.

Each part is timed in one process after a few GRAPH-mode steps, so the parameters are the compiled graph's; the
parts are called as the callback calls them (on_step_end, on_step), on the real train network.

python -m benchmarks.opt_in prints the section make bench writes.
"""

from __future__ import annotations

import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks.report import table

Row = dict[str, Any]


def trained(layers: int, d_model: int, steps: int) -> tuple[Any, float]:
    """The demo model after `steps` GRAPH steps, and its median step time (ms) past compilation."""
    import mindspore as ms
    from mindspore.train import Callback

    from ms_exporter.demo import BATCH, build_model, synthetic_dataset

    ms.set_context(mode=ms.GRAPH_MODE)
    model = build_model(grad_norm=False, layers=layers, d_model=d_model)
    ends: list[float] = []

    class StepEnds(Callback):
        def on_train_step_end(self, run_context: Any) -> None:
            run_context.original_args().net_outputs.asnumpy()  # GRAPH mode does not synchronise otherwise
            ends.append(time.perf_counter())

    model.train(1, synthetic_dataset(size=(steps + 10) * BATCH), callbacks=[StepEnds()], dataset_sink_mode=False)
    return model, float(np.median(np.diff(ends[10:]))) * 1e3


def _time(call: Callable[[int], None], samples: int) -> list[float]:
    times = []
    for sample in range(samples):
        began = time.perf_counter()
        call(sample)
        times.append((time.perf_counter() - began) * 1e3)
    return times


def _row(feature: str, where: str, times: list[float], step_ms: float, every: int, model: str) -> Row:
    median = float(np.median(times))
    return {
        "case": f"{model}: {feature}",
        "where": where,
        "median": median,
        "p90": float(np.percentile(times, 90)),
        "n": len(times),
        "step_ms": step_ms,
        "every": every,
        "share": median / (every * step_ms),
    }


def measure(
    samples: int = 100, steps: int = 60, models: tuple[tuple[int, int], ...] = ((2, 64), (6, 256))
) -> list[Row]:
    from mindspore.train.callback import _InternalCallbackParam

    from ms_exporter.core.store import MetricStore

    rows: list[Row] = []
    for layers, d_model in models:
        name = f"{layers} layers, d_model {d_model}"
        model, step_ms = trained(layers, d_model, steps)
        cb = _InternalCallbackParam()
        cb.cur_step_num = 0
        cb.train_network = model.train_network

        store = MetricStore()
        rows.append(_update_ratio(store, cb, samples, step_ms, name))
        rows += _tensorboard_histograms(store, cb, samples, step_ms, name)
        rows.append(_data_quality(samples, step_ms, name))
    return rows


def _update_ratio(store: Any, cb: Any, samples: int, step_ms: float, name: str) -> Row:
    """The update ratio's sample (the copy, the norms and their export), at its default every_n_steps."""
    from ms_exporter.config import UpdateRatioConfig
    from ms_exporter.core.sample import StepSample
    from ms_exporter.probes.update_ratio import UpdateRatioProbe

    config = UpdateRatioConfig(enable=True, every_n_steps=1)
    probe = UpdateRatioProbe(store, config)
    probe.on_train_begin(cb)
    probe.on_step_end(0, None)  # the first copy

    def ratio_sample(sample: int, probe: UpdateRatioProbe = probe) -> None:
        probe.on_step_end(sample + 1, None)
        probe.on_step(StepSample(sample + 1, 1, 1, 0.5, 0.01, None, 1, 0, 0.0, 0.0))

    default_every = UpdateRatioConfig().every_n_steps
    return _row(
        "update ratio (copy, norms, export)",
        "training thread",
        _time(ratio_sample, samples),
        step_ms,
        default_every,
        name,
    )


def _tensorboard_histograms(store: Any, cb: Any, samples: int, step_ms: float, name: str) -> list[Row]:
    """The TensorBoard histograms of the weights: their reduction on the device (the training thread's part) and
    their records (the writer thread's), at tensorboard.collect_freq's default."""
    from ms_exporter.core.errors import ErrorSink
    from ms_exporter.sinks.tensorboard import TensorBoardWriter

    with tempfile.TemporaryDirectory(prefix="ms_exporter_opt_in_") as scratch:
        errors = ErrorSink(store, ("tensorboard",))
        writer = TensorBoardWriter(
            store, Path(scratch), 3600.0, errors.absorb, collect_freq=1, histogram_regular=".*weight.*"
        )
        writer.on_train_begin(cb)
        drawn = len(writer._histogram_parameters)

        def reduce_sample(sample: int, writer: TensorBoardWriter = writer) -> None:
            writer.on_step_end(sample + 1, None)

        reduce_times = _time(reduce_sample, samples)
        queued = [payload for kind, payload in writer._queue if kind == "histograms"]
        writer._queue.clear()

        def make_sample(sample: int, writer: TensorBoardWriter = writer, queued: list[Any] = queued) -> None:
            writer._write_histograms(*queued[sample % len(queued)])
            writer._pending.clear()

        make_times = _time(make_sample, samples)
        writer.close()
    every = 10  # tensorboard.collect_freq's default
    reduced = f"histograms of {drawn} weights, on the device"
    return [
        _row(reduced, "training thread", reduce_times, step_ms, every, name),
        _row(f"histograms of {drawn} weights, records", "writer thread", make_times, step_ms, every, name),
    ]


def _data_quality(samples: int, step_ms: float, name: str) -> Row:
    """One demo batch (16 x 32 tokens and a label) through the data-quality probe: label entropy, lengths, padding,
    duplicates and out-of-vocabulary ids, its default every_n_steps (1)."""
    from mindspore.train.callback import _InternalCallbackParam

    from ms_exporter.config import DataQualityConfig
    from ms_exporter.core.store import MetricStore
    from ms_exporter.demo import BATCH, synthetic_dataset
    from ms_exporter.probes.data_quality import DataQualityProbe

    dataset = synthetic_dataset(size=4 * BATCH)
    names = tuple(dataset.get_col_names())
    batch = next(dataset.create_tuple_iterator())
    config = DataQualityConfig(enable=True, label_column="label", vocab_size=10**6)
    probe = DataQualityProbe(MetricStore(), config, "attention_mask", "input_ids")
    cb = _InternalCallbackParam()
    cb.cur_step_num = 0
    cb.dataset_sink_mode = False
    probe.on_train_begin(cb)
    times = _time(lambda sample: probe.on_batch(sample + 1, batch, names), samples)
    return _row("data quality of a 16 x 32 batch", "training thread", times, step_ms, config.every_n_steps, name)


def opt_in_section(rows: list[dict[str, Any]]) -> list[str]:
    """The sampled, opt-in features (docs/update-ratio.md): what one sample costs, and where."""
    if not rows:
        return []
    return [
        "",
        "## Opt-in features, per sample",
        "",
        "Off by default, so the default cost above does not include them. One sample of each, called as the callback",
        "calls it, on the trained GRAPH-mode model (benchmarks/opt_in.py); the share is the sample's time over the",
        "model's own steps at the feature's default interval (`update_ratio.every_n_steps` 100,",
        "`tensorboard.collect_freq` 10, `data_quality.every_n_steps` 1). Only the training thread's part adds to a",
        "step; the writer thread's part takes a core beside it. Activation statistics switch compiled graphs around",
        "their measured steps, so a call cannot be timed alone: `python -m benchmarks.activations` times whole",
        "trainings with them ([activations.md](activations.md#what-it-costs)).",
        "",
        table(
            rows,
            [
                ("case", "model: feature", ""),
                ("where", "where", ""),
                ("median", "median ms", ".2f"),
                ("p90", "p90 ms", ".2f"),
                ("n", "samples", "d"),
                ("step_ms", "step ms", ".1f"),
                ("every", "every n steps", "d"),
                ("share", "share of those steps", ".2e"),
            ],
        ),
    ]


if __name__ == "__main__":
    # The section make bench writes into docs/benchmarks.md, on its own (about 3 minutes).

    print("\n".join(opt_in_section(measure())))
