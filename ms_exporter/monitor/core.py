"""The monitor core: one typed step interface that every driver feeds, and the one place a run ends.

| call | a driver makes it when |
|---|---|
| train_begin(run, context) | a run begins: `run` says what is fixed for it (network, optimizer, dataset, step) |
| step_begin(step, batch) | a step begins with its batch in hand |
| step_end(step, epoch, outputs, batch, layout) | the step ended: `outputs` hold the loss first, then what is known |
| epoch_end(step) / eval_begin() / eval_end(results) | an epoch or an evaluation ended (or began) |
| end(completed, stopped) | the run ended: normally, by an exception, or stopped as asked (Ctrl-C, sys.exit) |
| close() | the monitor closes |

The drivers: the `Model.train` Callback (monitor/callback.py reads cb_params), the loop API (monitor/loop.py), and
MindSpore Transformers 2.x's TrainerCallback adapter. `run` is a mapping under MindSpore's cb_params keys
(core/cb_params.py reads it): MindSpore's own cb_params, or the loop's RunView; `context` answers
`original_args()` and `request_stop()` as MindSpore's RunContext does, so that actions can stop any driver's run.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from ms_exporter.config import MonitorConfig
from ms_exporter.core.catalogue import COMPILE, DATA_WAIT_PHASE, ENDED, EVAL_PHASE
from ms_exporter.core.cb_params import dataset_of, sink_mode_of, step_of, train_network_of
from ms_exporter.core.errors import ErrorSink
from ms_exporter.core.output_layout import OutputLayout
from ms_exporter.core.part import Part
from ms_exporter.core.part import overrides as overrides_hook
from ms_exporter.core.phases import PhaseClock
from ms_exporter.core.ranks import RankInfo, detect_rank
from ms_exporter.core.sample import Counted, read_loss
from ms_exporter.core.sink import Sink
from ms_exporter.core.store import HistogramSeries, MetricStore
from ms_exporter.features.signals import SignalRelay
from ms_exporter.monitor.assembly import assemble
from ms_exporter.monitor.isolation import Isolation
from ms_exporter.monitor.publisher import StepRecord
from ms_exporter.monitor.step_clock import StepClock

logger = logging.getLogger("ms_exporter")


class MonitorCore:
    """Holds the parts and drives them; names none of them. Every call is guarded: nothing it does raises into
    training but what a signal raised (a Ctrl-C reaches the training as it would without the monitor)."""

    def __init__(self, config: MonitorConfig, probes: Sequence[Any], sinks: Sequence[Any]) -> None:
        self.config = config
        self.rank: RankInfo = detect_rank()
        self.store = MetricStore((("rank", str(self.rank.rank)), ("project", config.project)))
        self.phases = PhaseClock(self.store)
        self.clock = StepClock(self.phases)
        built = assemble(config, self.store, self.rank, self.phases, self._announce, probes, sinks)
        self.parts: list[Part] = built.parts
        self._step_end = [part for part in built.parts if overrides_hook(part, "on_step_end")]
        # The parts that read the batch a step consumes (data_quality): at step begin, each guarded; one that fails
        # on DISABLE_AFTER batches in a row is left out from then on.
        self._batch_parts = [part for part in built.parts if overrides_hook(part, "on_batch")]
        self._breaker = built.breaker
        built.errors.expect(part.name for part in self._batch_parts)
        self._batch_names: tuple[str, ...] = ()
        self._batches_on = False  # off in sink mode: the step's element is not its data there
        self._batch_calls = 0
        self.publisher = built.publisher
        self.errors = built.errors
        self._batch = built.batch
        self._hook_cost = built.hook_cost
        self.signals = SignalRelay(self._on_signal, lambda exc: self.errors.absorb("callback", exc))
        self._isolation = self.publisher.isolation  # a part's BaseException is its own unless a signal raised it
        self._isolation.watch(self.signals)
        self._wants_signals = any(part.needs_signals for part in self.parts)
        if self._wants_signals:  # from now until close: a SIGTERM between or after train calls counts too
            self.signals.install()
        self._context: Any = None
        self._kept: Any = None
        self._eval_began: tuple[float, float] | None = None
        self.running = False  # between train_begin and end
        self._run_ended = False  # end() ran for the current run (a script may end one it never began: it says so)
        self.closed = False
        self.pid = os.getpid()  # the process that owns the parts: a forked child owns none of them

    # -- queries ---------------------------------------------------------------------------------------------
    @property
    def url(self) -> str | None:
        return next((sink.metrics_url for sink in self.parts if isinstance(sink, Sink) and sink.metrics_url), None)

    @property
    def jsonl_path(self) -> str | None:
        return next((sink.records_path for sink in self.parts if isinstance(sink, Sink) and sink.records_path), None)

    @property
    def last_step(self) -> int:
        return self.publisher.last_step

    # -- the step interface ----------------------------------------------------------------------------------
    def train_begin(self, run: Mapping[str, Any], context: Any) -> None:
        """A training run begins (Model.train may be called several times on one monitor)."""
        with self._cost("train_begin", "callback"):
            self.publisher.publish(None, wait=True)  # anything left from an earlier run belongs to that run
            self._context = context
            self._kept = None
            self._eval_began = None
            self.running = True
            self._run_ended = False
            network = train_network_of(run)
            # ms_exporter's own train cells say when a step will compile a graph they have not run yet.
            compiles_next = getattr(network, "compiles_next", None)
            self.clock.reset(compiles_next if callable(compiles_next) else None)
            self.phases.enter(COMPILE)
            self.phases.aside = 0.0
            self.publisher.reset(step_of(run))
            self._batch.bind(dataset_of(run))
            if self._batch_parts:
                self._batches_on = not sink_mode_of(run)
                self._batch_names = _column_names(dataset_of(run)) if self._batches_on else ()
            self.publisher.layouts.bind(network)
            for part in self.parts:
                self._guard(part.name, part.on_train_begin, run)
            if self._wants_signals:
                self.signals.install()  # again: a handler installed since (MindSpore's, the script's) chains to ours

    def bind_columns(self, names: tuple[str, ...]) -> None:
        """The batch's column names where the run's dataset did not say them (a loop over dicts)."""
        if self._batches_on and not self._batch_names:
            self._batch_names = names

    def step_begin(self, step: int, batch: Any) -> None:
        """The step begins with `batch` (its tensors in column order; None where the driver does not see it)."""
        began = self.clock.begin()
        try:
            # Keep what counting the batch needs (shape, mask): it is counted when the step is published.
            self._kept = self._batch.keep(batch)
        except Exception as exc:
            self._kept = None
            self.errors.absorb("callback", exc)
        if self._batches_on:
            self._hand_batch(step, batch)
        self._hook_cost["step_begin"].observe(time.perf_counter() - began)

    def step_end(
        self,
        step: int,
        epoch: int,
        outputs: Any,
        batch: Any = None,
        layout: OutputLayout | None = None,
        counted: tuple[int | None, int | None] | None = None,
    ) -> None:
        """Reads the loss (which ends the step) and keeps a raw record; the probes see it when it is published.

        Publishing runs every record since the last one through the probes, thresholds, actions and sinks in one
        loop, at most every PUBLISH_SECONDS (every step when steps are slower, or when actions are on): the
        per-step cost on the training thread is then one loss read, one append, and the parts that follow every
        step's end (goodput, divergence). `batch` serves a driver that saw no step begin; `layout` says what the
        items of `outputs` are where the driver knows it (else it is told from the train cell and the length);
        `counted`: (samples, tokens) the driver counted itself, either None where the batch says it.
        """
        entered = time.perf_counter()
        clock = self.clock
        try:
            reading = time.perf_counter()
            try:
                loss = read_loss(outputs)
            except Exception as exc:  # an unreadable loss must not cost the step: it is counted without a loss
                loss = None
                self.errors.absorb("loss", exc)
            # The loss read synchronises the device (GRAPH mode does not), so the step ends here.
            ended = time.perf_counter()
            entered += ended - reading  # the wait for the device belongs to the step, not to the monitor's cost
            kept = self._kept if self._kept is not None else self._batch.keep(batch)
            if counted is not None:
                kept = Counted(counted[0], counted[1], kept)
            for part in self._step_end:  # before the phase changes: goodput asks whether the wait ahead is redo
                mark = self._isolation.mark()
                try:
                    part.on_step_end(step, outputs)
                except BaseException as exc:
                    if self._isolation.passes(exc, mark):
                        raise
                    self.errors.absorb(part.name, exc)
            publisher = self.publisher
            # Only a tuple has more for the probes than the loss already read: a lone loss tensor is let go now.
            began = clock.end(entered)  # other callbacks' time inside the step is not the step's
            publisher.pending.append(
                StepRecord(
                    step,
                    epoch,
                    loss,
                    began,
                    ended,
                    clock.data_wait,
                    kept,
                    outputs if isinstance(outputs, (tuple, list)) else None,
                    layout,
                    clock.own_compute(began),
                    clock.hooks,
                )
            )
            if publisher.due(ended):
                publisher.published_at = ended
                publisher.publish(self._context)
        except Exception as exc:
            self.errors.absorb("callback", exc)
        finally:
            self._kept = None
            self._hook_cost["step_end"].observe(clock.after_end() - entered)

    def epoch_end(self, step: int) -> None:
        """An epoch ended at `step`."""
        for part in self.parts:  # not timed: only actions use this hook
            self._guard(part.name, part.on_epoch_end, self._context, step)

    def eval_begin(self) -> None:
        self.phases.enter(EVAL_PHASE)
        # (its start, the aside total then): a save or another callback inside the evaluation sets its own time
        # aside, which the evaluation's must not count again
        self._eval_began = (self.phases.state[1], self.phases.aside)

    def eval_end(self, results: Mapping[str, Any] | None) -> None:
        """An evaluation ended; its time is kept aside (not the data pipeline's). `results`: metric name -> value."""
        self.phases.enter(DATA_WAIT_PHASE)
        if self._eval_began is not None:
            began, aside_then = self._eval_began
            inside = max(0.0, self.phases.aside - aside_then)
            self.clock.set_aside(max(0.0, self.phases.state[1] - began - inside))
            self._eval_began = None
        if not self.config.wants("eval"):
            return
        with self._cost("eval_end", "eval"):
            self.publisher.publish(None, wait=True)
            if results is not None:
                for part in self.parts:
                    self._guard(part.name, part.on_eval, self.publisher.last_step, results)

    def end(self, completed: bool, stopped: bool = False) -> None:
        """The run ended: `completed` normally; else by an exception, `stopped` when it was asked to stop (Ctrl-C,
        sys.exit from a handler): a rank that ends either way is not a lost rank, one that raised otherwise is."""
        if self._run_ended:  # said already (a context's exit after the end hook, close() after train_end())
            return
        self._run_ended = True
        self.running = False
        with self._cost("train_end", "callback"):
            if completed or stopped:
                self._enter_ended()  # before the sinks' last push
            self._guard("callback", self.publisher.publish, None, True)
            for part in self.parts:
                self._guard(part.name, part.on_train_end, self.publisher.last_step, completed)

    def publish(self) -> None:
        """Run the steps recorded since the last publication through the probes now."""
        self._guard("callback", self.publisher.publish, None, True)

    def close(self) -> None:
        """Stop the threads, flush the JSONL file and stop serving. Safe to call twice."""
        # The pid too: a fork made by native code runs no Python at-fork hook, and its child may still exit Python.
        if self.closed or os.getpid() != self.pid:
            return
        self.closed = True
        if "SIGINT" in self.signals.received and self.phases.phase != ENDED:
            self._enter_ended()  # a Ctrl-C outside training ends the script: the endpoint lingers for it too
        self._guard("callback", self.publisher.publish, None, True)
        self.signals.restore()  # a closed monitor must not stay in the signal path
        for part in self.parts:
            self._guard(part.name, part.close)

    # -- internals ----------------------------------------------------------------------------------------------
    def _enter_ended(self) -> None:
        """The one place the `ended` phase is entered: the rank ended as it should, and pages nobody."""
        self.phases.enter(ENDED)

    def _announce(self, step: int, action: str, details: dict[str, Any]) -> None:
        """An action the monitor took, to the parts that keep events (the JSON Lines file)."""
        for part in self.parts:
            self._guard(part.name, part.on_action, step, action, details)

    def _on_signal(self, signal_name: str, ending: bool) -> None:
        """Flush what is queued and let each part save what must outlive the process. When the signal ends the
        process (SIGTERM's default action), the rank ends as asked: it serves phase="ended" until two scrapes of
        each scraper have read it (the endpoint's on_signal()) and only then leaves discovery, so a stopped job
        pages nobody."""
        self._guard("callback", self.publisher.publish, None)
        if ending:
            self._enter_ended()
        for part in self.parts:
            self._guard(part.name, part.on_signal, signal_name, self.publisher.last_step)

    def _hand_batch(self, step: int, element: Any) -> None:
        """The step's batch to the parts that read it (on_batch). A part that fails is counted; after DISABLE_AFTER
        failures in a row it gets no more batches (and says so once)."""
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

    def guard(self, component: str, func: Callable[..., Any], *args: Any) -> None:
        """Call `func`; what it raises is counted under `component`, unless a signal raised it."""
        self._guard(component, func, *args)

    def _guard(self, component: str, func: Callable[..., Any], *args: Any) -> None:
        mark = self._isolation.mark()
        try:
            func(*args)
        except BaseException as exc:  # a part's own, whatever its kind; a signal's reaches the training
            if self._isolation.passes(exc, mark):
                raise
            self.errors.absorb(component, exc)

    def _cost(self, hook: str, component: str) -> _HookTimer:
        return _HookTimer(self._hook_cost[hook], self.errors, component, self._isolation)


def _column_names(dataset: Any) -> tuple[str, ...]:
    """The dataset's column names in the order of a batch's tensors; () where it does not say."""
    try:
        return tuple(str(name) for name in dataset.get_col_names()) if dataset is not None else ()
    except Exception:  # a script's own dataset object, or one MindSpore cannot name the columns of
        return ()


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
