"""The lifecycle every sink shares; the callback holds a list of sinks and calls each hook with failures isolated."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ms_exporter.core.sample import StepSample


class Sink:
    """Where numbers go. Each hook is called for every sink in turn; one that raises is counted in
    `mindspore_exporter_errors_total{component=<name>}` and the others still run. Sinks read the MetricStore;
    probes never import them.

    | hook | when |
    |---|---|
    | start(step) | every train begin (threads, periodic pushes) |
    | on_step(sample) | each published step record, on the training thread: keep it cheap |
    | on_eval(step, metrics) | an evaluation ended |
    | on_action(step, action, details) | the monitor acted on the run (a rollback, a stop) |
    | run_ended(step) | train end, or training raised |
    | interrupted(signal_name, step) | SIGTERM/SIGINT in the training process, before the previous handler runs |
    | close() | the monitor closes (at exit at the latest); after it nothing is called |
    """

    name = "sink"  # the `component` label of its errors; a backend's name where it is one
    # Whether the monitor should catch SIGTERM/SIGINT for this sink (something to save before the process goes).
    needs_signals = False

    def start(self, step: int) -> None:
        """Training begins (again: Model.train may be called several times on one monitor)."""

    def on_step(self, sample: StepSample) -> None:
        """One published step."""

    def on_eval(self, step: int, metrics: Mapping[str, Any]) -> None:
        """An evaluation's results (metric name -> value as MindSpore gave it)."""

    def on_action(self, step: int, action: str, details: Mapping[str, Any]) -> None:
        """An action taken on the training thread (ms_exporter.actions), with what it did."""

    def run_ended(self, step: int) -> None:
        """Training ended; the sink may be started again by another train call."""

    def interrupted(self, signal_name: str, step: int) -> None:
        """The process was signalled: save what must survive it, quickly."""

    def close(self) -> None:
        """Release everything; safe to call twice."""
