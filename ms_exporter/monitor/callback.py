"""TrainingMonitor: the MindSpore Callback that reads cb_params once per step and hands a sample to probes."""

from __future__ import annotations

import atexit
import logging
import time
from collections.abc import Callable
from typing import Any, TypeVar

from mindspore.train import Callback

from ms_exporter.actions.runner import ActionRunner
from ms_exporter.config import MonitorConfig, read_config
from ms_exporter.core import catalogue
from ms_exporter.core.catalogue import COMPILE, DATA_WAIT_PHASE, ENDED, EVAL_PHASE, HOOKS, STEP_PHASE
from ms_exporter.core.cb_params import (
    CUR_EPOCH_NUM,
    CUR_STEP_NUM,
    NET_OUTPUTS,
    TRAIN_DATASET_ELEMENT,
    callbacks_of,
    dataset_of,
    eval_results_of,
    step_of,
    train_network_of,
)
from ms_exporter.core.errors import Breaker, ErrorSink
from ms_exporter.core.phases import PhaseClock
from ms_exporter.core.ranks import RankInfo, detect_rank
from ms_exporter.core.sample import BatchCounter, read_loss
from ms_exporter.core.sink import Sink
from ms_exporter.core.store import HistogramSeries, MetricStore
from ms_exporter.features.breach_watch import ThresholdWatcher
from ms_exporter.features.callback_timer import CallbackTimer
from ms_exporter.features.fingerprint import Fingerprints
from ms_exporter.features.goodput import Goodput
from ms_exporter.features.sampler import MemorySampler
from ms_exporter.features.signals import SignalRelay
from ms_exporter.features.watchdog import HangWatchdog
from ms_exporter.monitor.publisher import StepPublisher, StepRecord
from ms_exporter.probes import build_probes
from ms_exporter.probes.learning_rate import LearningRateProbe
from ms_exporter.sinks import build_sinks
from ms_exporter.sinks.jsonl import JsonlWriter
from ms_exporter.sinks.prometheus import PrometheusEndpoint

logger = logging.getLogger("ms_exporter")

_SinkType = TypeVar("_SinkType", bound=Sink)


class TrainingMonitor(Callback):
    """Serves this rank's training health on /metrics (and JSON Lines with the `local` backend).

    `config` is a YAML path, a dict, a MonitorConfig or None; keyword arguments override it
    (precedence: defaults < file < MS_EXPORTER_* environment < keywords). Construction validates everything
    and raises ConfigError; after that no hook raises into training.

    The parts: probes (ms_exporter.probes.build_probes) measure, the publisher hands them the steps the hooks
    recorded, sinks (ms_exporter.sinks.build_sinks) take the numbers elsewhere, the sampler thread reads host
    memory, and the signal relay lets sinks save their state on SIGTERM/SIGINT.
    """

    def __init__(self, config: Any = None, **overrides: Any) -> None:
        super().__init__()
        self.config: MonitorConfig
        self.config, notes = read_config(config, **overrides)
        self._enabled = self.config.enable
        self._sinks: list[Sink] = []
        self._closed = False
        if not self._enabled:
            return
        _configure_logging(self.config.log_level)
        for note in notes:
            logger.info("ms_exporter: %s", note)
        self.rank: RankInfo = detect_rank()
        self.store = MetricStore((("rank", str(self.rank.rank)), ("project", self.config.project)))
        self.phases = PhaseClock(self.store)
        self._other_callbacks = CallbackTimer(self.phases, self.config.hang.checkpoint_callbacks)
        probes = build_probes(self.config, self.store, self.rank, self.phases)
        self._eval = probes.eval
        self._memory = probes.memory
        self._actions = (
            ActionRunner(self.config, self.store, self.rank, self._announce, probes.step)
            if self.config.actions.any
            else None
        )
        self._errors = ErrorSink(
            self.store,
            (
                "callback",
                "sampler",
                *(("watchdog",) if probes.hang else ()),
                *(p.name for p in probes.step),
                *(("actions",) if self._actions is not None else ()),
                *(("goodput",) if self.config.goodput.enable else ()),
                *(("divergence",) if self.config.divergence.enable else ()),
            ),
        )
        self._breaker = Breaker(self._errors, self.store)
        hooks = self.store.register(catalogue.HOOK_DURATION)
        self._hook_cost = {hook: hooks.histogram(hook=hook) for hook in HOOKS}
        self._thresholds = ThresholdWatcher(self.store, self.config.all_bounds(), self.config.warmup_steps)
        self._batch = BatchCounter(
            self.config.attention_mask_column,
            self.config.input_ids_column,
            self.config.flops.seq_len_column if self.config.flops.enable else None,
        )
        hang = self.config.hang
        self._watchdog = (
            HangWatchdog(
                self.phases,
                probes.hang.current,
                self.store,
                self.config.save_dir,
                self.rank.rank,
                lambda exc: self._errors.absorb("watchdog", exc),
                hang.native_stacks,
                self.config.project,
            )
            if probes.hang is not None
            else None
        )
        watchdog = self._watchdog
        self._goodput = (
            Goodput(
                self.config,
                self.store,
                self.phases,
                self.rank.rank,
                probes.hang.deadlines if probes.hang is not None else None,
                lambda exc: self._errors.absorb("goodput", exc),
            )
            if self.config.goodput.enable
            else None
        )
        stacks = (lambda: watchdog.latest) if watchdog is not None and hang.debug_endpoint else None
        try:
            self._sinks = build_sinks(self.config, self.store, self.rank, self._errors.absorb, self._breaker, stacks)
        except BaseException:  # the monitor is not constructed: nothing it started may outlive the error
            if self._goodput is not None:
                self._guard("goodput", self._goodput.close)
            raise
        self._errors.expect(sink.name for sink in self._sinks)
        self._publisher = StepPublisher(
            probes.step, self._thresholds, self._actions, self._sinks, self._batch, self._errors, self._breaker
        )
        self._fingerprints = (
            Fingerprints(self.store, self.config.divergence, self.rank, self._publisher.layouts)
            if self.config.divergence.enable
            else None
        )
        self._sampler = (
            MemorySampler(
                probes.memory,
                self.config.memory_interval,
                self._breaker,
                self._thresholds.check_slow,
                lambda exc: self._errors.absorb("sampler", exc),
            )
            if probes.memory is not None
            else None
        )
        self._signals = SignalRelay(self._on_signal, lambda exc: self._errors.absorb("callback", exc))
        self._wants_signals = any(sink.needs_signals for sink in self._sinks)
        if self._wants_signals:  # from now until close: a SIGTERM between or after train calls counts too
            self._signals.install()
        self._reset_step_state()
        if self._goodput is not None:  # saves from now on: a process killed before training still counts
            self._guard("goodput", self._goodput.start)
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
        endpoint = self._sink_of(PrometheusEndpoint)
        return endpoint.url if endpoint is not None else None

    @property
    def jsonl_path(self) -> str | None:
        writer = self._sink_of(JsonlWriter)
        return str(writer.path) if writer is not None else None

    def _sink_of(self, kind: type[_SinkType]) -> _SinkType | None:
        return next((sink for sink in self._sinks if isinstance(sink, kind)), None)

    def close(self) -> None:
        """Stop the threads, flush the JSONL file and stop serving. Safe to call twice; runs at exit."""
        if self._closed or not self._enabled:
            return
        self._closed = True
        if "SIGINT" in self._signals.received and self.phases.phase != ENDED:
            self.phases.enter(ENDED)  # a Ctrl-C outside training ends the script: the endpoint lingers for it too
        self._stop_sampler()
        self._guard("callback", self._publisher.publish, None, True)
        if self._goodput is not None:
            self._guard("goodput", self._goodput.close)
        self._signals.restore()  # a closed monitor must not stay in the signal path
        if self._actions is not None:
            self._guard("actions", self._actions.close)
        for sink in self._sinks:
            self._guard(sink.name, sink.close)

    def _announce(self, step: int, action: str, details: dict[str, Any]) -> None:
        """An action the monitor took, to the sinks that keep events (the JSON Lines file)."""
        for sink in self._sinks:
            self._guard(sink.name, sink.on_action, step, action, details)

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
            step = step_of(cb_params)
            self._publisher.reset(step)
            self._batch.bind(dataset_of(cb_params))
            network = train_network_of(cb_params)
            self._publisher.layouts.bind(network)
            # ms_exporter's own train cells say when a step will compile a graph they have not run yet.
            compiles_next = getattr(network, "compiles_next", None)
            self._compiles_next = compiles_next if callable(compiles_next) else None
            if self._actions is not None:  # first: lr_backoff wraps a schedule before anything compiles or reads it
                lr_probe = next((p for p in self._publisher.probes if isinstance(p, LearningRateProbe)), None)
                self._guard("actions", self._actions.on_train_begin, cb_params, lr_probe)
            for probe in self._publisher.probes:
                self._guard(probe.name, probe.on_train_begin, cb_params)
            if self._goodput is not None:
                self._guard("goodput", self._goodput.train_begin, cb_params)
            if self._fingerprints is not None:
                self._guard("divergence", self._fingerprints.train_begin, cb_params)
            for sink in self._sinks:
                self._guard(sink.name, sink.start, step)
            if self._sampler is not None:
                self._sampler.start()
            if self._watchdog is not None:
                self._watchdog.start()
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
        self._hook_cost["step_begin"].observe(time.perf_counter() - began)

    def on_train_step_end(self, run_context: Any) -> None:
        """Reads the loss (which ends the step) and keeps a raw record; the probes see it when it is published.

        Publishing runs every record since the last one through the probes, thresholds, actions and sinks in one
        loop, at most every PUBLISH_SECONDS (every step when steps are slower, or when actions are on): the
        per-step cost on the training thread is then one loss read and one append.
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
            if self._goodput is not None:  # before the phase changes: is the data wait ahead redo?
                self._goodput.step_ended(step)
            fingerprints = self._fingerprints
            if fingerprints is not None and step >= fingerprints.next_step:
                self._guard("divergence", fingerprints.take, step, outputs)
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
        if self._enabled and self._actions is not None:  # not timed: only actions use this hook
            self._guard("actions", self._actions.on_epoch_end, run_context, self._publisher.last_step)

    def on_train_end(self, run_context: Any) -> None:
        if not self._enabled:
            return
        with self._cost("train_end", "callback"):
            self.phases.enter(ENDED)  # before the sinks' last push: this rank ended normally
            if self._goodput is not None:
                self._guard("goodput", self._goodput.train_ended)
            self._finish_run()

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
        if self._eval is None:
            return
        with self._cost("eval_end", "eval"):
            self._publisher.publish(None, wait=True)
            results = eval_results_of(run_context.original_args())
            if results is not None:
                self._eval.on_eval(results)
                for sink in self._sinks:
                    self._guard(sink.name, sink.on_eval, self._publisher.last_step, results)

    def __exit__(self, *exc_info: Any) -> None:
        # MindSpore leaves the callback context on every exit from training, also when training raised
        # (on_train_end is not called then): flush and stop threads either way.
        if self._enabled and exc_info and exc_info[0] is not None:
            if issubclass(exc_info[0], (KeyboardInterrupt, SystemExit)):
                self.phases.enter(ENDED)  # stopped as asked (Ctrl-C, sys.exit from a handler): not a lost rank
            self._guard("callback", self._finish_run)

    # -- internals ----------------------------------------------------------------------------------------
    def _finish_run(self) -> None:
        self._guard("callback", self._other_callbacks.unwrap)
        self._stop_sampler()
        self._guard("callback", self._publisher.publish, None, True)
        for probe in self._publisher.probes:
            self._guard(probe.name, probe.on_train_end)
        for sink in self._sinks:
            self._guard(sink.name, sink.run_ended, self._publisher.last_step)

    def _on_signal(self, signal_name: str, ending: bool) -> None:
        """Flush what is queued and let each sink save what must outlive the process. When the signal ends the
        process (SIGTERM's default action), the rank ends as asked: it serves phase="ended" until two scrapes have
        read it (the endpoint's interrupted()) and only then leaves discovery, so a stopped job pages nobody."""
        self._guard("callback", self._publisher.publish, None)
        if ending:
            self.phases.enter(ENDED)
        if self._goodput is not None:
            self._goodput.save()
        for sink in self._sinks:
            self._guard(sink.name, sink.interrupted, signal_name, self._publisher.last_step)

    def _stop_sampler(self) -> None:
        if self._sampler is not None:
            self._sampler.stop()
        if self._watchdog is not None:
            self._watchdog.stop()

    def _guard(self, component: str, func: Callable[..., Any], *args: Any) -> None:
        try:
            func(*args)
        except Exception as exc:
            self._errors.absorb(component, exc)

    def _cost(self, hook: str, component: str) -> _HookTimer:
        return _HookTimer(self._hook_cost[hook], self._errors, component)


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
    """Times a non-step hook into the cost histogram and absorbs anything it raises."""

    def __init__(self, histogram: HistogramSeries, errors: ErrorSink, component: str) -> None:
        self._histogram = histogram
        self._errors = errors
        self._component = component

    def __enter__(self) -> None:
        self._began = time.perf_counter()

    def __exit__(self, exc_type: Any, exc: BaseException | None, tb: Any) -> bool:
        self._histogram.observe(time.perf_counter() - self._began)
        if isinstance(exc, Exception):
            self._errors.absorb(self._component, exc)
        return isinstance(exc, Exception)
