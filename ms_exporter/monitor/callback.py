"""TrainingMonitor: the one object a script makes. It is the `Model.train` Callback (it reads cb_params once per step)
and the loop API (`steps()`, `step_end()`), and it hands both to the one core that drives the parts."""

from __future__ import annotations

import atexit
import logging
import os
import sys
import weakref
from collections.abc import Sequence
from typing import Any, TypeVar

from mindspore.train import Callback

from ms_exporter.config import MonitorConfig, read_config
from ms_exporter.config.article_keys import BLOCK_KEYS, params_alone
from ms_exporter.config.environment import ENV_PREFIX
from ms_exporter.core.cb_params import (
    CUR_EPOCH_NUM,
    CUR_STEP_NUM,
    NET_OUTPUTS,
    TRAIN_DATASET_ELEMENT,
    callbacks_of,
    eval_results_of,
)
from ms_exporter.core.part import Part
from ms_exporter.core.phases import PhaseClock
from ms_exporter.core.ranks import RankInfo
from ms_exporter.core.store import MetricStore
from ms_exporter.features.callback_timer import CallbackTimer
from ms_exporter.monitor.core import MonitorCore
from ms_exporter.monitor.loop import LoopDriver
from ms_exporter.monitor.loop_api import LoopAPI

logger = logging.getLogger("ms_exporter")

# Every monitor of this process. A forked child (a data-loader worker, a multiprocessing pool, a script's own fork)
# inherits them with their files, port and state, but none of the threads: it owns none of it. Each monitor is off in
# the child, so neither its hooks nor its close() at the child's exit touch the parent's target, lock or records.
_MONITORS: weakref.WeakSet[TrainingMonitor] = weakref.WeakSet()


def _after_fork_in_child() -> None:
    for monitor in list(_MONITORS):
        monitor._enabled = False


_PartType = TypeVar("_PartType")


class TrainingMonitor(LoopAPI, Callback):
    """Serves this rank's training health on /metrics (and JSON Lines with the `local` backend).

    `config` is a YAML path, a dict, a MonitorConfig or None; keyword arguments override it
    (precedence: defaults < file < MS_EXPORTER_* environment < keywords). Construction validates everything
    and raises ConfigError; after that nothing it does raises into training.

    `probes` and `sinks` add parts of your own to the ones the configuration builds: each a Probe or Sink, or a
    callable that takes the PartContext and returns one or a list (docs/development.md, "Your own probe or sink").

    Two ways to drive it, one core behind both (monitor/core.py):
    - `Model.train(..., callbacks=[monitor])`: MindSpore calls the hooks below;
    - a loop of your own: `for batch in monitor.steps(dataset, network=net, optimizer=opt): ...;
      monitor.step_end(loss, grads=grads)`, then `monitor.close()` or `with TrainingMonitor(...) as monitor:`
      (docs/getting-started.md).
    """

    def __init__(
        self, config: Any = None, *, probes: Sequence[Any] = (), sinks: Sequence[Any] = (), **overrides: Any
    ) -> None:
        super().__init__()
        self.config: MonitorConfig
        self.config, notes = read_config(config, **overrides)
        self._enabled = self.config.enable
        self._core: MonitorCore | None = None
        self._loop: LoopDriver | None = None
        self._entered: list[bool] = []  # for each __enter__ not yet left: whether MindSpore's training entered it
        _configure_logging(self.config.log_level)
        if not self._enabled:
            # A switch left off after an experiment is the first thing to rule out when nothing shows up.
            logger.info(
                "ms_exporter: the monitor is off (%s): it serves, writes and watches nothing",
                _off_by(config, overrides),
            )
            return
        for note in notes:
            logger.info("ms_exporter: %s", note)
        alone = params_alone(config, self.config.backend, self.config.interval, self.config.save_dir)
        if alone is not None and not set(BLOCK_KEYS) & set(overrides):  # keywords that stand in for the block
            logger.warning("ms_exporter: %s", alone)
        self._core = core = MonitorCore(self.config, probes, sinks)
        self._other_callbacks = CallbackTimer(core.phases, self.config.hang.checkpoint_callbacks)
        self._loop = LoopDriver(core)
        _MONITORS.add(self)
        atexit.register(self.close)

    # -- public ------------------------------------------------------------------------------------------
    @property
    def store(self) -> MetricStore:
        return self._live_core().store

    @property
    def phases(self) -> PhaseClock:
        return self._live_core().phases

    @property
    def rank(self) -> RankInfo:
        return self._live_core().rank

    @property
    def url(self) -> str | None:
        """The actual http://host:port/metrics of this rank (None when disabled or without prometheus)."""
        return self._core.url if self._core is not None else None

    @property
    def jsonl_path(self) -> str | None:
        return self._core.jsonl_path if self._core is not None else None

    @property
    def parts(self) -> tuple[Part, ...]:
        """Every part this monitor drives, in the order each hook reaches them (empty when disabled)."""
        return tuple(self._core.parts) if self._core is not None else ()

    @property
    def core(self) -> MonitorCore | None:
        """The core every driver feeds (None when the monitor is off)."""
        return self._core

    def part_of(self, kind: type[_PartType]) -> _PartType | None:
        """The first part of this kind (a sink, a probe, a feature), or None."""
        return next((part for part in self.parts if isinstance(part, kind)), None)

    def close(self) -> None:
        """End a loop's run if it is still on, stop the threads, flush the JSONL file and stop serving. Safe to call
        twice; runs at exit."""
        core = self._core
        # The pid too: a fork made by native code runs no Python at-fork hook, and its child may still exit Python.
        if core is None or not self._enabled or core.closed or os.getpid() != core.pid:
            return
        if self._loop is not None and self._loop.active:
            core.guard("callback", self._loop.end_at_close)
        core.close()

    def publish(self) -> None:
        """Run the steps recorded since the last publication through the probes now (tests, end of training)."""
        if self._enabled and self._core is not None:
            self._core.publish()

    def __enter__(self) -> TrainingMonitor:
        self._entered.append(_entered_by_mindspore())
        return self

    def __exit__(self, *exc_info: Any) -> None:
        by_mindspore = self._entered.pop() if self._entered else True
        core = self._core
        if core is None or not self._enabled:
            return
        raised = exc_info[0] is not None
        stopped = raised and issubclass(exc_info[0], (KeyboardInterrupt, SystemExit))
        if by_mindspore:
            # MindSpore leaves the callback context on every exit from training, also when training raised
            # (on_train_end is not called then): flush and stop threads either way.
            if raised:
                core.end(False, stopped)  # Ctrl-C or sys.exit from a handler: stopped as asked, not a lost rank
                core.guard("callback", self._other_callbacks.unwrap)
            return
        if self._loop is not None and self._loop.active:
            core.guard("callback", self._loop.train_end, not raised, stopped)
        self.close()

    # -- the Model.train hooks -------------------------------------------------------------------------------
    def on_train_begin(self, run_context: Any, *trainer_args: Any, **trainer_kwargs: Any) -> None:
        core = self._core
        if core is None or not self._enabled or _called_as_a_trainer_callback(trainer_args, trainer_kwargs):
            return
        try:
            cb_params = run_context.original_args()
        except Exception as exc:
            core.errors.absorb("callback", exc)
            return
        core.train_begin(cb_params, run_context)
        core.guard("callback", self._other_callbacks.wrap, callbacks_of(cb_params), self)

    def on_train_step_begin(self, run_context: Any) -> None:
        core = self._core
        if core is None or not self._enabled:
            return
        try:
            cb_params = run_context.original_args()
            step, element = cb_params.get(CUR_STEP_NUM, 0), cb_params.get(TRAIN_DATASET_ELEMENT)
        except Exception as exc:
            core.errors.absorb("callback", exc)
            step, element = 0, None
        core.step_begin(step, element)

    def on_train_step_end(self, run_context: Any) -> None:
        core = self._core
        if core is None or not self._enabled:
            return
        try:
            cb_params = run_context.original_args()  # a dict; its attribute access is a slower detour
            step, epoch = cb_params[CUR_STEP_NUM], cb_params[CUR_EPOCH_NUM]
            outputs, element = cb_params[NET_OUTPUTS], cb_params.get(TRAIN_DATASET_ELEMENT)
        except Exception as exc:
            core.errors.absorb("callback", exc)
            return
        core.step_end(step, epoch, outputs, element)

    def on_train_epoch_end(self, run_context: Any) -> None:
        core = self._core
        if core is None or not self._enabled:
            return
        try:
            step = int(run_context.original_args().get(CUR_STEP_NUM, 0))
        except Exception as exc:
            core.errors.absorb("callback", exc)
            step = core.last_step
        core.epoch_end(step)

    def on_train_end(self, run_context: Any, *trainer_args: Any, **trainer_kwargs: Any) -> None:
        core = self._core
        if core is not None and self._enabled and not (trainer_args or trainer_kwargs):
            core.end(True)
            core.guard("callback", self._other_callbacks.unwrap)

    def on_eval_begin(self, run_context: Any) -> None:
        if self._core is not None and self._enabled:
            self._core.eval_begin()

    def on_eval_end(self, run_context: Any) -> None:
        core = self._core
        if core is None or not self._enabled:
            return
        try:
            results = eval_results_of(run_context.original_args())
        except Exception as exc:
            core.errors.absorb("eval", exc)
            results = None
        core.eval_end(results)

    def on_eval_step_begin(self, run_context: Any) -> None:
        """Nothing: an evaluation's steps are not training steps (the base class would call step_begin)."""

    def on_eval_step_end(self, run_context: Any) -> None:
        """Nothing: an evaluation's steps are not training steps (the base class would call step_end)."""

    # MindSpore Transformers 2.x's PyNative Trainer calls its callbacks' hooks as (args, state, **kwargs), these
    # among them: a TrainingMonitor listed there by mistake must not take the training down (on_train_begin said why).
    def on_step_begin(self, *args: Any, **kwargs: Any) -> None:
        """Nothing: a MindSpore Transformers 2.x TrainerCallback hook (PyNativeTrainingMonitor serves that Trainer)."""

    def on_step_end(self, *args: Any, **kwargs: Any) -> None:
        """Nothing: a MindSpore Transformers 2.x TrainerCallback hook (PyNativeTrainingMonitor serves that Trainer)."""

    def on_epoch_begin(self, *args: Any, **kwargs: Any) -> None:
        """Nothing: a MindSpore Transformers 2.x TrainerCallback hook (PyNativeTrainingMonitor serves that Trainer)."""

    def on_epoch_end(self, *args: Any, **kwargs: Any) -> None:
        """Nothing: a MindSpore Transformers 2.x TrainerCallback hook (PyNativeTrainingMonitor serves that Trainer)."""

    def on_begin(self, *args: Any, **kwargs: Any) -> None:
        """Nothing: a MindSpore Transformers 2.x TrainerCallback hook (PyNativeTrainingMonitor serves that Trainer)."""

    def on_end(self, *args: Any, **kwargs: Any) -> None:
        """Nothing: a MindSpore Transformers 2.x TrainerCallback hook (PyNativeTrainingMonitor serves that Trainer)."""

    # -- internals ----------------------------------------------------------------------------------------
    def _live_core(self) -> MonitorCore:
        if self._core is None:
            raise AttributeError("the monitor is off (enable: false): it has no store, phases or rank")
        return self._core


def _called_as_a_trainer_callback(args: tuple[Any, ...], kwargs: dict[str, Any]) -> bool:
    """MindSpore hands a Callback's hook one RunContext; MindSpore Transformers 2.x's PyNative Trainer hands its
    callbacks (args, state, model=..., ...). Said once, at ERROR: the monitor then watches nothing of that run."""
    if not (args or kwargs):
        return False
    logger.error(
        "ms_exporter: TrainingMonitor is the Model.train Callback, and MindSpore Transformers 2.x's PyNative Trainer "
        "called it as one of its TrainerCallbacks: it watches nothing of this run. List "
        "`type: PyNativeTrainingMonitor` in the run YAML's callbacks instead (docs/mindformers.md)"
    )
    return True


def _entered_by_mindspore() -> bool:
    """Whether MindSpore's training entered this callback's context (its callback manager enters every callback
    through an ExitStack) rather than a script's `with` statement: the first frames above __enter__ tell."""
    frame: Any = sys._getframe(2)
    for _ in range(2):
        if frame is None:
            return False
        if str(frame.f_globals.get("__name__", "")).startswith("mindspore."):
            return True
        frame = frame.f_back
    return False


def _off_by(config: Any, overrides: dict[str, Any]) -> str:
    """Where `enable: false` came from, the last source first (keywords < environment < file, reversed)."""
    if "enable" in overrides:
        return "keyword argument enable=False"
    if f"{ENV_PREFIX}ENABLE" in os.environ:
        return f"environment variable {ENV_PREFIX}ENABLE"
    if isinstance(config, MonitorConfig):
        return "the MonitorConfig given has enable=False"
    if isinstance(config, (str, os.PathLike)):
        return f"enable: false in {os.fspath(config)}"
    return "enable: false in the settings given"


def _configure_logging(level: str) -> None:
    """log_level applies to the `ms_exporter` logger. A training script rarely configures Python logging (MindSpore
    logs through its own channel), so without any handler our INFO lines would vanish: give them stderr then."""
    logger.setLevel(level)
    if not logger.handlers and not logging.getLogger().handlers:
        handler = logging.StreamHandler()
        handler.setFormatter(logging.Formatter("[%(levelname)s] %(asctime)s %(message)s"))
        logger.addHandler(handler)
        logger.propagate = False


os.register_at_fork(after_in_child=_after_fork_in_child)
