"""Step-interleaved measurements: callbacks on every other step of one training, compared with their neighbours.

Rounds of whole trainings (benchmarks/training.py) drift by tens of percent on this machine. Here the
configuration changes from one step to the next inside one `Model.train`: a step with the callbacks is
compared with the step just before and just after it, on the same model, data pipeline and machine state,
and the median over thousands of such pairs is reported. Drift cancels; what is left is what the callbacks
cost in the steps where they run (their threads, if any, run in both kinds of steps and are not seen here:
the memory sampler wakes once per `interval`, the endpoint only when scraped).
"""

from __future__ import annotations

import os
import tempfile
import time
from typing import Any

import numpy as np

from benchmarks.training import BATCH, _stdout_to


def _alternate(inner: list[Any]) -> Any:
    """A callback that forwards every hook to `inner` on even steps only (and always at train begin and end)."""
    from mindspore.train import Callback

    class Alternate(Callback):
        def on_train_begin(self, run_context: Any) -> None:
            for callback in inner:
                callback.on_train_begin(run_context)

        def on_train_end(self, run_context: Any) -> None:
            for callback in inner:
                callback.on_train_end(run_context)

        def on_train_epoch_begin(self, run_context: Any) -> None:
            for callback in inner:
                callback.on_train_epoch_begin(run_context)

        def on_train_epoch_end(self, run_context: Any) -> None:
            for callback in inner:
                callback.on_train_epoch_end(run_context)

        def on_train_step_begin(self, run_context: Any) -> None:
            if run_context.original_args().cur_step_num % 2 == 0:
                for callback in inner:
                    callback.on_train_step_begin(run_context)

        def on_train_step_end(self, run_context: Any) -> None:
            if run_context.original_args().cur_step_num % 2 == 0:
                for callback in inner:
                    callback.on_train_step_end(run_context)

    return Alternate()


def _timer() -> Any:
    """Last in the list: reads the loss (GRAPH mode does not synchronise otherwise) and keeps each step's
    interval (previous step end to this step end, so hooks of both the begin and the end are inside)."""
    from mindspore.train import Callback

    class Timer(Callback):
        def __init__(self) -> None:
            super().__init__()
            self.intervals: dict[int, float] = {}
            self.last: float | None = None

        def on_train_step_end(self, run_context: Any) -> None:
            cb_params = run_context.original_args()
            outputs = cb_params.net_outputs
            (outputs[0] if isinstance(outputs, tuple) else outputs).asnumpy()
            now = time.perf_counter()
            if self.last is not None:
                self.intervals[cb_params.cur_step_num] = now - self.last
            self.last = now

    return Timer()


class Publications:
    """Benchmark-only instrumentation: the steps on which the monitor published its records, and how long each
    publication took. The monitor publishes every 0.25 s, on one hooked step in ten to twenty; a median of pair
    ratios over all hooked steps would move with that fraction, so the pairs leave those steps out and their
    own time is added back, spread over every hooked step."""

    def __init__(self, monitor: Any) -> None:
        self.steps: list[int] = []
        self.seconds: list[float] = []
        publish = monitor._publish

        def timed(run_context: Any, wait: bool = False) -> None:
            began = time.perf_counter()
            publish(run_context, wait)
            if run_context is not None:  # the hook's own publications (not train begin or end)
                self.seconds.append(time.perf_counter() - began)
                self.steps.append(int(run_context.original_args()["cur_step_num"]))

        monitor._publish = timed

    def clear(self) -> None:
        self.steps.clear()
        self.seconds.clear()


def pair_ratios(intervals: dict[int, float], chosen: Any) -> np.ndarray:
    """For every chosen step k: its interval over each neighbour's (k-1 and k+1) that is not chosen."""
    ratios = []
    for step, value in intervals.items():
        if not chosen(step):
            continue
        for neighbour in (step - 1, step + 1):
            if neighbour in intervals and not chosen(neighbour):
                ratios.append(value / intervals[neighbour])
    return np.asarray(ratios)


def _summary(label: str, ratios: np.ndarray, amortize: int = 1) -> dict[str, Any]:
    # The median of pair ratios, and a bootstrap 95% interval of that median.
    rng = np.random.default_rng(0)
    medians = np.median(rng.choice(ratios, size=(1000, len(ratios))), axis=1)
    low, high = np.percentile(medians, [2.5, 97.5])
    return {"case": label, "pairs": len(ratios), "ratio": float(np.median(ratios)),
            "cost": (float(np.median(ratios)) - 1) / amortize, "cost_low": (float(low) - 1) / amortize,
            "cost_high": (float(high) - 1) / amortize}


def measure(steps: int) -> list[dict[str, Any]]:
    """The demo model in GRAPH mode: the default monitor, LossMonitor + TimeMonitor, and grad norm every 10 steps."""
    import mindspore as ms
    from mindspore import nn
    from mindspore.train import LossMonitor, Model, TimeMonitor

    from ms_exporter import TrainingMonitor
    from ms_exporter.demo import build_network, synthetic_dataset
    from ms_exporter.train_cells import GradNormTrainOneStepCell

    ms.set_context(mode=ms.GRAPH_MODE)
    scratch = tempfile.mkdtemp(prefix="ms_exporter_paired_")

    def model(cell: bool) -> Any:
        ms.set_seed(0)
        network = build_network(layers=2, d_model=64, heads=4)
        optimizer = nn.AdamWeightDecay(network.trainable_params(), learning_rate=nn.CosineDecayLR(1e-5, 1e-4, 10_000))
        return Model(GradNormTrainOneStepCell(network, optimizer)) if cell else Model(network, optimizer=optimizer)

    def run(train: Any, callbacks: list[Any], recorders: tuple[Publications, ...] = ()) -> dict[int, float]:
        timer = _timer()
        train.train(1, synthetic_dataset(size=BATCH * 5, batch=BATCH), callbacks=[*callbacks, timer],
                    dataset_sink_mode=False)  # compile and warm up
        timer.intervals.clear()
        timer.last = None
        for recorder in recorders:
            recorder.clear()
        with _stdout_to(os.path.join(scratch, "train.log")):
            train.train(1, synthetic_dataset(size=BATCH * steps, batch=BATCH), callbacks=[*callbacks, timer],
                        dataset_sink_mode=False)
        return {step: value for step, value in timer.intervals.items() if step > 3}

    even = lambda step: step % 2 == 0  # noqa: E731 - the steps that run the callbacks under test
    plain = model(cell=False)
    rows = []
    monitor = TrainingMonitor(port=0, save_dir=scratch)
    published = Publications(monitor)
    intervals = run(plain, [_alternate([monitor])], (published,))
    publishing = set(published.steps)
    row = _summary("TrainingMonitor, defaults: steps with its hooks against the steps between (publishing steps "
                   "left out)", pair_ratios(intervals, lambda step: even(step) and step not in publishing))
    hooked = sum(1 for step in intervals if even(step))
    step = float(np.median(list(intervals.values())))
    extra = sum(published.seconds) / max(hooked, 1) / step
    rows.append({**row, "publications": len(published.steps), "hooked": hooked,
                 "publish_ms": float(np.median(published.seconds)) * 1e3 if published.seconds else 0.0,
                 "step_ms": step * 1e3, "publish_extra": extra, "all_steps": row["cost"] + extra,
                 "all_steps_low": row["cost_low"] + extra, "all_steps_high": row["cost_high"] + extra})
    monitor.close()
    rows.append(_summary("LossMonitor + TimeMonitor: steps with their hooks against the steps between",
                         pair_ratios(run(plain, [_alternate([LossMonitor(), TimeMonitor()])]), even)))
    # Grad norm every 10 steps: the cell's measuring graph and the monitor's reading happen on every 10th step;
    # its cost spread over the 10 steps, on top of the monitor's per-step cost measured above.
    monitor = TrainingMonitor(port=0, save_dir=scratch, grad_norm={"every_n_steps": 10})
    tenth = lambda step: step % 10 == 0  # noqa: E731
    rows.append(_summary("grad norm every 10 steps (GradNormTrainOneStepCell + monitor): measured steps against "
                         "their neighbours, spread over 10 steps", pair_ratios(run(model(cell=True), [monitor]), tenth),
                         amortize=10))
    monitor.close()
    return rows
