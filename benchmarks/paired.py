"""Step-interleaved measurements: callbacks on one step in six of one training, compared with their neighbours.

Rounds of whole trainings (benchmarks/training.py) drift by tens of percent on this machine. Here the
configuration changes from one step to the next inside one `Model.train`: steps take turns (the monitor,
none, LossMonitor + TimeMonitor, none, an A/A control, none), each hooked step is compared with the bare
step just before and just after it, on the same model, data pipeline and machine state, and the median over
thousands of such pairs is reported, pooled over several trainings. Drift cancels; what is left is what the
callbacks cost in the steps where they run (their threads, if any, run in both kinds of steps and are not
seen here: the memory sampler wakes once per `interval`, the endpoint only when scraped). The A/A control
shows what the method reads when there is nothing to find.
"""

from __future__ import annotations

import os
import tempfile
import time
from typing import Any

import numpy as np

from benchmarks.report import TARGETS, table, verdict
from benchmarks.stats import bootstrap_medians
from benchmarks.training import BATCH, ratio, stdout_to

SLOTS = 6  # step k runs the callbacks of slot k % 6; odd slots run none: the bare steps hooked steps pair with
MONITOR, LOSS_TIME, CONTROL = 0, 2, 4


def _rotate(slots: dict[int, list[Any]]) -> Any:
    """A callback that forwards step hooks to the callbacks of slot `cur_step_num % SLOTS` only, and every other
    hook (train and epoch begin and end) to all of them."""
    from mindspore.train import Callback

    everyone = [callback for group in slots.values() for callback in group]

    class Rotate(Callback):
        def on_train_begin(self, run_context: Any) -> None:
            for callback in everyone:
                callback.on_train_begin(run_context)

        def on_train_end(self, run_context: Any) -> None:
            for callback in everyone:
                callback.on_train_end(run_context)

        def on_train_epoch_begin(self, run_context: Any) -> None:
            for callback in everyone:
                callback.on_train_epoch_begin(run_context)

        def on_train_epoch_end(self, run_context: Any) -> None:
            for callback in everyone:
                callback.on_train_epoch_end(run_context)

        def on_train_step_begin(self, run_context: Any) -> None:
            for callback in slots.get(run_context.original_args().cur_step_num % SLOTS, ()):
                callback.on_train_step_begin(run_context)

        def on_train_step_end(self, run_context: Any) -> None:
            for callback in slots.get(run_context.original_args().cur_step_num % SLOTS, ()):
                callback.on_train_step_end(run_context)

    return Rotate()


def _nothing() -> Any:
    """The A/A control: a callback whose step hooks only fetch cb_params, through the same forwarding."""
    from mindspore.train import Callback

    class Nothing(Callback):
        def on_train_step_begin(self, run_context: Any) -> None:
            run_context.original_args()

        def on_train_step_end(self, run_context: Any) -> None:
            run_context.original_args()

    return Nothing()


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
    publication took. The monitor publishes every second; a median of pair ratios over
    all hooked steps would move with the fraction of publishing steps, so the pairs leave those steps out, and the
    publications' own time is measured in a training with the monitor on every step (as in use) and added back."""

    def __init__(self, monitor: Any) -> None:
        self.steps: list[int] = []
        self.seconds: list[float] = []
        publish = monitor.core.publisher.publish

        def timed(run_context: Any, wait: bool = False) -> None:
            began = time.perf_counter()
            publish(run_context, wait)
            if run_context is not None:  # the hook's own publications (not train begin or end)
                self.seconds.append(time.perf_counter() - began)
                self.steps.append(int(run_context.original_args()["cur_step_num"]))

        monitor.core.publisher.publish = timed

    def clear(self) -> None:
        self.steps.clear()
        self.seconds.clear()


def pair_ratios(intervals: dict[int, float], chosen: Any, bare: Any) -> np.ndarray:
    """For every chosen step k: its interval over each neighbour's (k-1 and k+1) that is a bare step."""
    ratios = []
    for step, value in intervals.items():
        if not chosen(step):
            continue
        for neighbour in (step - 1, step + 1):
            if neighbour in intervals and bare(neighbour):
                ratios.append(value / intervals[neighbour])
    return np.asarray(ratios)


def _summary(
    label: str, ratios: np.ndarray, amortize: int = 1, per_training: list[float] | None = None
) -> dict[str, Any]:
    # The median of pair ratios, and a bootstrap 95% interval of that median.
    low, high = np.percentile(bootstrap_medians(ratios, np.random.default_rng(0)), [2.5, 97.5])
    median = float(np.median(ratios))
    return {
        "case": label,
        "pairs": len(ratios),
        "ratio": median,
        "cost": (median - 1) / amortize,
        "cost_low": (float(low) - 1) / amortize,
        "cost_high": (float(high) - 1) / amortize,
        "per_training": ", ".join(f"{value * 100:+.2f}%" for value in (per_training or [])),
    }


def difference(first: np.ndarray, second: np.ndarray) -> tuple[float, float, float]:
    """Median of `first` minus median of `second`, with a bootstrap 95% interval (each resampled on its own)."""
    spread = bootstrap_medians(first, np.random.default_rng(1)) - bootstrap_medians(second, np.random.default_rng(2))
    low, high = np.percentile(spread, [2.5, 97.5])
    return float(np.median(first) - np.median(second)), float(low), float(high)


class _Trainings:
    """The demo model in GRAPH mode, trained with the given callbacks, each step's interval timed."""

    def __init__(self, steps: int, scratch: str) -> None:
        import mindspore as ms

        ms.set_context(mode=ms.GRAPH_MODE)
        self.steps, self.scratch = steps, scratch

    def model(self, cell: bool) -> Any:
        import mindspore as ms
        from mindspore import nn
        from mindspore.train import Model

        from ms_exporter.cells.train_cells import GradNormTrainOneStepCell
        from ms_exporter.demo import build_network

        ms.set_seed(0)
        network = build_network(layers=2, d_model=64, heads=4)
        optimizer = nn.AdamWeightDecay(network.trainable_params(), learning_rate=nn.CosineDecayLR(1e-5, 1e-4, 10_000))
        return Model(GradNormTrainOneStepCell(network, optimizer)) if cell else Model(network, optimizer=optimizer)

    def run(self, train: Any, callbacks: list[Any], recorders: tuple[Publications, ...] = ()) -> dict[int, float]:
        """Each step's interval past the first three, after a short training that compiles and warms up."""
        from ms_exporter.demo import synthetic_dataset

        timer = _timer()
        train.train(
            1, synthetic_dataset(size=BATCH * 5, batch=BATCH), callbacks=[*callbacks, timer], dataset_sink_mode=False
        )  # compile and warm up
        timer.intervals.clear()
        timer.last = None
        for recorder in recorders:
            recorder.clear()
        with stdout_to(os.path.join(self.scratch, "train.log")):
            train.train(
                1,
                synthetic_dataset(size=BATCH * self.steps, batch=BATCH),
                callbacks=[*callbacks, timer],
                dataset_sink_mode=False,
            )
        return {step: value for step, value in timer.intervals.items() if step > 3}


def measure(steps: int, trainings: int) -> dict[str, Any]:
    """The demo model in GRAPH mode: the default monitor, LossMonitor + TimeMonitor, the A/A control (in turns
    within the same trainings), the monitor's publications (a training with the monitor on every step) and grad
    norm every 10 steps."""
    with tempfile.TemporaryDirectory(prefix="ms_exporter_paired_") as scratch:
        runs = _Trainings(steps, scratch)
        plain = runs.model(cell=False)
        pooled, rows = _interleaved(runs, plain, trainings)
        monitor_row, loss_time_row, control_row = rows
        publications = _publications(runs, plain)
        extra = publications["share"]
        monitor_row.update(
            publish_extra=extra,
            all_steps=monitor_row["cost"] + extra,
            all_steps_low=monitor_row["cost_low"] + extra,
            all_steps_high=monitor_row["cost_high"] + extra,
        )
        below = difference(np.concatenate(pooled[MONITOR]), np.concatenate(pooled[LOSS_TIME]))
        grad_row = _grad_every_ten(runs)
    return {
        "rows": [*rows, grad_row],
        "monitor": monitor_row,
        "loss_time": loss_time_row,
        "control": control_row,
        "grad": grad_row,
        "publications": publications,
        "trainings": trainings,
        "steps": steps,
        "below_loss_time": {"difference": below[0] + extra, "low": below[1] + extra, "high": below[2] + extra},
    }


def _interleaved(
    runs: _Trainings, plain: Any, trainings: int
) -> tuple[dict[int, list[np.ndarray]], list[dict[str, Any]]]:
    """The monitor, LossMonitor + TimeMonitor and the A/A control in turns within each training: each slot's pair
    ratios per training, and a row per slot over them all (the monitor's publishing steps left out)."""
    from mindspore.train import LossMonitor, TimeMonitor

    from ms_exporter import TrainingMonitor

    bare = lambda step: step % 2 == 1  # noqa: E731
    cases = {
        MONITOR: "TrainingMonitor, defaults (its publishing steps left out)",
        LOSS_TIME: "LossMonitor + TimeMonitor",
        CONTROL: "A/A control: a callback that does nothing",
    }
    pooled: dict[int, list[np.ndarray]] = {slot: [] for slot in cases}
    for _ in range(trainings):
        monitor = TrainingMonitor(port=0, save_dir=runs.scratch)
        published = Publications(monitor)
        intervals = runs.run(
            plain,
            [_rotate({MONITOR: [monitor], LOSS_TIME: [LossMonitor(), TimeMonitor()], CONTROL: [_nothing()]})],
            (published,),
        )
        monitor.close()
        publishing = set(published.steps)
        for slot in cases:
            pooled[slot].append(
                pair_ratios(
                    intervals,
                    lambda step, slot=slot, left_out=publishing: step % SLOTS == slot and step not in left_out,
                    bare,
                )
            )
    rows = [
        _summary(
            label, np.concatenate(pooled[slot]), per_training=[float(np.median(ratios)) - 1 for ratios in pooled[slot]]
        )
        for slot, label in cases.items()
    ]
    return pooled, rows


def _publications(runs: _Trainings, plain: Any) -> dict[str, Any]:
    """The publications, as they happen in use: the monitor on every step, each publication timed."""
    from ms_exporter import TrainingMonitor

    monitor = TrainingMonitor(port=0, save_dir=runs.scratch)
    published = Publications(monitor)
    intervals = runs.run(plain, [monitor], (published,))
    monitor.close()
    records = max(len(intervals), 1)
    return {
        "publications": len(published.steps),
        "records": records,
        "publish_ms": float(np.median(published.seconds)) * 1e3 if published.seconds else 0.0,
        "record_us": sum(published.seconds) / records * 1e6,
        "step_ms": float(np.median(list(intervals.values()))) * 1e3,
        "share": sum(published.seconds) / sum(intervals.values()),
    }


def _grad_every_ten(runs: _Trainings) -> dict[str, Any]:
    """Grad norm every 10 steps: the cell's measuring graph and the monitor's reading happen on every 10th step;
    its cost spread over the 10 steps, on top of the monitor's per-step cost measured in turns."""
    from ms_exporter import TrainingMonitor

    monitor = TrainingMonitor(port=0, save_dir=runs.scratch, grad_norm={"every_n_steps": 10})
    tenth = lambda step: step % 10 == 0  # noqa: E731
    grad_row = _summary(
        "grad norm every 10 steps (GradNormTrainOneStepCell + monitor): measured steps against "
        "their neighbours, spread over 10 steps",
        pair_ratios(runs.run(runs.model(cell=True), [monitor]), tenth, lambda step: not tenth(step)),
        amortize=10,
    )
    monitor.close()
    return grad_row


def target_rows(pairs: dict[str, Any], graph_rows: list[dict[str, Any]]) -> list[str]:
    """The targets table's rows of the default cost, the LossMonitor comparison and the gradient norm: the
    step-interleaved figures, with the rounds of whole trainings (benchmarks/training.py) beside them."""
    second = next(r for r in graph_rows if r["case"].startswith("no callbacks, a second"))
    noise, spread = abs(second["ratio"] - 1), second["ratio_high"] - second["ratio_low"]
    default_cost = ratio(graph_rows, "TrainingMonitor, defaults") - 1
    grad_cost = ratio(graph_rows, "TrainingMonitor + GradNormTrainOneStepCell, grad norm every 10") - 1
    grad_reading = (
        ratio(graph_rows, "TrainingMonitor + GradNormTrainOneStepCell, grad norm every 10")
        / ratio(graph_rows, "GradNormTrainOneStepCell without")
        - 1
    )
    loss_monitor = next((r["ratio"] - 1 for r in graph_rows if r["case"].startswith("LossMonitor")), float("nan"))
    paired_monitor, paired_loss_monitor, paired_grad = pairs["monitor"], pairs["loss_time"], pairs["grad"]
    control, published, below = pairs["control"], pairs["publications"], pairs["below_loss_time"]
    grad_total = paired_monitor["all_steps"] + paired_grad["cost"]
    return [
        f"| default settings cost < 1% of step time (demo model, GRAPH) | step-interleaved, over all steps: "
        f"{verdict(paired_monitor['all_steps'] * 100, TARGETS['step_ratio'] * 100, '%')} "
        f"(95% interval {paired_monitor['all_steps_low'] * 100:+.2f}% to "
        f"{paired_monitor['all_steps_high'] * 100:+.2f}%): "
        f"the steps that do not publish {paired_monitor['cost'] * 100:+.2f}% ({interval(paired_monitor)}; per "
        f"training {paired_monitor['per_training']}) plus {published['share'] * 100:.2f}% for the publications "
        f"({published['publications']} of median {published['publish_ms']:.2f} ms in "
        f"{published['records']} steps of a median {published['step_ms']:.1f} ms, the monitor on every step). "
        f"The A/A control in the same trainings: {control['cost'] * 100:+.2f}% ({interval(control)}). "
        f"Rounds of whole trainings: {default_cost * 100:+.2g}%, where a second model instance without callbacks "
        f"differs by {noise * 100:.2g}% (per-round ratios span {spread * 100:.2g}%) |",
        f"| default settings cost less than MindSpore's LossMonitor + TimeMonitor | step-interleaved, in turns "
        f"within the same trainings: monitor {paired_monitor['all_steps'] * 100:+.2f}% over all steps, "
        f"LossMonitor + TimeMonitor {paired_loss_monitor['cost'] * 100:+.2f}% ({interval(paired_loss_monitor)}; "
        f"they do the same work every step); difference {below['difference'] * 100:+.2f}% (95% interval "
        f"{below['low'] * 100:+.2f}% to {below['high'] * 100:+.2f}%): "
        f"{'met' if below['high'] < 0 else ('**not shown**' if below['difference'] < 0 else '**missed**')}. "
        f"Rounds: monitor "
        f"{default_cost * 100:+.2g}%, LossMonitor + TimeMonitor {loss_monitor * 100:+.2g}% |",
        f"| grad norm every 10 steps < 2% (demo model, GRAPH) | step-interleaved: "
        f"{verdict(grad_total * 100, TARGETS['grad_ratio'] * 100, '%')} (the monitor's per-step cost plus the "
        f"measured steps' extra spread over 10 steps, {paired_grad['cost'] * 100:+.2f}%, {interval(paired_grad)}). "
        f"Rounds: {grad_cost * 100:+.2g}% against no monitor on another model instance; the monitor's reading "
        f"alone, against the same cell without a monitor, {grad_reading * 100:+.2g}% |",
    ]


def interval(row: dict[str, Any]) -> str:
    """A pooled figure's bootstrap interval and its number of pairs."""
    return f"95% interval {row['cost_low'] * 100:+.2f}% to {row['cost_high'] * 100:+.2f}%, {row['pairs']} pairs"


def cost_sections(pairs: dict[str, Any]) -> list[str]:
    """What bounds the default cost, how both methods read, and the step-interleaved table."""
    return [*_publications_cost(pairs), *_how_both_methods_read(), *_interleaved_section(pairs)]


def _publications_cost(pairs: dict[str, Any]) -> list[str]:
    """The section's heading and what the publications and the recording steps cost."""
    paired_monitor, control, published = pairs["monitor"], pairs["control"], pairs["publications"]
    return [
        "## What bounds the default cost",
        "",
        f"The monitor's publications cost {published['share'] * 100:.2f}% of training time: every second the "
        f"records of that second go through the probes, about "
        f"{published['records'] / max(published['publications'], 1):.0f} "
        f"records in {published['publish_ms']:.2f} ms (median), {published['record_us']:.0f} µs a record, spread "
        "over the probes, the",
        "`warn_on_value` checks, the live page's history and the LayerNorm probe's parameter reads every 25 steps",
        "(docs/development.md has a cProfile). A publication's cost is mostly per batch rather than per record",
        "(docs/development.md: publishing every 0.25 s cost about twice as much a record as every second in",
        "earlier paired runs), which is why the monitor publishes once a second. About a third of a record is",
        "the batch's attention mask (holding the tensor until the step is published and reading it;",
        "`Tensor.get_bytes()` instead of `asnumpy()` did not help in training). The steps that only record cost "
        f"{paired_monitor['cost'] * 100:+.2f}%, the A/A control in the same trainings "
        f"{control['cost'] * 100:+.2f}%;",
        "the hooks' own time on a step is a few µs, and what is left is Python running cold between training",
        "steps (5-10x slower than the synthetic hot path below: cold caches, the dataset's threads). Keeping the",
        "step's whole batch until it was published cost about 0.4% of its own (docs/development.md), so step",
        "begin keeps only the batch's shape and its mask. Publishing from a background thread was tried and is",
        "not an option: MindSpore calls from a second thread during a step deadlocked, and steps overlapping such a",
        "publication slowed by about what it costs on the training thread.",
        "",
    ]


def _how_both_methods_read() -> list[str]:
    """How the rounds of whole trainings read, and why the step-interleaved method sits beside them."""
    return [
        "How to read the step-time ratios: each configuration trains its own copy of the model; configurations",
        "take turns in rounds (A B C ... then B C ... A, rotating) after a warm-up round that compiles every",
        "graph, and the first 3 steps of each round are dropped. A step's time is the interval between",
        "consecutive step ends as seen by a timing callback that runs last and reads the loss (GRAPH mode does",
        "not synchronise otherwise), so it includes data loading and every callback. This machine's speed",
        "drifts by 10-30% over minutes, more than the effects measured, so each configuration's median step",
        "time in a round is divided by the bare run's in the same round, and the table gives the median of",
        "those ratios with the lowest and highest round. Configurations that differ only in their callbacks",
        "train the same Model object; two instances of the same model differ by a few percent on their own",
        '(memory layout), which the "second model instance" row measures: a difference between instances',
        "smaller than that is not a measurement.",
        "",
        "Why two methods: on this 2-core machine the per-round ratios of two identical configurations spread",
        "over tens of percent, so rounds of whole trainings carry an uncertainty of a few percent, larger than",
        "the 1% and 2% targets. The step-interleaved measurement (below) changes the configuration from one step",
        "to the next inside one training of one model and compares each step with its neighbours; drift cancels.",
        "One training of a few thousand steps still moves by a few tenths of a percent from the next (see the",
        "per-training column and the A/A control), so the pairs of several trainings are pooled, and the targets",
        "are judged on the pooled median. The monitor publishes its records to the probes once a second; its",
        "publishing steps are left out of its pairs (a median would move with their share) and the publications'",
        "time, measured in a training with the monitor on every step as in use, is added back as a share of",
        "training time. What it does not see: the monitor's threads (the memory sampler once per `interval`;",
        "the endpoint when scraped) run during both kinds of steps; the scrape cost is measured separately below.",
        "",
    ]


def _interleaved_section(pairs: dict[str, Any]) -> list[str]:
    """The step-interleaved section: how the pairs are taken, and their table."""
    return [
        "## Step-interleaved: callbacks on one step in six",
        "",
        f"The demo model (2 layers, d_model 64) in GRAPH mode, {pairs['trainings']} `Model.train` calls of "
        f"{pairs['steps']} steps. A wrapper",
        "forwards step hooks by turns: step k runs the monitor when k % 6 is 0, LossMonitor + TimeMonitor when it",
        "is 2, the A/A control (a callback whose hooks only fetch cb_params) when it is 4, and nothing on odd",
        "steps. Each hooked step's interval (previous step end to its end, read after the loss is synchronised) is",
        "divided by each odd neighbour's. For grad norm every 10 steps, GradNormTrainOneStepCell and the monitor",
        "run on every step of another training, and each 10th step (where the cell runs its measuring graph and",
        "the monitor reads the norms) is divided by its neighbours; that extra is spread over the 10 steps.",
        "Cost = median ratio − 1 (per step for the last row), pooled over the trainings, with each training's",
        "own figure; the targets add the monitor's publications to the first row as described above.",
        "",
        table(
            pairs["rows"],
            [
                ("case", "case", ""),
                ("pairs", "pairs", "d"),
                ("ratio", "median ratio", ".4f"),
                ("cost", "cost per step", ".2%"),
                ("cost_low", "95% low", ".2%"),
                ("cost_high", "95% high", ".2%"),
                ("per_training", "per training", ""),
            ],
        ),
        "",
    ]
