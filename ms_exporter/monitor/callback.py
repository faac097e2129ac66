"""TrainingMonitor: the MindSpore Callback that reads cb_params once per step and hands a sample to probes."""

from __future__ import annotations

import atexit
import logging
import os
import time
import weakref
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

from mindspore.train import Callback

from ms_exporter.config import MonitorConfig, read_config
from ms_exporter.config.article_keys import BLOCK_KEYS, params_alone
from ms_exporter.config.environment import ENV_PREFIX
from ms_exporter.core.catalogue import COMPILE, DATA_WAIT_PHASE, ENDED, EVAL_PHASE, STEP_PHASE
from ms_exporter.core.cb_params import (
    CUR_EPOCH_NUM,
    CUR_STEP_NUM,
    NET_OUTPUTS,
    TRAIN_DATASET_ELEMENT,
    callbacks_of,
    dataset_of,
    eval_results_of,
    sink_mode_of,
    step_of,
    train_network_of,
)
from ms_exporter.core.errors import ErrorSink
from ms_exporter.core.part import Part
from ms_exporter.core.part import overrides as overrides_hook
from ms_exporter.core.phases import PhaseClock
from ms_exporter.core.ranks import RankInfo, detect_rank
from ms_exporter.core.sample import read_loss
from ms_exporter.core.sink import Sink
from ms_exporter.core.store import HistogramSeries, MetricStore
from ms_exporter.features.callback_timer import CallbackTimer
from ms_exporter.features.signals import SignalRelay
from ms_exporter.monitor.assembly import assemble
from ms_exporter.monitor.isolation import Isolation
from ms_exporter.monitor.publisher import StepRecord

logger = logging.getLogger("ms_exporter")

# Every monitor of this process. A forked child (a data-loader worker, a multiprocessing pool, a script's own fork)
# inherits them with their files, port and state, but none of the threads: it owns none of it. Each monitor is off in
# the child, so neither its hooks nor its close() at the child's exit touch the parent's target, lock or records.
_MONITORS: weakref.WeakSet[TrainingMonitor] = weakref.WeakSet()


def _after_fork_in_child() -> None:
    for monitor in list(_MONITORS):
        monitor._enabled = False


_PartType = TypeVar("_PartType")


class TrainingMonitor(Callback):
    """Serves this rank's training health on /metrics (and JSON Lines with the `local` backend).

    `config` is a YAML path, a dict, a MonitorConfig or None; keyword arguments override it
    (precedence: defaults < file < MS_EXPORTER_* environment < keywords). Construction validates everything
    and raises ConfigError; after that no hook raises into training.

    `probes` and `sinks` add parts of your own to the ones the configuration builds: each a Probe or Sink, or a
    callable that takes the PartContext and returns one or a list (docs/development.md, "Your own probe or sink").

    The parts (monitor/assembly.py builds them): probes measure, the publisher hands them the steps the hooks
    recorded, sinks take the numbers elsewhere, the features (sampler, watchdog, actions, goodput, divergence)
    follow the run. This class forwards MindSpore's hooks to them, each call guarded, and names none of them.
    """

    def __init__(
        self, config: Any = None, *, probes: Sequence[Any] = (), sinks: Sequence[Any] = (), **overrides: Any
    ) -> None:
        super().__init__()
        self.config: MonitorConfig
        self.config, notes = read_config(config, **overrides)
        self._enabled = self.config.enable
        self._parts: list[Part] = []
        self._closed = False
        self._pid = os.getpid()  # the process that owns the parts: a forked child owns none of them
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
        self.rank: RankInfo = detect_rank()
        self.store = MetricStore((("rank", str(self.rank.rank)), ("project", self.config.project)))
        self.phases = PhaseClock(self.store)
        self._other_callbacks = CallbackTimer(self.phases, self.config.hang.checkpoint_callbacks)
        built = assemble(self.config, self.store, self.rank, self.phases, self._announce, probes, sinks)
        self._parts = built.parts
        self._step_end = [part for part in built.parts if overrides_hook(part, "on_step_end")]
        # The parts that read the batch a step consumes (data_quality): at step begin, each guarded; one that fails
        # on DISABLE_AFTER batches in a row is left out from then on.
        self._batch_parts = [part for part in built.parts if overrides_hook(part, "on_batch")]
        self._breaker = built.breaker
        built.errors.expect(part.name for part in self._batch_parts)
        self._batch_names: tuple[str, ...] = ()
        self._batches_on = False  # off in sink mode: the step's element is not its data there
        self._batch_calls = 0
        self._publisher = built.publisher
        self._errors = built.errors
        self._batch = built.batch
        self._hook_cost = built.hook_cost
        self._signals = SignalRelay(self._on_signal, lambda exc: self._errors.absorb("callback", exc))
        self._isolation = self._publisher.isolation  # a part's BaseException is its own unless a signal raised it
        self._isolation.watch(self._signals)
        self._wants_signals = any(part.needs_signals for part in self._parts)
        if self._wants_signals:  # from now until close: a SIGTERM between or after train calls counts too
            self._signals.install()
        self._reset_step_state()
        _MONITORS.add(self)
        atexit.register(self.close)

    def _reset_step_state(self) -> None:
        self._kept: Any = None
        self._step_began: float | None = None
        self._compiles_next: Callable[[], bool] | None = None  # the train network's, when it is one of ours
        self._previous_end: float | None = None
        self._data_wait: float | None = None
        self._eval_began: float | None = None

    # -- public ------------------------------------------------------------------------------------------
    @property
    def url(self) -> str | None:
        """The actual http://host:port/metrics of this rank (None when disabled or without prometheus)."""
        return next((sink.metrics_url for sink in self._parts if isinstance(sink, Sink) and sink.metrics_url), None)

    @property
    def jsonl_path(self) -> str | None:
        return next((sink.records_path for sink in self._parts if isinstance(sink, Sink) and sink.records_path), None)

    @property
    def parts(self) -> tuple[Part, ...]:
        """Every part this monitor drives, in the order each hook reaches them (empty when disabled)."""
        return tuple(self._parts)

    def part_of(self, kind: type[_PartType]) -> _PartType | None:
        """The first part of this kind (a sink, a probe, a feature), or None."""
        return next((part for part in self._parts if isinstance(part, kind)), None)

    def close(self) -> None:
        """Stop the threads, flush the JSONL file and stop serving. Safe to call twice; runs at exit."""
        # The pid too: a fork made by native code runs no Python at-fork hook, and its child may still exit Python.
        if self._closed or not self._enabled or os.getpid() != self._pid:
            return
        self._closed = True
        if "SIGINT" in self._signals.received and self.phases.phase != ENDED:
            self.phases.enter(ENDED)  # a Ctrl-C outside training ends the script: the endpoint lingers for it too
        self._guard("callback", self._publisher.publish, None, True)
        self._signals.restore()  # a closed monitor must not stay in the signal path
        for part in self._parts:
            self._guard(part.name, part.close)

    def _announce(self, step: int, action: str, details: dict[str, Any]) -> None:
        """An action the monitor took, to the parts that keep events (the JSON Lines file)."""
        for part in self._parts:
            self._guard(part.name, part.on_action, step, action, details)

    def publish(self) -> None:
        """Run the steps recorded since the last publication through the probes now (tests, end of training)."""
        if self._enabled:
            self._guard("callback", self._publisher.publish, None, True)

    # -- hooks ---------------------------------------------------------------------------------------------
    def on_train_begin(self, run_context: Any) -> None:
        if not self._enabled:
            return
        with self._cost("train_begin", "callback"):
            cb_params = run_context.original_args()
            self._publisher.publish(None, wait=True)  # anything left from an earlier run belongs to that run
            self._reset_step_state()
            self.phases.enter(COMPILE)
            self.phases.aside = 0.0
            self._guard("callback", self._other_callbacks.wrap, callbacks_of(cb_params), self)
            self._publisher.reset(step_of(cb_params))
            self._batch.bind(dataset_of(cb_params))
            if self._batch_parts:
                self._batches_on = not sink_mode_of(cb_params)
                self._batch_names = _column_names(dataset_of(cb_params)) if self._batches_on else ()
            network = train_network_of(cb_params)
            self._publisher.layouts.bind(network)
            # ms_exporter's own train cells say when a step will compile a graph they have not run yet.
            compiles_next = getattr(network, "compiles_next", None)
            self._compiles_next = compiles_next if callable(compiles_next) else None
            for part in self._parts:
                self._guard(part.name, part.on_train_begin, cb_params)
            if self._wants_signals:
                self._signals.install()  # again: a handler installed since (MindSpore's, the script's) chains to ours

    def on_train_step_begin(self, run_context: Any) -> None:
        if not self._enabled:
            return
        began = time.perf_counter()
        self._step_began = began
        phases = self.phases
        if phases.state[0] is not COMPILE:  # compilation lasts until the first step ends
            compiles = self._compiles_next
            phases.move(COMPILE if compiles is not None and compiles() else STEP_PHASE, began)
        aside = phases.take_aside()  # other callbacks' time and evaluations since the last step ended
        if self._previous_end is not None:
            self._data_wait = max(0.0, began - self._previous_end - aside)
        try:
            # Keep what counting the batch needs (shape, mask): it is counted when the step is published.
            self._kept = self._batch.keep(run_context.original_args().get(TRAIN_DATASET_ELEMENT))
        except Exception as exc:
            self._kept = None
            self._errors.absorb("callback", exc)
        if self._batches_on:
            self._hand_batch(run_context)
        self._hook_cost["step_begin"].observe(time.perf_counter() - began)

    def on_train_step_end(self, run_context: Any) -> None:
        """Reads the loss (which ends the step) and keeps a raw record; the probes see it when it is published.

        Publishing runs every record since the last one through the probes, thresholds, actions and sinks in one
        loop, at most every PUBLISH_SECONDS (every step when steps are slower, or when actions are on): the
        per-step cost on the training thread is then one loss read, one append, and the parts that follow every
        step's end (goodput, divergence).
        """
        if not self._enabled:
            return
        entered = time.perf_counter()
        try:
            cb_params = run_context.original_args()
            reading = time.perf_counter()
            outputs = cb_params[NET_OUTPUTS]  # cb_params is a dict; its attribute access is a slower detour
            try:
                loss = read_loss(outputs)
            except Exception as exc:  # an unreadable loss must not cost the step: it is counted without a loss
                loss = None
                self._errors.absorb("loss", exc)
            # The loss read synchronises the device (GRAPH mode does not), so the step ends here.
            ended = time.perf_counter()
            entered += ended - reading  # the wait for the device belongs to the step, not to the monitor's cost
            kept = self._kept if self._kept is not None else self._batch.keep(cb_params.get(TRAIN_DATASET_ELEMENT))
            step = cb_params[CUR_STEP_NUM]
            for part in self._step_end:  # before the phase changes: goodput asks whether the wait ahead is redo
                mark = self._isolation.mark()
                try:
                    part.on_step_end(step, outputs)
                except BaseException as exc:
                    if self._isolation.passes(exc, mark):
                        raise
                    self._errors.absorb(part.name, exc)
            publisher = self._publisher
            # Other callbacks' time inside the step is not the step's: its begin moves later by as much.
            began = (self._step_began if self._step_began is not None else entered) + self.phases.take_aside()
            # Only a tuple has more for the probes than the loss already read: a lone loss tensor is let go now.
            publisher.pending.append(
                StepRecord(
                    step,
                    cb_params[CUR_EPOCH_NUM],
                    loss,
                    began,
                    ended,
                    self._data_wait,
                    kept,
                    outputs if isinstance(outputs, (tuple, list)) else None,
                )
            )
            if publisher.due(ended):
                publisher.published_at = ended
                publisher.publish(run_context)
        except Exception as exc:
            self._errors.absorb("callback", exc)
        finally:
            self._step_began = None
            self._data_wait = None
            self._kept = None
            self._previous_end = now = time.perf_counter()
            self.phases.move(DATA_WAIT_PHASE, now)
            self._hook_cost["step_end"].observe(now - entered)

    def on_train_epoch_end(self, run_context: Any) -> None:
        if self._enabled:  # not timed: only actions use this hook
            for part in self._parts:
                self._guard(part.name, part.on_epoch_end, run_context, self._publisher.last_step)

    def on_train_end(self, run_context: Any) -> None:
        if not self._enabled:
            return
        with self._cost("train_end", "callback"):
            self.phases.enter(ENDED)  # before the sinks' last push: this rank ended normally
            self._finish_run(completed=True)

    def on_eval_begin(self, run_context: Any) -> None:
        if self._enabled:
            self.phases.enter(EVAL_PHASE)
            self._eval_began = self.phases.state[1]

    def on_eval_end(self, run_context: Any) -> None:
        if not self._enabled:
            return
        self.phases.enter(DATA_WAIT_PHASE)
        if self._eval_began is not None:  # an evaluation inside training: not the data pipeline's time
            self.phases.aside += self.phases.state[1] - self._eval_began
            self._eval_began = None
        if not self.config.wants("eval"):
            return
        with self._cost("eval_end", "eval"):
            self._publisher.publish(None, wait=True)
            results = eval_results_of(run_context.original_args())
            if results is not None:
                for part in self._parts:
                    self._guard(part.name, part.on_eval, self._publisher.last_step, results)

    def __exit__(self, *exc_info: Any) -> None:
        # MindSpore leaves the callback context on every exit from training, also when training raised
        # (on_train_end is not called then): flush and stop threads either way.
        if self._enabled and exc_info and exc_info[0] is not None:
            if issubclass(exc_info[0], (KeyboardInterrupt, SystemExit)):
                self.phases.enter(ENDED)  # stopped as asked (Ctrl-C, sys.exit from a handler): not a lost rank
            self._guard("callback", self._finish_run, False)

    # -- internals ----------------------------------------------------------------------------------------
    def _finish_run(self, completed: bool) -> None:
        self._guard("callback", self._other_callbacks.unwrap)
        self._guard("callback", self._publisher.publish, None, True)
        for part in self._parts:
            self._guard(part.name, part.on_train_end, self._publisher.last_step, completed)

    def _on_signal(self, signal_name: str, ending: bool) -> None:
        """Flush what is queued and let each part save what must outlive the process. When the signal ends the
        process (SIGTERM's default action), the rank ends as asked: it serves phase="ended" until two scrapes of
        each scraper have read it (the endpoint's on_signal()) and only then leaves discovery, so a stopped job
        pages nobody."""
        self._guard("callback", self._publisher.publish, None)
        if ending:
            self.phases.enter(ENDED)
        for part in self._parts:
            self._guard(part.name, part.on_signal, signal_name, self._publisher.last_step)

    def _hand_batch(self, run_context: Any) -> None:
        """The step's batch to the parts that read it (on_batch). A part that fails is counted; after DISABLE_AFTER
        failures in a row it gets no more batches (and says so once)."""
        try:
            cb_params = run_context.original_args()
            element = cb_params.get(TRAIN_DATASET_ELEMENT)
            step = cb_params[CUR_STEP_NUM]
        except Exception as exc:
            self._errors.absorb("callback", exc)
            return
        if not isinstance(element, (tuple, list)) or not element:  # MindSpore's is a tuple of tensors
            return
        self._batch_calls += 1
        for part in self._batch_parts:
            mark = self._isolation.mark()
            try:
                part.on_batch(step, element, self._batch_names)
            except BaseException as exc:
                if self._isolation.passes(exc, mark):
                    raise
                if self._breaker.failed(part.name, exc, self._batch_calls, "the other parts get the batches"):
                    self._batch_parts = [other for other in self._batch_parts if other is not part]
                    self._batches_on = bool(self._batch_parts)

    def _guard(self, component: str, func: Callable[..., Any], *args: Any) -> None:
        mark = self._isolation.mark()
        try:
            func(*args)
        except BaseException as exc:  # a part's own, whatever its kind; a signal's reaches the training
            if self._isolation.passes(exc, mark):
                raise
            self._errors.absorb(component, exc)

    def _cost(self, hook: str, component: str) -> _HookTimer:
        return _HookTimer(self._hook_cost[hook], self._errors, component, self._isolation)


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


def _column_names(dataset: Any) -> tuple[str, ...]:
    """The dataset's column names in the order of a batch's tensors; () where it does not say."""
    try:
        return tuple(str(name) for name in dataset.get_col_names()) if dataset is not None else ()
    except Exception:  # a script's own dataset object, or one MindSpore cannot name the columns of
        return ()


def _configure_logging(level: str) -> None:
    """log_level applies to the `ms_exporter` logger. A training script rarely configures Python logging (MindSpore
    logs through its own channel), so without any handler our INFO lines would vanish: give them stderr then."""
    logger.setLevel(level)
    if not logger.handlers and not logging.getLogger().handlers:
        handler = logging.StreamHandler()
        handler.setFormatter(logging.Formatter("[%(levelname)s] %(asctime)s %(message)s"))
        logger.addHandler(handler)
        logger.propagate = False


class _HookTimer:
    """Times a non-step hook into the cost histogram and absorbs anything it raises but a signal's."""

    def __init__(self, histogram: HistogramSeries, errors: ErrorSink, component: str, isolation: Isolation) -> None:
        self._histogram = histogram
        self._errors = errors
        self._component = component
        self._isolation = isolation

    def __enter__(self) -> None:
        self._mark = self._isolation.mark()
        self._began = time.perf_counter()

    def __exit__(self, exc_type: Any, exc: BaseException | None, tb: Any) -> bool:
        self._histogram.observe(time.perf_counter() - self._began)
        if exc is None or self._isolation.passes(exc, self._mark):
            return False
        self._errors.absorb(self._component, exc)
        return True


os.register_at_fork(after_in_child=_after_fork_in_child)
