"""MindSpore Transformers 2.x's PyNative Trainer: a TrainerCallback whose hooks drive a TrainingMonitor's loop API."""

from __future__ import annotations

import importlib.util
import logging
import sys
from types import FrameType
from typing import Any

from ms_exporter.config import ConfigError
from ms_exporter.features.callback_timer import CallbackTimer
from ms_exporter.monitor.callback import TrainingMonitor

logger = logging.getLogger("ms_exporter")

# 2.0.0's per-step and per-epoch hooks (it has no older names for them), and its saving callback's class name.
_TRAINER_HOOKS: tuple[tuple[str, str | None], ...] = (
    ("on_step_begin", None),
    ("on_step_end", None),
    ("on_epoch_begin", None),
    ("on_epoch_end", None),
)
_SAVING_CALLBACK = "CheckpointCallback"


def _trainer_callback() -> type:
    """2.x's `mindformers.pynative.callback.TrainerCallback`; `object` where MindSpore Transformers is not installed
    or has no PyNative Trainer (1.x), so that this module imports anywhere."""
    if importlib.util.find_spec("mindformers") is None:
        return object
    try:
        from mindformers.pynative.callback import TrainerCallback
    except ModuleNotFoundError as exc:
        if exc.name in ("mindformers.pynative", "mindformers.pynative.callback"):
            return object
        raise  # a 2.x install that cannot import (hyper-parallel missing) cannot run its Trainer either
    base: type = TrainerCallback
    return base


# A subclass, not a look-alike: a hook a later release adds to TrainerCallback is inherited as its no-op.
_TrainerCallback: Any = _trainer_callback()


class PyNativeTrainingMonitor(_TrainerCallback):
    """Serves the run of MindSpore Transformers 2.x's PyNative Trainer (`mindformers.pynative.trainer.Trainer`), listed
    in the run YAML's `callbacks:` as `type: PyNativeTrainingMonitor` (docs/mindformers.md).

    `config` and the keyword arguments are TrainingMonitor's (a YAML path, a dict or None, then keyword overrides: the
    entry's other keys); `monitor` hands in a TrainingMonitor made elsewhere instead. What the Trainer's hooks
    (`hook(args, state, **kwargs)`, 2.0.0) become:

    | Trainer hook | monitor call | read from |
    |---|---|---|
    | on_train_begin | train_begin(network, optimizer, dataset, step) | kwargs model, optimizer, train_dataset; state |
    | on_step_begin | step_begin() | (callbacks are not handed the batch) |
    | on_step_end | step_end(loss, grad_norm=, samples=) | kwargs loss, grad_norm; args.training, state |
    | on_train_end | train_end(completed=True) | |

    The model is a list of chunks: the one chunk is the network; of several, none is (parts that read the network
    would see a part of it as the whole). A pipeline stage without the loss (kwargs has_last false) steps without
    one: what the Trainer passes there is not a loss. samples: training.local_batch_size per accumulation step. A
    run that raises never reaches on_train_end: close() at exit records the crash. The learning rate is the LR
    probe's, read from the optimizer. The Trainer has no evaluation or checkpoint hooks: 2.0.0 saves from
    CheckpointCallback.on_step_end, before this callback's on_step_end. So at train begin the other callbacks of
    the Trainer's CallbackHandler (the one calling this hook) have their step and epoch hooks timed as Model.train's
    are (features/callback_timer.py): a CheckpointCallback's (or a class named in hang.checkpoint_callbacks) is the
    `checkpoint` phase, any other's `callbacks`, kept out of the step time; unwrapped at train end. The epoch hooks
    carry nothing the monitor keeps.
    """

    def __init__(self, config: Any = None, *, monitor: TrainingMonitor | None = None, **overrides: Any) -> None:
        super().__init__()
        if monitor is not None and (config is not None or overrides):
            given = (["config"] if config is not None else []) + sorted(overrides)
            raise ConfigError(
                [
                    "PyNativeTrainingMonitor: monitor= is a TrainingMonitor configured already; drop "
                    f"{', '.join(given)}, or drop monitor= to have one made from them"
                ]
            )
        self._monitor = monitor if monitor is not None else TrainingMonitor(config, **overrides)
        self._samples: int | None = None
        self._others: CallbackTimer | None = None

    @property
    def monitor(self) -> TrainingMonitor:
        """The TrainingMonitor this callback drives (its url, store, publish())."""
        return self._monitor

    def close(self) -> None:
        self._unwrap_others()
        self._monitor.close()

    def on_train_begin(self, args: Any, state: Any, **kwargs: Any) -> None:
        self._samples = _samples_per_step(args, state)
        self._monitor.train_begin(
            network=_network(kwargs.get("model")),
            optimizer=kwargs.get("optimizer"),
            dataset=kwargs.get("train_dataset"),
            step=int(getattr(state, "global_step", 0) or 0),
        )
        self._wrap_others(_calling_handler_callbacks(self))

    def on_step_begin(self, args: Any, state: Any, **kwargs: Any) -> None:
        self._monitor.step_begin()

    def on_step_end(self, args: Any, state: Any, **kwargs: Any) -> None:
        # A pipeline stage other than the last has no loss: what the Trainer passes there is not one.
        loss = kwargs.get("loss") if kwargs.get("has_last", True) else None
        self._monitor.step_end(loss, grad_norm=kwargs.get("grad_norm"), samples=self._samples)

    def on_train_end(self, args: Any, state: Any, **kwargs: Any) -> None:
        self._unwrap_others()
        self._monitor.train_end(completed=True)

    def _wrap_others(self, callbacks: list[Any] | None) -> None:
        core = self._monitor.core
        if core is None:
            return
        if callbacks is None:
            logger.info(
                "ms_exporter: the Trainer's other callbacks were not found from on_train_begin, so a checkpoint "
                "save inside a step (CheckpointCallback.on_step_end) counts in that step's time"
            )
            return
        names = (*self._monitor.config.hang.checkpoint_callbacks, _SAVING_CALLBACK)
        self._others = CallbackTimer(core.phases, names)
        core.guard("callback", self._others.wrap, callbacks, self, _TRAINER_HOOKS, _TrainerCallback)

    def _unwrap_others(self) -> None:
        others, self._others = self._others, None
        core = self._monitor.core
        if others is not None and core is not None:
            core.guard("callback", others.unwrap)

    # The rest of 2.0.0's hooks, defined here as well: the class answers every one also where its base is object.
    def on_epoch_begin(self, args: Any, state: Any, **kwargs: Any) -> None:
        pass

    def on_epoch_end(self, args: Any, state: Any, **kwargs: Any) -> None:
        pass

    def on_begin(self, args: Any, state: Any, **kwargs: Any) -> None:
        pass  # 2.0.0's Trainer never calls it

    def on_end(self, args: Any, state: Any, **kwargs: Any) -> None:
        pass  # nor this


def _calling_handler_callbacks(callback: Any, depth: int = 4) -> list[Any] | None:
    """The callback list of the CallbackHandler whose event call runs `callback`'s hook: 2.0.0 hands callbacks
    neither the handler nor the other callbacks, so it is read from the calling frames (a `self` holding
    `callbacks`, a list with `callback` in it); None where no caller within `depth` frames holds one."""
    frame: FrameType | None = sys._getframe(2)  # past this function and the hook that called it
    for _ in range(depth):
        if frame is None:
            return None
        holder = frame.f_locals.get("self")
        callbacks = getattr(holder, "callbacks", None)
        if isinstance(callbacks, list) and any(other is callback for other in callbacks):
            return callbacks
        frame = frame.f_back
    return None


def _network(model: Any) -> Any:
    """The network the parts may read: the Trainer's model is a list of chunks (one without virtual pipeline
    stages)."""
    if isinstance(model, (list, tuple)):
        return model[0] if len(model) == 1 else None
    return model


def _samples_per_step(args: Any, state: Any) -> int | None:
    """Samples this rank takes per step: a micro-batch of training.local_batch_size per accumulation step."""
    local = getattr(getattr(args, "training", None), "local_batch_size", None)
    accumulation = getattr(state, "num_accumulation_steps", None)
    if isinstance(local, int) and isinstance(accumulation, int) and local > 0 and accumulation > 0:
        return local * accumulation
    return None
