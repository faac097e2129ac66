"""actions.rollback in real training, GRAPH and PYNATIVE: a batch made to blow the loss up at a known
step is rolled back, the restored state is checked through the network, the batch is listed, and a rerun through
the wrapper never sees it; a dataset that keeps poisoning ends training at the loop guard."""

from __future__ import annotations

import json
import logging
import math
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import mindspore as ms
import mindspore.dataset as ds
import numpy as np
import pytest
from mindspore import Tensor, nn
from mindspore.train import Callback, Model

from ms_exporter import LossScaleTrainOneStepCell, TrainingMonitor
from ms_exporter.actions.skipped_batches import SkipListedSamples, SkippedBatches, sample_hash
from ms_exporter.core import catalogue as c
from tests.support.disks import fill, small_disk

pytestmark = pytest.mark.integration

BATCH, FEATURES = 4, 8
POISON_STEP = 57  # the batch of this step (epoch 1) carries a target a million times too large
GOOD_EVERY, QUIET = 20, 10
MODES = {"graph": ms.GRAPH_MODE, "pynative": ms.PYNATIVE_MODE}


class Source:
    """Random-access samples (x, y) of a noisy linear target; `poisoned` steps' batches get y = 1e6."""

    def __init__(self, steps: int, poisoned: set[int]) -> None:
        rng = np.random.default_rng(0)
        self.x = rng.normal(size=(steps * BATCH, FEATURES)).astype(np.float32)
        self.y = (self.x @ np.linspace(-1, 1, FEATURES, dtype=np.float32))[:, None] + rng.normal(
            0, 0.1, size=(steps * BATCH, 1)
        ).astype(np.float32)
        for step in poisoned:
            self.y[(step - 1) * BATCH : step * BATCH] = 1e6

    def __getitem__(self, index: int) -> tuple[np.ndarray, np.ndarray]:
        return self.x[index], self.y[index]

    def __len__(self) -> int:
        return len(self.x)


def network() -> nn.Cell:
    ms.set_seed(0)
    return nn.SequentialCell(nn.Dense(FEATURES, 16), nn.ReLU(), nn.Dense(16, 1))


class Probe(Callback):
    """Placed after the monitor: the network's output on a fixed batch after every step (a forward pass, so the
    memory the graphs use is what is read), and the optimizer's step counter. Before each step it also computes
    the step's loss through a forward pass: the training graph's own loss for that batch must equal it, which holds
    only if the training graph computes with the parameters the forward pass reads (after a rollback too)."""

    def __init__(self, net: nn.Cell, loss: nn.Cell, optimizer: nn.Optimizer) -> None:
        self.net, self.loss, self.optimizer = net, loss, optimizer
        self.batch = Tensor(np.random.default_rng(1).normal(size=(BATCH, FEATURES)).astype(np.float32))
        self.outputs: dict[int, np.ndarray] = {}
        self.optimizer_steps: dict[int, int] = {}
        self.losses: dict[int, float] = {}
        self.forward_losses: dict[int, float] = {}

    def on_train_step_begin(self, run_context: Any) -> None:
        cb = run_context.original_args()
        self.forward_losses[cb.cur_step_num] = float(self.loss(*cb.train_dataset_element).asnumpy())

    def on_train_step_end(self, run_context: Any) -> None:
        cb = run_context.original_args()
        step = cb.cur_step_num
        self.outputs[step] = self.net(self.batch).asnumpy().copy()
        self.optimizer_steps[step] = int(self.optimizer.global_step.asnumpy().reshape(-1)[0])
        self.losses[step] = float(cb.net_outputs.asnumpy())


def train(
    mode: str,
    source: Any,
    save_dir: Path,
    before: Sequence[Callback] = (),
    backend: Sequence[str] = ("prometheus", "local"),
    other_actions: dict[str, Any] | None = None,
    **rollback: Any,
) -> tuple[TrainingMonitor, Probe]:
    """One epoch of `source` with rollback on (`rollback`: its settings); `before`: callbacks that run before the
    monitor's at each step."""
    ms.set_context(mode=MODES[mode])
    net = network()
    optimizer = nn.Adam(net.trainable_params(), learning_rate=0.01)
    with_loss = nn.WithLossCell(net, nn.MSELoss())
    model = Model(with_loss, optimizer=optimizer)
    data = ds.GeneratorDataset(source, ["x", "y"], shuffle=False).batch(BATCH)
    monitor = TrainingMonitor(
        port=0,
        backend=list(backend),
        save_dir=str(save_dir),
        interval=1,
        actions={
            "rollback": {"enable": True, "good_every": GOOD_EVERY, "quiet_steps": QUIET, **rollback},
            **(other_actions or {}),
        },
    )
    probe = Probe(net, with_loss, optimizer)
    try:
        model.train(1, data, callbacks=[*before, monitor, probe], dataset_sink_mode=False)
    finally:
        monitor.close()
    return monitor, probe


def counted(monitor: TrainingMonitor, action: str) -> float:
    return next(s.value for s in monitor.store.series_of(c.ACTIONS_TAKEN) if dict(s.labels)["action"] == action)


def records(save_dir: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in (save_dir / "metrics-rank0.jsonl").read_text().splitlines()]


def events(save_dir: Path, action: str) -> list[dict[str, Any]]:
    return [r for r in records(save_dir) if r["type"] == "event" and r["event"] == "action" and r["action"] == action]


@pytest.mark.parametrize("mode", ["graph", "pynative"])
def test_a_poisoned_batch_is_rolled_back_listed_and_skipped_on_a_rerun(
    mode: str, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    steps = 80 if mode == "graph" else 70  # PYNATIVE steps are slower
    source = Source(steps, {POISON_STEP})
    with caplog.at_level(logging.WARNING, logger="ms_exporter"):
        monitor, probe = train(mode, source, tmp_path / "run")
    good = 40  # good states at 20 and 40 (quiet since the start); the poison at 57
    assert counted(monitor, "rollback") == 1
    assert monitor.store.value_of(c.LAST_GOOD_STEP) > POISON_STEP  # kept again once the run was quiet again
    assert monitor.store.value_of(c.ROLLBACK_LOST_STEPS) == POISON_STEP - good
    # The restored state, through the network: the output on the fixed batch is what it was at the good step,
    # and the optimizer's step counter is back there too (its moments with it).
    np.testing.assert_array_equal(probe.outputs[POISON_STEP], probe.outputs[good])
    assert probe.optimizer_steps[POISON_STEP] == probe.optimizer_steps[good]
    assert probe.losses[POISON_STEP] > 1e9  # the spike itself
    # The step after the rollback trains from the restored parameters: its loss is the forward pass's.
    assert probe.losses[POISON_STEP + 1] == pytest.approx(probe.forward_losses[POISON_STEP + 1], rel=1e-5)
    after = [probe.losses[s] for s in range(POISON_STEP + 1, steps + 1)]
    assert all(math.isfinite(v) and v < 100 for v in after), after  # a spike is 1e12
    # The smoothed loss went back with the state: the spike is not in its mean (nor raises the next spike's bar).
    smoothed = {r["step"]: r["loss_smoothed"] for r in records(tmp_path / "run") if r["type"] == "step"}
    assert all(smoothed[s] < 100 for s in range(POISON_STEP + 1, steps + 1)), smoothed
    [warning] = [r.getMessage() for r in caplog.records if "rollback at step" in r.getMessage()]
    assert f"restored the good state of step {good}, {POISON_STEP - good} steps lost" in warning
    [event] = events(tmp_path / "run", "rollback")
    assert event["step"] == POISON_STEP and event["good_step"] == good and event["reason"] == "loss_spike"
    # The list names the poisoned batch (with the batches trained since the good state), by content.
    listed = SkippedBatches(tmp_path / "run").read()
    assert [b["step"] for b in listed] == list(range(good + 1, POISON_STEP + 1))
    poisoned = next(b for b in listed if b["step"] == POISON_STEP)
    assert poisoned["position"] == POISON_STEP and poisoned["epoch"] == 1
    assert poisoned["sample_hashes"] == [
        sample_hash(source[i]) for i in range((POISON_STEP - 1) * BATCH, POISON_STEP * BATCH)
    ]
    # The rerun from the same seed through the wrapper: the listed samples are left out, nothing spikes.
    wrapped = SkipListedSamples(Source(steps, {POISON_STEP}), tmp_path / "run")
    rerun, rerun_probe = train(mode, wrapped, tmp_path / "rerun")
    assert wrapped.skipped == (POISON_STEP - good) * BATCH
    assert counted(rerun, "rollback") == 0
    assert all(math.isfinite(v) and v < 100 for v in rerun_probe.losses.values()), rerun_probe.losses


@pytest.mark.parametrize("mode", ["graph", "pynative"])
def test_a_dataset_that_keeps_poisoning_stops_at_the_loop_guard(
    mode: str, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    steps = 200
    source = Source(steps, set(range(20, steps + 1, 20)))
    with caplog.at_level(logging.WARNING, logger="ms_exporter"):
        monitor, probe = train(mode, source, tmp_path, good_every=5, quiet_steps=3, max_rollbacks=2, window_steps=1000)
    assert counted(monitor, "rollback") == 2 and counted(monitor, "rollback_stop") == 1
    assert max(probe.losses) == 60  # rolled back at 20 and 40, stopped after the step of 60
    [stop] = [r.getMessage() for r in caplog.records if "rollback_stop" in r.getMessage()]
    assert "after 2 rollbacks within 1000 steps" in stop
    [event] = events(tmp_path, "rollback_stop")
    assert event["step"] == 60 and "max_rollbacks 2" in event["reason"]


class Scales(Callback):
    """The loss scale each step started with and its overflow flag, as the train cell reports them."""

    def __init__(self) -> None:
        self.scales: dict[int, float] = {}
        self.overflows: dict[int, bool] = {}

    def on_train_step_end(self, run_context: Any) -> None:
        cb = run_context.original_args()
        self.scales[cb.cur_step_num] = float(cb.net_outputs[2].asnumpy())
        self.overflows[cb.cur_step_num] = bool(cb.net_outputs[1].asnumpy())


def train_with_loss_scale(tmp_path: Path, rollback: bool) -> tuple[TrainingMonitor, Scales]:
    ms.set_context(mode=ms.GRAPH_MODE)
    source = Source(60, set())
    source.y[(POISON_STEP - 1) * BATCH : POISON_STEP * BATCH] = np.inf
    net = network()
    cell = LossScaleTrainOneStepCell(
        nn.WithLossCell(net, nn.MSELoss()),
        nn.Adam(net.trainable_params(), 0.01),
        init_scale=2.0**10,
        scale_window=10_000,
    )
    monitor = TrainingMonitor(
        port=0,
        backend=["prometheus"],
        save_dir=str(tmp_path),
        actions={"rollback": {"enable": rollback, "good_every": GOOD_EVERY, "quiet_steps": QUIET}},
    )
    scales = Scales()
    try:
        Model(cell).train(
            1,
            ds.GeneratorDataset(source, ["x", "y"], shuffle=False).batch(BATCH),
            callbacks=[monitor, scales],
            dataset_sink_mode=False,
        )
    finally:
        monitor.close()
    return monitor, scales


def test_the_loss_scale_comes_back_with_the_weights(tmp_path: Path) -> None:
    """An infinite target overflows the scaled gradients: the cell halves its scale and skips the update, and the
    loss is not finite. Without rollback the next step starts from the halved scale; with it, from the good
    step's, which the train cell itself reports."""
    _, alone = train_with_loss_scale(tmp_path / "alone", rollback=False)
    assert alone.overflows[POISON_STEP] and alone.scales[POISON_STEP + 1] == 2.0**9
    monitor, scales = train_with_loss_scale(tmp_path / "rollback", rollback=True)
    assert counted(monitor, "rollback") == 1 and scales.overflows[POISON_STEP]
    assert scales.scales[POISON_STEP + 1] == scales.scales[40] == 2.0**10


# -- actions that fail alone (docs/reliability.md) ----------------------------------------------------------------


class AtStep(Callback):
    """Does `action` at the end of `step`, before the monitor's step end."""

    def __init__(self, step: int, action: Callable[[], Any]) -> None:
        self.step, self.action = step, action

    def on_train_step_end(self, run_context: Any) -> None:
        if run_context.original_args().cur_step_num == self.step:
            self.action()


def written(directory: Path, pattern: str = "good-*.npz") -> Path:
    """The good state file matching `pattern`, once its background write has renamed it into place."""
    deadline = time.monotonic() + 60
    while not (found := sorted(directory.glob(pattern))):
        if time.monotonic() > deadline:
            raise TimeoutError(f"no {pattern} in {directory}")
        time.sleep(0.01)
    return found[-1]


def disabled(monitor: TrainingMonitor) -> set[str]:
    return {dict(s.labels)["component"] for s in monitor.store.series_of(c.COMPONENT_DISABLED) if s.value == 1}


def errors(monitor: TrainingMonitor, component: str) -> float:
    return next((s.value for s in monitor.store.series_of(c.ERRORS) if dict(s.labels)["component"] == component), 0.0)


def test_a_full_disk_switches_off_keeping_alone_and_the_divergence_is_still_rolled_back(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """The disk fills after the good state of step 10 or so: the keeps of steps 20, 21, 22 fail and keeping is
    switched off, alone; the divergence at step 37 is rolled back to the state kept before, and early stop is still
    on."""
    poison = 37
    with small_disk(tmp_path / "disk") as disk, caplog.at_level(logging.INFO, logger="ms_exporter"):
        monitor, probe = train(
            "graph",
            Source(45, {poison}),
            disk,
            before=[AtStep(15, lambda: (written(disk / "good-states"), fill(disk, 0)))],
            backend=["prometheus"],
            other_actions={"early_stop": {"enable": True, "patience": 10_000}},
            good_every=10,
            quiet_steps=5,
            storage="disk",
        )
        leftovers = [p.name for p in disk.rglob("*partial*")]
    assert counted(monitor, "rollback") == 1
    good = poison - int(monitor.store.value_of(c.ROLLBACK_LOST_STEPS))
    assert 10 <= good < 15  # the state kept before the disk filled (its first step with quiet_steps and health)
    np.testing.assert_array_equal(probe.outputs[poison], probe.outputs[good])
    assert all(probe.losses[s] < 100 for s in range(poison + 1, 46))
    assert disabled(monitor) == {"actions.rollback.keep"}  # not early stop, not rollback, not "actions"
    assert errors(monitor, "actions.rollback.keep") == 3
    assert errors(monitor, "actions.rollback.list") == 1  # the list could not be written either: still counted
    assert leftovers == []  # no temporary of a failed keep or list stays on the disk
    said = "\n".join(r.getMessage() for r in caplog.records)
    assert "actions.rollback.keep failed 3 times in a row and is switched off" in said
    assert "No space left on device" in said
    assert (
        f"keeping good states is off: a rollback restores the states kept before (step {good}); early stop goes "
        "on" in said
    )
    assert f"rollback at step {poison}" in said and "could not be listed" in said


def test_a_newest_state_that_cannot_be_read_gives_way_to_the_one_before(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    poison = 27

    def truncate_newest() -> None:
        newest = written(tmp_path / "good-states", "good-*step000000000020-*.npz")
        newest.write_bytes(newest.read_bytes()[:200])

    with caplog.at_level(logging.WARNING, logger="ms_exporter"):
        monitor, probe = train(
            "graph",
            Source(35, {poison}),
            tmp_path,
            before=[AtStep(25, truncate_newest)],
            good_every=10,
            quiet_steps=5,
            storage="disk",
        )
    assert counted(monitor, "rollback") == 1
    [event] = events(tmp_path, "rollback")
    good = int(event["good_step"])
    assert 10 <= good < 15 and monitor.store.value_of(c.ROLLBACK_LOST_STEPS) == poison - good
    np.testing.assert_array_equal(probe.outputs[poison], probe.outputs[good])
    said = "\n".join(r.getMessage() for r in caplog.records)
    assert (
        "the good state of step 20" in said
        and "cannot be read back" in said
        and f"trying the one of step {good}" in said
    )
    assert disabled(monitor) == set()


def test_a_corrupt_list_leaves_the_rollback_counted_announced_and_listed(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    poison = 27
    (tmp_path / "skipped-batches.json").write_text('{"version": 1, "batches": [')
    with caplog.at_level(logging.WARNING, logger="ms_exporter"):
        monitor, _ = train("graph", Source(30, {poison}), tmp_path, good_every=10, quiet_steps=5)
    assert counted(monitor, "rollback") == 1
    [event] = events(tmp_path, "rollback")
    good = int(event["good_step"])
    assert 20 <= good < 25 and event["batches_listed"] == poison - good
    assert [b["step"] for b in SkippedBatches(tmp_path).read()] == list(range(good + 1, poison + 1))
    [aside] = tmp_path.glob("skipped-batches.json.unusable-*-corrupt")
    assert aside.read_text() == '{"version": 1, "batches": ['
    assert any("moved aside" in r.getMessage() for r in caplog.records)


def test_a_functional_loop_is_rolled_back_through_the_network_and_optimizer_it_handed_in(tmp_path: Path) -> None:
    """The same poisoned batch in MindSpore's functional loop (value_and_grad, an optimizer call) driven through the
    loop API: the good state is kept from the network and optimizer given to steps(), and restored into them."""
    ms.set_context(mode=ms.PYNATIVE_MODE)
    steps = 70
    net = network()
    loss_fn = nn.MSELoss()
    optimizer = nn.Adam(net.trainable_params(), learning_rate=0.01)
    grad_fn = ms.value_and_grad(lambda x, y: loss_fn(net(x), y), None, optimizer.parameters)
    fixed = Tensor(np.random.default_rng(1).normal(size=(BATCH, FEATURES)).astype(np.float32))
    data = ds.GeneratorDataset(Source(steps, {POISON_STEP}), ["x", "y"], shuffle=False).batch(BATCH)
    rollback = {"enable": True, "good_every": GOOD_EVERY, "quiet_steps": QUIET}
    outputs: dict[int, np.ndarray] = {}
    optimizer_steps: dict[int, int] = {}
    with TrainingMonitor(
        port=0, backend=["prometheus"], save_dir=str(tmp_path), actions={"rollback": rollback}
    ) as monitor:
        for step, (x, y) in enumerate(monitor.steps(data.create_tuple_iterator(), network=net, optimizer=optimizer), 1):
            loss, grads = grad_fn(x, y)
            optimizer(grads)
            monitor.step_end(loss)
            outputs[step] = net(fixed).asnumpy().copy()
            optimizer_steps[step] = int(optimizer.global_step.asnumpy().reshape(-1)[0])
    good = 40
    assert counted(monitor, "rollback") == 1
    assert monitor.store.value_of(c.ROLLBACK_LOST_STEPS) == POISON_STEP - good
    np.testing.assert_array_equal(outputs[POISON_STEP], outputs[good])
    assert optimizer_steps[POISON_STEP] == optimizer_steps[good]
    assert len(outputs) == steps
