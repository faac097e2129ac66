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
    all_cases = [*_reference_cases(), *_monitor_cases()]
    if selection == "quick":
        return [all_cases[index] for index in (0, 1, 5, 6, 7, 8, 9)]
    if selection == "headline":
        return [case for case in all_cases if case.label in HEADLINE]
    return all_cases


def _reference_cases() -> list[Case]:
    """What the monitor is compared with: no callbacks (twice, on two model instances) and MindSpore's own."""
    from mindspore.train import LossMonitor, SummaryCollector, TimeMonitor

    return [
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
    ]


def _monitor_cases() -> list[Case]:
    """The monitor in its configurations, and GradNormTrainOneStepCell without it (what its grad norm cases
    are compared with)."""
    measure_every_10 = _measure_every_10()
    everything = {
        "backend": ["prometheus", "local"],
        "interval": 1,
        "weight_norm": True,
        "grad_norm": {"every_n_steps": 10, "layers": ["head", "encoder.layers.0.linear1"]},
    }
    return [
        Case("TrainingMonitor, defaults", "plain", _monitor()),
        # The hardware monitor is on by default (on a CPU machine: the host reader); its thread never touches the
        # step, so these two should sit within the rounds' noise of the defaults.
        Case("TrainingMonitor, defaults, hardware monitor off", "plain", _monitor(hardware={"enable": False})),
        Case("TrainingMonitor, defaults, hardware read every 0.5 s", "plain", _monitor(hardware={"interval": 0.5})),
        Case(
            "GradNormTrainOneStepCell without a monitor (measures every 10th step)",
            "cell",
            lambda scratch: [measure_every_10()],
        ),
        Case("TrainingMonitor + GradNormTrainOneStepCell, grad norm every 10 steps", "cell", _monitor()),
        Case(
            "TrainingMonitor + GradNormTrainOneStepCell, grad norm every step",
            "cell",
            _monitor(grad_norm={"every_n_steps": 1}),
        ),
        Case(
            "TrainingMonitor, everything on (local backend, weight norm, LayerNorm, 1 s interval)",
            "cell",
            _monitor(**everything),
        ),
        # Rounds are shorter than good_every: this is the per-step part (a batch's hashes, the health score);
        # keeping the states is measured on its own (benchmarks/good_state.py).
        Case(
            "TrainingMonitor, actions.rollback on (its per-step bookkeeping)",
            "plain",
            _monitor(actions={"rollback": {"enable": True}}),
        ),
    ]


def _monitor(**options: Any) -> Callable[[str], list[Any]]:
    """A TrainingMonitor with these options, saving into the measurement's scratch directory."""
    from ms_exporter import TrainingMonitor

    return lambda scratch: [TrainingMonitor(port=0, save_dir=scratch, **options)]


def _measure_every_10() -> Any:
    """The callback class that gives GradNormTrainOneStepCell its default interval where no monitor runs."""
    from mindspore.train import Callback

    class MeasureEvery10(Callback):
        """Without a monitor nobody sets the cell's interval: put back its default of 10."""

        def on_train_begin(self, run_context: Any) -> None:
            run_context.original_args().train_network.every_n_steps = 10

    return MeasureEvery10


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

    ms.set_context(mode=ms.GRAPH_MODE if mode == "graph" else ms.PYNATIVE_MODE)
    workspace = tempfile.TemporaryDirectory(prefix="ms_exporter_bench_")  # removed when measure returns
    scratch = workspace.name
    runs = _runs(cases(selection), layers, d_model, scratch)
    with stdout_to(os.path.join(scratch, "train.log")):
        _warm_up(runs)
        round_medians = _rounds(runs, rounds, steps)
    _close_callbacks(runs)
    return _rows(runs, round_medians)


# A case, the Model it trains, its callbacks (made for this measurement) and its timer.
_Run = tuple[Case, Any, list[Any], StepTimer]


def _runs(selected: list[Case], layers: int, d_model: int, scratch: str) -> list[_Run]:
    """Each case with its model, one Model object per instance, built in the order the cases first name them."""
    models: dict[str, Any] = {}
    runs = []
    for case in selected:
        if case.instance not in models:
            models[case.instance] = _model(INSTANCES[case.instance], layers, d_model)
        runs.append((case, models[case.instance], case.callbacks(scratch), StepTimer()))
    return runs


def _model(cell: bool, layers: int, d_model: int) -> Any:
    """The demo network, seeded, as Model(network, optimizer) or wrapped in GradNormTrainOneStepCell."""
    import mindspore as ms
    from mindspore import nn
    from mindspore.train import Model

    from ms_exporter.cells.train_cells import GradNormTrainOneStepCell
    from ms_exporter.demo import build_network

    ms.set_seed(0)
    network = build_network(layers=layers, d_model=d_model, heads=4)
    optimizer = nn.AdamWeightDecay(network.trainable_params(), learning_rate=nn.CosineDecayLR(1e-5, 1e-4, 10_000))
    return Model(GradNormTrainOneStepCell(network, optimizer)) if cell else Model(network, optimizer=optimizer)


def _warm_up(runs: list[_Run]) -> None:
    """Compiles and warms up every model before timing any."""
    from ms_exporter.demo import synthetic_dataset

    for _, model, callbacks, timer in runs:
        model.train(
            1,
            synthetic_dataset(size=BATCH * 5, batch=BATCH),
            callbacks=[*callbacks, timer.callback],
            dataset_sink_mode=False,
        )
        timer.times.clear()


def _rounds(runs: list[_Run], rounds: int, steps: int) -> dict[int, list[float]]:
    """Every case trained once a round, in an order that rotates: each timer's median step time per round."""
    from ms_exporter.demo import synthetic_dataset

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
    return round_medians


def _close_callbacks(runs: list[_Run]) -> None:
    for _, _, callbacks, _ in runs:
        for callback in callbacks:
            close = getattr(callback, "close", None)
            if callable(close):
                close()


def _rows(runs: list[_Run], round_medians: dict[int, list[float]]) -> list[dict[str, Any]]:
    """A row per case: its step-time statistics and its ratio to the bare run."""
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
