"""Turns the raw records the step hook keeps into StepSamples and hands each to probes, thresholds, actions
and sinks, in batches on the training thread."""

from __future__ import annotations

import threading
import time
from collections import deque
from dataclasses import dataclass
from typing import Any

from ms_exporter.actions.runner import ActionRunner
from ms_exporter.core.compat import SLOTS
from ms_exporter.core.errors import Breaker, ErrorSink
from ms_exporter.core.output_layout import LayoutResolver, OutputLayout
from ms_exporter.core.probe import Probe
from ms_exporter.core.sample import BatchCounter, StepSample
from ms_exporter.core.sink import Sink
from ms_exporter.features.breach_watch import ThresholdWatcher
from ms_exporter.monitor.isolation import Isolation

# Steps are published to the probes in batches at most this often (every step when steps take longer): one
# loop over many recorded steps costs a fraction of as many hook calls, whose code is cold after each training
# step. 1 s rather than 0.25 s: on the demo model a record cost ~44 µs in batches of ~31 against ~78 µs in
# batches of ~8 (docs/development.md), and no Prometheus scrape interval tells 1 s of delay apart.
PUBLISH_SECONDS = 1.0
MAX_PENDING_STEPS = 1024  # and at least every this many steps, so that very fast steps cannot pile up


@dataclass(frozen=True, **SLOTS)
class StepRecord:
    """What the step-end hook keeps of one call until it is published: raw readings, nothing derived yet.

    Built on the training thread once per step: ~0.9 µs against ~0.07 µs for a plain tuple (timeit, Python 3.11),
    about 1% of the hook's ~85 µs (docs/development.md).
    """

    step: int  # cb_params' cur_step_num after this call
    epoch: int  # cb_params' cur_epoch_num
    loss: float | None  # None when the outputs held no readable loss
    began: float  # perf_counter when the step began, moved later by other callbacks' time inside it
    ended: float  # perf_counter after the loss read (which waits for the device)
    data_wait: float | None  # seconds from the previous step's end to this step's begin (None for the first)
    kept: Any  # what BatchCounter.keep() kept of the batch (None in sink mode)
    outputs: tuple[Any, ...] | list[Any] | None  # net_outputs when a tuple/list (the probes read more of it)
    layout: OutputLayout | None = None  # what the driver says the outputs hold; None: told from cell and length
    own_compute: float = 0.0  # seconds from the step's begin to the collective the loop marked (0: none marked)
    hooks: float = 0.0  # seconds of other callbacks' hooks and evaluations in this step's cycle


class StepPublisher:
    """Holds the records waiting for publication and publishes them.

    Only the training thread publishes (and close() or a signal handler once training is over or interrupted):
    probes evaluate LR schedules and read tensors, and MindSpore calls from a second thread during a step can
    deadlock (seen: a schedule evaluated from a background thread while a graph ran).
    """

    def __init__(
        self,
        probes: list[Probe],
        thresholds: ThresholdWatcher,
        actions: ActionRunner | None,
        sinks: list[Sink],
        batch: BatchCounter,
        errors: ErrorSink,
        breaker: Breaker,
    ) -> None:
        self.pending: deque[StepRecord] = deque()
        self.probes = probes
        self._thresholds = thresholds
        self._actions = actions
        # Only the sinks that want steps: the others would cost a call per record for nothing.
        self._step_sinks = [sink for sink in sinks if type(sink).on_step is not Sink.on_step]
        self._batch = batch
        self._errors = errors
        self._breaker = breaker
        # What a probe, an action or a sink raises is its own failure, a BaseException too, unless a signal raised it
        # through them (a Ctrl-C): that one reaches the training. The monitor hands this its signal relay.
        self.isolation = Isolation()
        self.layouts = LayoutResolver()
        self._lock = threading.Lock()
        self.reset(0)

    def add_sink(self, sink: Sink) -> None:
        """A sink that joins a running monitor (a writer's fallback): it sees the steps published from now on.
        A new list, not an append, so that a publication in progress keeps iterating the old one."""
        if type(sink).on_step is not Sink.on_step:
            self._step_sinks = [*self._step_sinks, sink]

    def reset(self, step: int) -> None:
        """A training call begins at `step`."""
        self.last_step = step
        self.steps_done = 0
        self.published_at = 0.0

    def due(self, now: float) -> bool:
        """Whether the training thread should publish now."""
        return (
            now - self.published_at >= PUBLISH_SECONDS
            or self._actions is not None
            or len(self.pending) >= MAX_PENDING_STEPS
        )

    def publish(self, run_context: Any, wait: bool = False) -> None:
        """Run every pending record through the probes, thresholds, actions and sinks.

        Without `wait`, whoever finds the lock taken leaves the records to the loop that holds it (or to the next
        publication): the training thread never waits, and a signal that arrives while its own thread publishes
        does not start a second loop."""
        if not (self._lock.acquire(True, 5.0) if wait else self._lock.acquire(False)):
            return
        try:
            wall_offset = time.time() - time.perf_counter()  # the hook keeps perf_counter times only
            pending = self.pending
            isolation = self.isolation
            while pending:
                record = pending.popleft()
                mark = isolation.mark()
                try:
                    self._publish_step(record, wall_offset, run_context, mark)
                except BaseException as exc:  # one unreadable record costs that record, not the others
                    if isolation.passes(exc, mark):
                        raise
                    self._errors.absorb("callback", exc)
        finally:
            self._lock.release()

    def _publish_step(self, record: StepRecord, wall_offset: float, run_context: Any, mark: int) -> None:
        step, ended, outputs = int(record.step), record.ended, record.outputs
        steps = step - self.last_step if step > self.last_step else 1
        self.last_step = step
        self.steps_done += steps
        samples, tokens, squares = self._batch.count(record.kept, steps)
        sample = StepSample(
            step,
            int(record.epoch),
            steps,
            record.loss,
            ended - record.began,
            record.data_wait,
            samples,
            tokens,
            ended + wall_offset,
            ended,
            outputs,
            record.layout if record.layout is not None else self.layouts.resolve(outputs),
            squares,
            record.own_compute,
            record.hooks,
        )
        isolation = self.isolation
        for probe in self.probes:
            try:
                probe.on_step(sample)
            except BaseException as exc:
                if isolation.passes(exc, mark):
                    raise
                if self._breaker.failed(probe.name, exc, self.steps_done):
                    self.probes = [p for p in self.probes if p is not probe]
        self._thresholds.check_step(self.steps_done)
        if run_context is not None and self._actions is not None and "actions" not in self._breaker.disabled:
            try:
                self._actions.act(sample, run_context)
            except BaseException as exc:
                if isolation.passes(exc, mark):
                    raise
                self._breaker.failed("actions", exc, self.steps_done)
        for sink in self._step_sinks:
            try:
                sink.on_step(sample)
            except BaseException as exc:
                if isolation.passes(exc, mark):
                    raise
                self._errors.absorb(sink.name, exc)
