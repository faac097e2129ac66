"""The one lifecycle every part of the monitor follows: probes, sinks, actions and whole features alike.

The monitor core (monitor/core.py) holds one ordered list of parts and calls each hook on each part in turn, each call
guarded: a part that raises is counted in `mindspore_exporter_errors_total{component=<name>}` and the others still run.
A part overrides only the hooks it needs; the core skips a per-step hook that a part does not override. Whichever
driver feeds the core (the Model.train Callback, the loop API, a trainer's callback), the parts see the same hooks:
`cb_params` is the run's view under MindSpore's cb_params keys (core/cb_params.py reads it), MindSpore's own or the
loop's, and `run_context` answers `original_args()` and `request_stop()` for either.

| hook | when |
|---|---|
| on_train_begin(cb_params) | a run begins (a `Model.train` call, a loop's first `steps()`): threads start |
| on_batch(step, columns, names) | step begin, on the training thread, for parts that override it: the batch |
| on_step_end(step, outputs) | every step, on the training thread, as the step ends: keep it cheap |
| on_step(sample) | each published step record (about once a second, in order); probes and sinks |
| on_epoch_end(run_context, step) | an epoch ended |
| on_eval(step, results) | an evaluation ended, with its results (metric name -> value as MindSpore gave it) |
| on_action(step, action, details) | the monitor acted on the run (a rollback, a stop) |
| on_train_end(step, completed) | training ended (`completed`) or raised, after the pending steps were published |
| on_signal(signal_name, step) | SIGTERM/SIGINT in the training process: save what must outlive it, quickly |
| close() | the monitor closes (at exit at the latest); after it nothing is called; safe to call twice |

on_batch gets the batch the step consumes (its tensors in the dataset's column order, not copied) and the dataset's
column names (`()` where it does not say); never in dataset sink mode, where the callback sees no batch.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from ms_exporter.core.errors import Breaker, OnError
from ms_exporter.core.phases import PhaseClock
from ms_exporter.core.ranks import RankInfo
from ms_exporter.core.store import MetricStore

if TYPE_CHECKING:
    from ms_exporter.core.sample import StepSample


@dataclass(frozen=True)
class DebugPage:
    """A page a part serves under the endpoint's /debug/ (same TLS and auth as /metrics): `read()` is its text now,
    None while it has none (a 404 that says `missing`)."""

    read: Callable[[], str | None]
    missing: str
    content_type: str = "text/plain; charset=utf-8"


class Part:
    name = "part"  # the `component` label of its errors
    # Whether the monitor should catch SIGTERM/SIGINT for this part (something to save before the process goes).
    needs_signals = False

    def on_train_begin(self, cb_params: Any) -> None:
        """Training begins (again: Model.train may be called several times on one monitor)."""

    def on_batch(self, step: int, columns: Sequence[Any], names: tuple[str, ...]) -> None:
        """The training thread begins `step` with this batch: its tensors in the dataset's column order (the step's
        own: copy what is kept), and the column names (empty when the dataset does not say). Keep it cheap."""

    def on_step_end(self, step: int, outputs: Any) -> None:
        """The training thread ends `step` now; `outputs` is the train cell's net_outputs."""

    def on_step(self, sample: StepSample) -> None:
        """One published step."""

    def on_epoch_end(self, run_context: Any, step: int) -> None:
        """An epoch ended at `step`."""

    def on_eval(self, step: int, results: Mapping[str, Any]) -> None:
        """An evaluation's results."""

    def on_action(self, step: int, action: str, details: Mapping[str, Any]) -> None:
        """An action taken on the training thread (ms_exporter.actions), with what it did."""

    def on_train_end(self, step: int, completed: bool) -> None:
        """Training ended at `step`: normally (`completed`) or by an exception out of Model.train."""

    def on_signal(self, signal_name: str, step: int) -> None:
        """The process was signalled: save what must survive it, quickly."""

    def close(self) -> None:
        """Release everything; safe to call twice."""


class ThreadPart(Part):
    """A part that is a background thread for the length of each training call: started at train begin,
    stopped at train end and at close (both safe to repeat)."""

    def start(self) -> None:
        raise NotImplementedError

    def stop(self) -> None:
        raise NotImplementedError

    def on_train_begin(self, cb_params: Any) -> None:
        self.start()

    def on_train_end(self, step: int, completed: bool) -> None:
        self.stop()

    def close(self) -> None:
        self.stop()


def overrides(part: Part, hook: str) -> bool:
    """Whether `part` does something in `hook` (the callback skips the per-step hooks of parts that do not)."""
    return getattr(type(part), hook) is not getattr(Part, hook)


@dataclass
class PartContext:
    """What a registry entry's builder gets (core/registry.py): the monitor's configuration and shared pieces.

    `config` is the MonitorConfig (typed loosely here: the config sits a layer above this base module)."""

    config: Any
    store: MetricStore
    rank: RankInfo
    phases: PhaseClock
    on_error: OnError  # counts a part's failure under its component, never raises
    breaker: Breaker
    # The endpoint's debug pages by path: the watchdog's latest dumps (/debug/stacks), the replica checks' window.
    debug_pages: dict[str, DebugPage] = field(default_factory=dict)
    port: int | None = None  # the port the endpoint really got: the prometheus builder sets it, file_sd reads it
    # A file writer (TensorBoard, W&B) that was switched off asks for JSON Lines in its place, naming itself: the
    # strategy-container article's rule that a failing writer falls back to the local file (monitor/assembly.py).
    fall_back: Callable[[str], None] | None = None
