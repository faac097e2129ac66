"""MindSpore Transformers 2.x's PyNative Trainer: a TrainerCallback whose hooks drive a TrainingMonitor's loop API."""

from __future__ import annotations

import importlib.util
from typing import Any

from ms_exporter.config import ConfigError
from ms_exporter.monitor.callback import TrainingMonitor


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
    probe's, read from the optimizer. The Trainer has no evaluation or checkpoint hooks (2.0.0 saves from
    CheckpointCallback.on_step_end, before this callback's on_step_end), and its epoch hooks carry nothing the
    monitor keeps.
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

    @property
    def monitor(self) -> TrainingMonitor:
        """The TrainingMonitor this callback drives (its url, store, publish())."""
        return self._monitor

    def close(self) -> None:
        self._monitor.close()

    def on_train_begin(self, args: Any, state: Any, **kwargs: Any) -> None:
        self._samples = _samples_per_step(args, state)
        self._monitor.train_begin(
            network=_network(kwargs.get("model")),
            optimizer=kwargs.get("optimizer"),
            dataset=kwargs.get("train_dataset"),
            step=int(getattr(state, "global_step", 0) or 0),
        )

    def on_step_begin(self, args: Any, state: Any, **kwargs: Any) -> None:
        self._monitor.step_begin()

    def on_step_end(self, args: Any, state: Any, **kwargs: Any) -> None:
        # A pipeline stage other than the last has no loss: what the Trainer passes there is not one.
        loss = kwargs.get("loss") if kwargs.get("has_last", True) else None
        self._monitor.step_end(loss, grad_norm=kwargs.get("grad_norm"), samples=self._samples)

    def on_train_end(self, args: Any, state: Any, **kwargs: Any) -> None:
        self._monitor.train_end(completed=True)

    # The rest of 2.0.0's hooks, defined here as well: the class answers every one also where its base is object.
    def on_epoch_begin(self, args: Any, state: Any, **kwargs: Any) -> None:
        pass

    def on_epoch_end(self, args: Any, state: Any, **kwargs: Any) -> None:
        pass

    def on_begin(self, args: Any, state: Any, **kwargs: Any) -> None:
        pass  # 2.0.0's Trainer never calls it

    def on_end(self, args: Any, state: Any, **kwargs: Any) -> None:
        pass  # nor this


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
