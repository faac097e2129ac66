"""PyNativeTrainingMonitor, MindSpore Transformers 2.x's PyNative Trainer callback: each Trainer hook, called as
2.0.0's CallbackHandler calls it (`hook(args, state, model=, optimizer=, lr_scheduler=, train_dataset=,
eval_dataset=, **more)`), becomes the matching loop API call with the values the Trainer handed in.

A recording stand-in for TrainingMonitor holds the mapping here; tests/integration/test_mindformers2.py runs 2.0.0's
own CallbackHandler, TrainerState and registry around real MindSpore steps with a real monitor."""

from __future__ import annotations

import importlib
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from ms_exporter.config import ConfigError
from ms_exporter.core import catalogue
from ms_exporter.monitor import mindformers_trainer
from ms_exporter.monitor.callback import TrainingMonitor
from ms_exporter.monitor.mindformers_trainer import PyNativeTrainingMonitor
from tests.support.samples import RecordedSteps


class Recorder:
    """Records the loop API calls it receives, with their arguments."""

    core = None  # a monitor that is off: no phases to time the Trainer's other callbacks with

    def __init__(self) -> None:
        self.calls: list[tuple[str, tuple[Any, ...], dict[str, Any]]] = []

    def __getattr__(self, name: str) -> Any:
        if name not in ("train_begin", "step_begin", "step_end", "train_end", "close"):
            raise AttributeError(name)
        return lambda *args, **kwargs: self.calls.append((name, args, kwargs))


@dataclass
class State:
    """The fields of 2.0.0's TrainerState the Trainer has set when it calls its callbacks."""

    global_step: int = 0
    max_steps: int = 8
    epoch_step: int = 4
    global_batch_size: int = 8
    num_accumulation_steps: int = 4
    epoch: float = 0.0
    extra: dict[str, Any] = field(default_factory=dict)


ARGS = SimpleNamespace(training=SimpleNamespace(local_batch_size=2, global_batch_size=8))
NETWORK, OPTIMIZER, SCHEDULE, DATASET = object(), object(), object(), object()


def handler_kwargs(model: Any = None) -> dict[str, Any]:
    """What CallbackHandler.call_event adds to every hook."""
    return {
        "model": [NETWORK] if model is None else model,
        "optimizer": OPTIMIZER,
        "lr_scheduler": SCHEDULE,
        "train_dataset": DATASET,
        "eval_dataset": None,
    }


def step_end_kwargs(loss: Any, grad_norm: Any, has_last: bool = True) -> dict[str, Any]:
    """What Trainer._inner_train_loop passes to on_step_end beside the handler's own."""
    return {
        "loss": loss,
        "grad_norm": grad_norm,
        "monitor": object(),
        "metric_reduce_group": None,
        "metric_reduce_group_size": None,
        "pp_metric_reduce_group": None,
        "pp_metric_reduce_group_size": None,
        "has_last": has_last,
    }


def drive(callback: PyNativeTrainingMonitor, state: State, losses: list[float], **step_end: Any) -> None:
    """Trainer.train and _inner_train_loop's calls, in their order, for len(losses) steps."""
    callback.on_train_begin(ARGS, state, **handler_kwargs(step_end.pop("model", None)))
    for loss in losses:
        if state.global_step % state.epoch_step == 0 and state.global_step > 0:
            callback.on_epoch_begin(ARGS, state, **handler_kwargs())
        callback.on_step_begin(ARGS, state, **handler_kwargs())
        state.global_step += 1
        kwargs = {**step_end_kwargs(loss, loss / 10), **step_end}
        callback.on_step_end(ARGS, state, **handler_kwargs(), **kwargs)
        if state.global_step % state.epoch_step == 0:
            callback.on_epoch_end(ARGS, state, **handler_kwargs())
    callback.on_train_end(ARGS, state, **handler_kwargs())


def test_each_trainer_hook_drives_the_matching_loop_call_with_the_trainers_values() -> None:
    recorder = Recorder()
    callback = PyNativeTrainingMonitor(monitor=recorder)  # type: ignore[arg-type]
    drive(callback, State(global_step=3), [2.5, 2.0])  # resumed at step 3
    # The network is the model's one chunk; the run resumes at the Trainer's step; a step takes a micro-batch of
    # training.local_batch_size per accumulation step; the epoch hooks carry nothing.
    assert recorder.calls == [
        ("train_begin", (), {"network": NETWORK, "optimizer": OPTIMIZER, "dataset": DATASET, "step": 3}),
        ("step_begin", (), {}),
        ("step_end", (2.5,), {"grad_norm": 0.25, "samples": 8}),
        ("step_begin", (), {}),
        ("step_end", (2.0,), {"grad_norm": 0.2, "samples": 8}),
        ("train_end", (), {"completed": True}),
    ]


def test_a_pipeline_stage_without_the_loss_steps_without_one() -> None:
    recorder = Recorder()
    drive(PyNativeTrainingMonitor(monitor=recorder), State(), [0.0], has_last=False)  # type: ignore[arg-type]
    assert ("step_end", (None,), {"grad_norm": 0.0, "samples": 8}) in recorder.calls


def test_several_model_chunks_are_no_network_to_the_parts() -> None:
    recorder = Recorder()
    drive(PyNativeTrainingMonitor(monitor=recorder), State(), [1.0], model=[object(), object()])  # type: ignore[arg-type]
    assert recorder.calls[0][2]["network"] is None


def test_samples_are_not_counted_where_the_run_does_not_say_its_batch() -> None:
    recorder = Recorder()
    callback = PyNativeTrainingMonitor(monitor=recorder)  # type: ignore[arg-type]
    callback.on_train_begin(SimpleNamespace(), State(), **handler_kwargs())
    callback.on_step_begin(SimpleNamespace(), State(), **handler_kwargs())
    callback.on_step_end(SimpleNamespace(), State(global_step=1), **handler_kwargs(), **step_end_kwargs(1.0, 0.5))
    assert recorder.calls[-1] == ("step_end", (1.0,), {"grad_norm": 0.5, "samples": None})


def test_the_entrys_keys_make_its_training_monitor() -> None:
    callback = PyNativeTrainingMonitor({"project": "pynative"}, enable=False)
    assert isinstance(callback.monitor, TrainingMonitor)
    assert callback.monitor.config.project == "pynative" and not callback.monitor.config.enable
    with pytest.raises(ConfigError, match="drop config, project"):
        PyNativeTrainingMonitor({}, monitor=callback.monitor, project="x")


def test_a_real_monitor_serves_what_the_hooks_handed_in() -> None:
    callback = PyNativeTrainingMonitor(
        backend="prometheus", port=0, hang={"enable": False}, goodput={"enable": False}, grad_norm={"every_n_steps": 1}
    )
    try:
        drive(callback, State(), [3.0, 2.0, 1.5])
        callback.monitor.publish()
        store = callback.monitor.store
        assert store.value_of(catalogue.GLOBAL_STEP) == 3
        assert store.value_of(catalogue.LOSS) == 1.5
        assert store.value_of(catalogue.GRAD_NORM) == pytest.approx(0.15)
        assert store.value_of(catalogue.SAMPLES) == 24
    finally:
        callback.close()


@pytest.fixture
def packages(tmp_path: Path) -> Iterator[Path]:
    """A folder put first on sys.path for stand-in `mindformers` packages; they leave no trace in sys.modules."""
    sys.path.insert(0, str(tmp_path))
    before = set(sys.modules)
    try:
        yield tmp_path
    finally:
        sys.path.remove(str(tmp_path))
        for name in set(sys.modules) - before:
            if name == "mindformers" or name.startswith("mindformers."):
                del sys.modules[name]


def test_its_base_is_the_installed_trainer_callback_and_object_without_one(packages: Path) -> None:
    assert mindformers_trainer._trainer_callback() is object  # MindSpore Transformers is not installed here
    (packages / "mindformers").mkdir()
    (packages / "mindformers" / "__init__.py").write_text("")  # 1.x: no PyNative Trainer
    importlib.invalidate_caches()
    assert mindformers_trainer._trainer_callback() is object
    callback = packages / "mindformers" / "pynative" / "callback"
    callback.mkdir(parents=True)
    (packages / "mindformers" / "pynative" / "__init__.py").write_text("")
    (callback / "__init__.py").write_text("class TrainerCallback:\n    pass\n")
    del sys.modules["mindformers"]
    importlib.invalidate_caches()
    base = mindformers_trainer._trainer_callback()
    assert base is sys.modules["mindformers.pynative.callback"].TrainerCallback


def test_a_training_monitor_listed_under_the_pynative_trainer_says_what_to_list_and_takes_nothing_down(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """`type: TrainingMonitor` under 2.x's PyNative Trainer: its handler calls every hook as (args, state, **kwargs);
    the Model.train Callback answers each without raising and says once per run which type to list instead."""
    monitor = TrainingMonitor(port=0, hang={"enable": False})
    args, state = SimpleNamespace(), State()
    try:
        with caplog.at_level("ERROR", logger="ms_exporter"):
            monitor.on_train_begin(args, state, model=[object()], optimizer=None, train_dataset=None)
            for hook in ("on_begin", "on_epoch_begin", "on_step_begin", "on_step_end", "on_epoch_end", "on_end"):
                getattr(monitor, hook)(args, state, loss=1.0, grad_norm=2.0)
            monitor.on_train_end(args, state, model=[object()])
        assert monitor.core is not None and not monitor.core.running
        [said] = [r.getMessage() for r in caplog.records if "PyNativeTrainingMonitor" in r.getMessage()]
        assert "type: PyNativeTrainingMonitor" in said
    finally:
        monitor.close()


class CheckpointCallback:
    """Named like 2.0.0's saving callback: saves (here, sleeps) on every second step's on_step_end, and records the
    monitor's phase while it does."""

    def __init__(self, monitor: TrainingMonitor) -> None:
        self.monitor = monitor
        self.phases: list[str | None] = []

    def on_step_end(self, args: Any, state: Any, **kwargs: Any) -> None:
        if state.global_step % 2 == 0:
            self.phases.append(self.monitor.phases.phase)
            time.sleep(SAVE_SECONDS)


class Handler:
    """2.0.0's CallbackHandler as far as the callbacks see it: call_event calls each callback's hook in list order,
    the saving callback before ours (no network or optimizer: the parts that read them have nothing to read)."""

    def __init__(self, callbacks: list[Any]) -> None:
        self.callbacks = callbacks

    def call_event(self, event: str, args: Any, state: Any, **kwargs: Any) -> None:
        for callback in self.callbacks:
            hook = getattr(callback, event, None)
            if hook is not None:
                hook(args, state, **{**handler_kwargs(), "model": None, "optimizer": None}, **kwargs)


SAVE_SECONDS = 0.2


def test_the_trainers_checkpoint_saves_inside_a_step_are_checkpoint_time_not_step_time(tmp_path: Path) -> None:
    durations = RecordedSteps()
    monitor = TrainingMonitor(
        backend="prometheus", port=0, hang={"enable": False}, save_dir=str(tmp_path), probes=[lambda c: durations]
    )
    ours = PyNativeTrainingMonitor(monitor=monitor)
    saver = CheckpointCallback(monitor)
    handler = Handler([saver, ours])
    state = State()
    try:
        handler.call_event("on_train_begin", ARGS, state)
        assert "on_step_end" in vars(saver)  # timed while the run lasts
        for _ in range(4):
            handler.call_event("on_step_begin", ARGS, state)
            state.global_step += 1
            handler.call_event("on_step_end", ARGS, state, **step_end_kwargs(1.0, 0.1))
        handler.call_event("on_train_end", ARGS, state)
        assert "on_step_end" not in vars(saver)  # and left as it was after it
        monitor.publish()
        assert saver.phases == [catalogue.CHECKPOINT, catalogue.CHECKPOINT]
        seen = [s.duration for s in durations.samples]
        assert len(seen) == 4 and max(seen) < SAVE_SECONDS, seen
        ledger = monitor.phases.ledger
        assert ledger is not None and ledger.saves.count == 2
        checkpoint = catalogue.TIME_BUCKETS.index(catalogue.CHECKPOINT)
        assert ledger.seconds()[checkpoint] >= 2 * SAVE_SECONDS
    finally:
        ours.close()


def test_without_the_handler_among_its_callers_the_saves_stay_in_the_step_and_it_says_so(
    caplog: pytest.LogCaptureFixture,
) -> None:
    monitor = TrainingMonitor(backend="prometheus", port=0, hang={"enable": False}, goodput={"enable": False})
    ours = PyNativeTrainingMonitor(monitor=monitor)
    try:
        with caplog.at_level("INFO", logger="ms_exporter"):
            drive(ours, State(), [1.0])
        assert any("counts in that step's time" in r.getMessage() for r in caplog.records)
    finally:
        ours.close()
