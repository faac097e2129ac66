"""Step time of real training with each kind of callback, interleaved round by round on the same models."""

from __future__ import annotations

import contextlib
import os
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np

from benchmarks.report import table
from benchmarks.stats import summary

BATCH = 16


@dataclass
class Case:
    label: str
    instance: str  # configurations with the same instance train the very same Model object
    callbacks: Callable[[str], list[Any]]  # given a scratch directory


class StepTimer:
    """Last in the callback list: reads the loss (as any real loop does, and as GRAPH mode needs for an honest
    time) and records the time between consecutive step ends."""

    def __init__(self) -> None:
        from mindspore.train import Callback

        timer = self

        class _Timer(Callback):
            def on_train_step_end(self, run_context: Any) -> None:
                outputs = run_context.original_args().net_outputs
                loss = outputs[0] if isinstance(outputs, tuple) else outputs
                loss.asnumpy()
                now = time.perf_counter()
                if timer.last is not None:
                    timer.times.append(now - timer.last)
                timer.last = now

        self.callback = _Timer()
        self.times: list[float] = []
        self.last: float | None = None


HEADLINE = (
    "no callbacks",
    "no callbacks, a second model instance (the noise floor)",
    "LossMonitor + TimeMonitor",
    "TrainingMonitor, defaults",
    "GradNormTrainOneStepCell without a monitor (measures every 10th step)",
    "TrainingMonitor + GradNormTrainOneStepCell, grad norm every 10 steps",
)
# Model instances: "plain" is Model(network, optimizer); "cell" wraps the step in GradNormTrainOneStepCell.
INSTANCES = {"plain": False, "plain-2": False, "cell": True}


def cases(selection: str) -> list[Case]:
    """`all` configurations, the `headline` ones the targets are judged on, or a `quick` smoke set."""
    from mindspore.train import Callback, LossMonitor, SummaryCollector, TimeMonitor

    from ms_exporter import TrainingMonitor

    def monitor(**options: Any) -> Callable[[str], list[Any]]:
        return lambda scratch: [TrainingMonitor(port=0, save_dir=scratch, **options)]

    class MeasureEvery10(Callback):
        """Without a monitor nobody sets the cell's interval: put back its default of 10."""

        def on_train_begin(self, run_context: Any) -> None:
            run_context.original_args().train_network.every_n_steps = 10

    everything = {
        "backend": ["prometheus", "local"],
        "interval": 1,
        "weight_norm": True,
        "grad_norm": {"every_n_steps": 10, "layers": ["head", "encoder.layers.0.linear1"]},
    }
    all_cases = [
        Case("no callbacks", "plain", lambda scratch: []),
        Case("no callbacks, a second model instance (the noise floor)", "plain-2", lambda scratch: []),
        Case("LossMonitor + TimeMonitor", "plain", lambda scratch: [LossMonitor(), TimeMonitor()]),
        Case(
            "SummaryCollector collect_freq=1",
            "plain",
            lambda scratch: [SummaryCollector(os.path.join(scratch, "s1"), collect_freq=1)],
        ),
        Case(
            "SummaryCollector collect_freq=10",
            "plain",
            lambda scratch: [SummaryCollector(os.path.join(scratch, "s10"), collect_freq=10)],
        ),
        Case("TrainingMonitor, defaults", "plain", monitor()),
        # The hardware monitor is on by default (on a CPU machine: the host reader); its thread never touches the
        # step, so these two should sit within the rounds' noise of the defaults.
        Case("TrainingMonitor, defaults, hardware monitor off", "plain", monitor(hardware={"enable": False})),
        Case("TrainingMonitor, defaults, hardware read every 0.5 s", "plain", monitor(hardware={"interval": 0.5})),
        Case(
            "GradNormTrainOneStepCell without a monitor (measures every 10th step)",
            "cell",
            lambda scratch: [MeasureEvery10()],
        ),
        Case("TrainingMonitor + GradNormTrainOneStepCell, grad norm every 10 steps", "cell", monitor()),
        Case(
            "TrainingMonitor + GradNormTrainOneStepCell, grad norm every step",
            "cell",
            monitor(grad_norm={"every_n_steps": 1}),
        ),
        Case(
            "TrainingMonitor, everything on (local backend, weight norm, LayerNorm, 1 s interval)",
            "cell",
            monitor(**everything),
        ),
        # Rounds are shorter than good_every: this is the per-step part (a batch's hashes, the health score);
        # keeping the states is measured on its own (benchmarks/good_state.py).
        Case(
            "TrainingMonitor, actions.rollback on (its per-step bookkeeping)",
            "plain",
            monitor(actions={"rollback": {"enable": True}}),
        ),
    ]
    if selection == "quick":
        return [all_cases[index] for index in (0, 1, 5, 6, 7, 8, 9)]
    if selection == "headline":
        return [case for case in all_cases if case.label in HEADLINE]
    return all_cases


@contextlib.contextmanager
def stdout_to(path: str) -> Iterator[None]:
    """LossMonitor prints every step: send it to a file, as a training log would be."""
    saved = os.dup(1)
    with open(path, "a") as log:
        os.dup2(log.fileno(), 1)
        try:
            yield
        finally:
            os.dup2(saved, 1)
            os.close(saved)


def measure(mode: str, layers: int, d_model: int, rounds: int, steps: int, selection: str) -> list[dict[str, Any]]:
    """Each round trains every case for `steps` steps, in a rotating order; the first 3 steps of a round
    (dataset start-up) are dropped. Configurations that differ only in callbacks train the same Model object,
    so that the comparison is not between two memory layouts. Returns per-case step-time statistics and the
    ratio to no callbacks."""
    import mindspore as ms
    from mindspore import nn
    from mindspore.train import Model

    from ms_exporter.cells.train_cells import GradNormTrainOneStepCell
    from ms_exporter.demo import build_network, synthetic_dataset

    ms.set_context(mode=ms.GRAPH_MODE if mode == "graph" else ms.PYNATIVE_MODE)
    workspace = tempfile.TemporaryDirectory(prefix="ms_exporter_bench_")  # removed when measure returns
    scratch = workspace.name
    models: dict[str, Any] = {}
    runs = []
    for case in cases(selection):
        if case.instance not in models:
            ms.set_seed(0)
            network = build_network(layers=layers, d_model=d_model, heads=4)
            optimizer = nn.AdamWeightDecay(
                network.trainable_params(), learning_rate=nn.CosineDecayLR(1e-5, 1e-4, 10_000)
            )
            models[case.instance] = (
                Model(GradNormTrainOneStepCell(network, optimizer))
                if INSTANCES[case.instance]
                else Model(network, optimizer=optimizer)
            )
        runs.append((case, models[case.instance], case.callbacks(scratch), StepTimer()))
    log = os.path.join(scratch, "train.log")
    with stdout_to(log):
        for _, model, callbacks, timer in runs:  # compile and warm up every model before timing any
            model.train(
                1,
                synthetic_dataset(size=BATCH * 5, batch=BATCH),
                callbacks=[*callbacks, timer.callback],
                dataset_sink_mode=False,
            )
            timer.times.clear()
        round_medians: dict[int, list[float]] = {id(timer): [] for _, _, _, timer in runs}
        for round_index in range(rounds):
            order = runs[round_index % len(runs) :] + runs[: round_index % len(runs)]
            for _, model, callbacks, timer in order:
                before = len(timer.times)
                timer.last = None
                model.train(
                    1,
                    synthetic_dataset(size=BATCH * steps, batch=BATCH, seed=round_index),
                    callbacks=[*callbacks, timer.callback],
                    dataset_sink_mode=False,
                )
                del timer.times[before : before + 2]  # with the missing first interval: 3 steps dropped
                round_medians[id(timer)].append(float(np.median(timer.times[before:])))
    for _, _, callbacks, _ in runs:
        for callback in callbacks:
            close = getattr(callback, "close", None)
            if callable(close):
                close()
    # The machine's speed drifts by more than the effects measured here, so each configuration is compared
    # with the bare run of the same round, and the ratio reported is the median over rounds.
    bare = np.asarray(round_medians[id(runs[0][3])])
    rows = []
    for case, _, _, timer in runs:
        ratios = np.asarray(round_medians[id(timer)]) / bare
        rows.append(
            {
                "case": case.label,
                **summary(timer.times),
                "ratio": float(np.median(ratios)),
                "ratio_low": float(ratios.min()),
                "ratio_high": float(ratios.max()),
            }
        )
    return rows


STEP_COLUMNS = [
    ("case", "configuration", ""),
    ("median", "median ms/step", ".2f"),
    ("p90", "p90 ms", ".2f"),
    ("n", "steps", "d"),
    ("ratio", "ratio to no callbacks (median of rounds)", ".3f"),
    ("ratio_low", "lowest round", ".3f"),
    ("ratio_high", "highest round", ".3f"),
]


def ratio(rows: list[dict[str, Any]], prefix: str) -> float:
    """The median round ratio of the configuration whose name starts with `prefix`."""
    return float(next(r["ratio"] for r in rows if r["case"].startswith(prefix)))


def step_time_sections(steps_tables: list[tuple[str, int, int, list[dict[str, Any]]]]) -> list[str]:
    """A section per measured model and mode: each configuration's step time in rounds."""
    out: list[str] = []
    for title, rounds, steps, rows in steps_tables:
        out += [
            f"## Training step time: {title}",
            "",
            f"{rounds} rounds × {steps} steps per configuration.",
            "",
            table(rows, STEP_COLUMNS),
            "",
        ]
    return out
