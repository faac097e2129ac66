"""The parts of monitor_config.actions fail alone: a part that fails is counted, logged, and after
FAILURES_BEFORE_DISABLE failures in a row switched off by itself, while the other parts go on.

| name | type | labels | unit |
|---|---|---|---|
| mindspore_exporter_errors_total | counter | component (actions.<part>: SAID's keys) | errors |
| mindspore_exporter_component_disabled | gauge | component (the same) | 1 |
"""

from __future__ import annotations

from collections.abc import Iterable

from ms_exporter.core.errors import Breaker, ErrorSink
from ms_exporter.core.store import MetricStore

# What the log calls each part (the configured actions, and rollback's own parts).
SAID = {
    "early_stop": "early stop",
    "lr_backoff": "LR back-off",
    "snapshot": "snapshots",
    "rollback": "rollback",
    "rollback.keep": "keeping good states",
    "rollback.list": "listing skipped batches",
}


def component(part: str) -> str:
    """The `component` label of a part's errors."""
    return f"actions.{part}"


class PartFailures:
    """Where the action parts report their failures. `enabled`: the configured actions, named in the log of a
    part switched off as those that go on."""

    def __init__(self, store: MetricStore, enabled: Iterable[str]) -> None:
        self._errors = ErrorSink(store)
        self._breaker = Breaker(self._errors, store)
        self._enabled = tuple(enabled)
        self._off: set[str] = set()  # parts that could not start
        parts = [*self._enabled, *(("rollback.keep", "rollback.list") if "rollback" in self._enabled else ())]
        self._errors.expect(component(part) for part in parts)

    def failed(self, part: str, exc: BaseException, index: int, consequence: str) -> bool:
        """Count a failure of `part` (its `index`-th call: consecutive indexes are failures in a row); True when
        this one switches the part off. `consequence` says what the part being off means, for the log."""
        others = [SAID[p] for p in self._enabled if p != part.split(".")[0] and not self.is_off(p)]
        then = f"{consequence}; {', '.join(others)} go{'es' if len(others) == 1 else ''} on" if others else consequence
        return self._breaker.failed(component(part), exc, index, then)

    def absorb(self, part: str, exc: BaseException) -> None:
        """Count and log (once) a failure that switches nothing off."""
        self._errors.absorb(component(part), exc)

    def switched_off(self, part: str) -> None:
        """`part` is off without failing 3 times (it could not start)."""
        self._off.add(part)

    def is_off(self, part: str) -> bool:
        return part in self._off or component(part) in self._breaker.disabled
