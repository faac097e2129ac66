"""The loop API's contract, in process with a tiny real network: one step per batch handed out, whatever the batches
are; the epochs; what ends the run and how; an action's stop; MindSpore's own hooks never mistaken for it."""

from __future__ import annotations

import sys
from collections.abc import Mapping
from typing import Any

import mindspore as ms
import numpy as np
import pytest
from mindspore import nn
from mindspore.dataset import GeneratorDataset
from mindspore.train import Model

from ms_exporter import TrainingMonitor
from ms_exporter.core import catalogue
from ms_exporter.core.probe import Probe
from tests.support.samples import RecordedSteps

QUIET = {"backend": "prometheus", "port": 0, "hang": {"enable": False}, "goodput": {"enable": False}}


class Ends(Probe):
    """Records each run's end as the parts see it."""

    name = "ends"

    def __init__(self) -> None:
        self.ended: list[tuple[int, bool]] = []
        self.epochs: list[int] = []

    def on_train_end(self, step: int, completed: bool) -> None:
        self.ended.append((step, completed))

    def on_epoch_end(self, run_context: Any, step: int) -> None:
        self.epochs.append(step)


def monitor_with_ends(**settings: Any) -> tuple[TrainingMonitor, Ends]:
    ends = Ends()
    monitor = TrainingMonitor({**QUIET, **settings}, probes=[lambda context: ends])
    return monitor, ends


def rows(count: int, batch: int = 4) -> list[tuple[np.ndarray, np.ndarray]]:
    rng = np.random.default_rng(0)
    return [
        (rng.random((batch, 8), dtype=np.float32), rng.integers(0, 2, batch).astype(np.int32)) for _ in range(count)
    ]


class Step:
    """A functional training step, as MindSpore's quick start writes it."""

    def __init__(self) -> None:
        ms.set_context(mode=ms.PYNATIVE_MODE)
        self.network = nn.Dense(8, 2)
        self.optimizer = nn.SGD(self.network.trainable_params(), 1e-2)
        loss_fn = nn.SoftmaxCrossEntropyWithLogits(sparse=True, reduction="mean")
        self._grad = ms.value_and_grad(lambda x, y: loss_fn(self.network(x), y), None, self.optimizer.parameters)

    def __call__(self, data: Any, label: Any) -> tuple[Any, Any]:
        loss, grads = self._grad(ms.Tensor(data), ms.Tensor(label))
        self.optimizer(grads)
        return loss, grads


def value(monitor: TrainingMonitor, family: catalogue.MetricFamily) -> float:
    monitor.publish()
    return monitor.store.value_of(family)


def test_each_batch_handed_out_is_one_step_over_several_epochs() -> None:
    monitor, ends = monitor_with_ends()
    step = Step()
    try:
        for _ in range(3):
            for data, label in monitor.steps(rows(5), network=step.network, optimizer=step.optimizer):
                loss, grads = step(data, label)
                monitor.step_end(loss, grads=grads)
        assert value(monitor, catalogue.GLOBAL_STEP) == 15
        assert value(monitor, catalogue.EPOCH) == 3
        assert value(monitor, catalogue.SAMPLES) == 15 * 4
        assert ends.epochs == [5, 10, 15]
    finally:
        monitor.close()
    assert ends.ended == [(15, True)]  # close() ended the run, once
    assert monitor.phases.phase == catalogue.ENDED


def test_the_last_steps_of_a_loop_are_served_when_it_ends_without_waiting_for_the_next_loop_or_close() -> None:
    monitor, _ = monitor_with_ends()
    step = Step()
    try:
        for data, label in monitor.steps(rows(30), network=step.network, optimizer=step.optimizer):
            loss, grads = step(data, label)
            monitor.step_end(loss, grads=grads)
        # No publish() here: steps of less than a second each wait for the next publication, which the loop's end is.
        assert monitor.store.value_of(catalogue.GLOBAL_STEP) == 30
        assert monitor.store.value_of(catalogue.STEPS) == 30
        assert monitor.phases.phase == catalogue.EVAL_PHASE  # between loops, as documented
    finally:
        monitor.close()


@pytest.mark.parametrize("iterator", ["tuple", "dict"])
def test_a_mindspore_dataset_iterator_of_either_kind_counts_its_batches(iterator: str) -> None:
    dataset = GeneratorDataset(rows(6), ["data", "label"], shuffle=False).batch(1)
    batches = dataset.create_tuple_iterator() if iterator == "tuple" else dataset.create_dict_iterator()
    monitor, _ = monitor_with_ends()
    step = Step()
    try:
        for batch in monitor.steps(batches, network=step.network, optimizer=step.optimizer):
            data, label = (batch["data"], batch["label"]) if isinstance(batch, Mapping) else batch
            loss, _ = step(data.asnumpy().reshape(4, 8), label.asnumpy().reshape(4))
            monitor.step_end(loss)
        assert value(monitor, catalogue.GLOBAL_STEP) == 6
        assert value(monitor, catalogue.SAMPLES) == 6  # batches of 1 sample (of 4x8 values)
    finally:
        monitor.close()


def test_tokens_and_samples_given_by_keyword_win_over_the_batch() -> None:
    monitor, _ = monitor_with_ends()
    step = Step()
    try:
        for data, label in monitor.steps(rows(3)):
            loss, _ = step(data, label)
            monitor.step_end(loss, tokens=100, samples=2)
        assert value(monitor, catalogue.SAMPLES) == 6
        assert value(monitor, catalogue.TOKENS) == 300
    finally:
        monitor.close()


def test_the_global_gradient_norm_is_the_norm_of_the_grads_handed_in() -> None:
    monitor, _ = monitor_with_ends(grad_norm={"every_n_steps": 2})
    step = Step()
    try:
        for data, label in monitor.steps(rows(4), network=step.network, optimizer=step.optimizer):
            loss, grads = step(data, label)
            monitor.step_end(loss, grads=grads)
            expected = float(np.sqrt(sum(np.square(g.asnumpy().astype(np.float64)).sum() for g in grads)))
        assert value(monitor, catalogue.GRAD_NORM) == pytest.approx(expected, rel=1e-5)  # step 4 was sampled
    finally:
        monitor.close()


def test_a_loop_left_by_break_ends_the_run_completed_at_close() -> None:
    monitor, ends = monitor_with_ends()
    step = Step()
    for data, label in monitor.steps(rows(10)):
        loss, _ = step(data, label)
        monitor.step_end(loss)
        if value(monitor, catalogue.GLOBAL_STEP) == 3:
            break
    assert monitor.phases.phase == catalogue.EVAL_PHASE  # outside the loop: kept aside, not a data wait
    monitor.close()
    assert ends.ended == [(3, True)]
    assert monitor.phases.phase == catalogue.ENDED


@pytest.mark.parametrize(
    ("raised", "ended"), [(RuntimeError, False), (KeyboardInterrupt, True)], ids=["error", "ctrl-c"]
)
def test_leaving_the_with_block_by_an_exception_ends_the_run_as_model_train_does(
    raised: type[BaseException], ended: bool
) -> None:
    ends = Ends()
    step = Step()
    with pytest.raises(raised), TrainingMonitor(QUIET, probes=[lambda context: ends]) as monitor:
        for data, label in monitor.steps(rows(10)):
            loss, _ = step(data, label)
            monitor.step_end(loss)
            raise raised("in the loop body")
    assert ends.ended == [(1, False)]
    assert (monitor.phases.phase == catalogue.ENDED) is ended  # Ctrl-C ends as asked; an error is not an end
    assert monitor.core is not None and monitor.core.closed


def test_a_script_that_dies_of_an_uncaught_error_does_not_end_the_run_at_exit(monkeypatch: pytest.MonkeyPatch) -> None:
    monitor, ends = monitor_with_ends()
    step = Step()
    for data, label in monitor.steps(rows(10)):
        loss, _ = step(data, label)
        monitor.step_end(loss)
        break
    # What the interpreter leaves for the exit handlers after printing an uncaught exception's traceback.
    monkeypatch.setattr(sys, "last_value", RuntimeError("uncaught"), raising=False)
    monitor.close()
    assert ends.ended == [(1, False)]
    assert monitor.phases.phase != catalogue.ENDED


def test_an_early_stop_hands_out_no_more_batches() -> None:
    early_stop = {"enable": True, "unit": "step", "max_nonfinite": 1}
    monitor, ends = monitor_with_ends(actions={"early_stop": early_stop})
    handed = 0
    try:
        for _ in range(2):
            for _batch in monitor.steps(rows(10)):
                handed += 1
                monitor.step_end(float("nan") if handed == 4 else 1.0)
        assert handed == 4
        assert monitor.stop_requested
    finally:
        monitor.close()
    assert ends.ended == [(4, True)]


def test_mindspores_evaluation_steps_are_not_taken_for_loop_steps() -> None:
    """Callback.on_eval_step_end calls step_end(run_context) in MindSpore's base class: the monitor's step_end is the
    loop API's, so an evaluation inside Model.train (or Model.eval) must count no step."""
    monitor, _ = monitor_with_ends()
    ms.set_context(mode=ms.PYNATIVE_MODE)
    network = nn.Dense(8, 2)
    model = Model(
        network,
        nn.SoftmaxCrossEntropyWithLogits(sparse=True, reduction="mean"),
        nn.SGD(network.trainable_params(), 1e-2),
        metrics={"loss": nn.Loss()},
    )
    dataset = GeneratorDataset(rows(5), ["data", "label"], shuffle=False)
    try:
        model.train(1, dataset, callbacks=[monitor], dataset_sink_mode=False)
        model.eval(dataset, callbacks=[monitor], dataset_sink_mode=False)
        assert value(monitor, catalogue.GLOBAL_STEP) == 5
        assert value(monitor, catalogue.STEPS) == 5
    finally:
        monitor.close()


def test_a_with_block_around_model_train_closes_at_its_end_not_at_each_training_s() -> None:
    """MindSpore enters and leaves every callback's context around each training call; a script's `with` around
    two of them closes the monitor only when the script's block ends."""
    ms.set_context(mode=ms.PYNATIVE_MODE)
    network = nn.Dense(8, 2)
    model = Model(
        network, nn.SoftmaxCrossEntropyWithLogits(sparse=True, reduction="mean"), nn.SGD(network.trainable_params())
    )
    dataset = GeneratorDataset(rows(3), ["data", "label"], shuffle=False)
    with TrainingMonitor(QUIET) as monitor:
        model.train(1, dataset, callbacks=[monitor], dataset_sink_mode=False)
        assert monitor.core is not None and not monitor.core.closed
        model.train(1, dataset, callbacks=[monitor], dataset_sink_mode=False)
        assert value(monitor, catalogue.STEPS) == 6
    assert monitor.core.closed


def test_an_evaluation_between_two_loops_is_served_and_kept_aside() -> None:
    monitor, _ = monitor_with_ends()
    step = Step()
    try:
        for epoch in range(2):
            for data, label in monitor.steps(rows(3)):
                loss, _ = step(data, label)
                monitor.step_end(loss)
            if epoch == 0:
                monitor.eval_end({"accuracy": 0.75})
                assert monitor.phases.phase == catalogue.EVAL_PHASE  # still between the loops
        monitor.publish()
        [accuracy] = [
            s.value for s in monitor.store.series_of(catalogue.EVAL_METRIC) if dict(s.labels)["name"] == "accuracy"
        ]
        assert accuracy == 0.75
    finally:
        monitor.close()


def test_a_loop_hands_its_local_gradient_norms_and_an_outlier_is_flagged() -> None:
    """A data-parallel loop computes the norm of its own gradients before its reducer (docs/sdc.md#local-gradients)."""
    from ms_exporter.features.local_gradients import WARMUP_STEPS

    monitor, _ = monitor_with_ends(divergence={"replica_group": "g"})
    step = Step()
    try:
        for number, (data, label) in enumerate(
            monitor.steps(rows(WARMUP_STEPS + 3), network=step.network, optimizer=step.optimizer), start=1
        ):
            loss, grads = step(data, label)
            local = ms.ops.sqrt(sum((g * g).sum() for g in grads))
            monitor.step_end(loss, local_grad_norm=local * (1e6 if number == WARMUP_STEPS + 2 else 1))
        assert value(monitor, catalogue.LOCAL_GRAD_OUTLIERS) == 1
        assert value(monitor, catalogue.LOCAL_GRAD_OUTLIER_STEP) == WARMUP_STEPS + 2
    finally:
        monitor.close()


def test_collective_begin_marks_the_ranks_own_computation_of_the_step() -> None:
    import time

    own = RecordedSteps()
    monitor = TrainingMonitor(QUIET, probes=[lambda context: own])
    step = Step()
    try:
        for index, (data, label) in enumerate(monitor.steps(rows(6), network=step.network, optimizer=step.optimizer)):
            time.sleep(0.03)  # the forward and backward pass, up to the all-reduce
            if index % 2 == 0:
                monitor.collective_begin()
                monitor.collective_begin()  # a second call in the same step changes nothing
            time.sleep(0.02)  # the all-reduce and the optimizer
            loss, _ = step(data, label)
            monitor.step_end(loss)
        monitor.collective_begin()  # outside a step: ignored
        monitor.publish()
    finally:
        monitor.close()
    assert len(own.samples) == 6
    for index, (compute, duration) in enumerate((s.own_compute, s.duration) for s in own.samples):
        if index % 2:
            assert compute == 0.0
        else:
            assert 0.03 <= compute < duration and duration >= 0.05, (compute, duration)


def test_a_save_in_the_loop_is_checkpoint_time_out_of_the_data_wait_and_a_save_the_advisor_counts(
    tmp_path: Any,
) -> None:
    import time

    waits = RecordedSteps()
    monitor = TrainingMonitor(
        {**QUIET, "goodput": {"enable": True}, "save_dir": str(tmp_path)}, probes=[lambda context: waits]
    )
    step = Step()
    phases: list[str | None] = []
    try:
        with monitor.checkpointing():  # before the run: nothing to book
            phases.append(monitor.phases.phase)
        for index, (data, label) in enumerate(monitor.steps(rows(4), network=step.network, optimizer=step.optimizer)):
            loss, _ = step(data, label)
            monitor.step_end(loss)
            if index == 1:
                with monitor.checkpointing():
                    phases.append(monitor.phases.phase)
                    time.sleep(0.2)
                phases.append(monitor.phases.phase)
        with monitor.checkpointing():  # between loops, in the evaluation that follows them
            time.sleep(0.05)
        phases.append(monitor.phases.phase)
        monitor.publish()
        ledger = monitor.phases.ledger
        assert ledger is not None and ledger.saves.count == 2
        assert ledger.seconds()[catalogue.TIME_BUCKETS.index(catalogue.CHECKPOINT)] >= 0.25
    finally:
        monitor.close()
    assert phases == [None, catalogue.CHECKPOINT, catalogue.DATA_WAIT_PHASE, catalogue.EVAL_PHASE]
    seen = [s.data_wait for s in waits.samples]
    assert len(seen) == 4 and seen[2] is not None and seen[2] < 0.2, seen  # the step after the save did not wait


def test_checkpointing_does_nothing_on_a_monitor_that_is_off() -> None:
    monitor = TrainingMonitor({**QUIET, "enable": False})
    with monitor.checkpointing():
        pass
    monitor.close()


def test_a_save_between_two_loops_is_set_aside_once() -> None:
    """The evaluation between two loops sets its time aside, less what a save inside it already set aside."""
    import time

    monitor = TrainingMonitor(QUIET)
    step = Step()
    aside: list[float] = []
    try:
        for epoch in range(2):
            for data, label in monitor.steps(rows(2), network=step.network, optimizer=step.optimizer):
                if epoch == 1 and not aside:
                    assert monitor.core is not None
                    aside.append(monitor.core.clock.hooks)  # what the first step's cycle set aside
                loss, _ = step(data, label)
                monitor.step_end(loss)
            if epoch == 0:
                with monitor.checkpointing():
                    time.sleep(0.5)
    finally:
        monitor.close()
    assert 0.5 <= aside[0] < 1.0, aside  # counted twice, it would be 1.0 or more
