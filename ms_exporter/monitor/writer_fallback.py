"""A file writer that gave up falls back to JSON Lines (the strategy-container article's rule: a failing TensorBoard
or W&B writer must not leave the run without a local record). Once, whichever writer asks first: a JSON Lines writer
(`backend: local`) joins the monitor, or, where one runs already, the log says that the numbers are there. A writer
that could not even start (its directory cannot be made, its run does not begin) asks the same way: while the
monitor is still being built the answer waits for `bind`, when the parts are known."""

from __future__ import annotations

import logging
import threading
from typing import Any

from ms_exporter.core import registry
from ms_exporter.core.part import Part, PartContext
from ms_exporter.core.sink import Sink
from ms_exporter.monitor.publisher import StepPublisher

logger = logging.getLogger("ms_exporter")


class WriterFallback:
    """PartContext.fall_back for one monitor: `bind` it to the parts once they are built."""

    def __init__(self, context: PartContext) -> None:
        self._context = context
        self._lock = threading.Lock()
        self._told: set[str] = set()
        self._parts: list[Part] = []
        self._publisher: StepPublisher | None = None
        self._bound = False
        self._at_start: list[str] = []  # writers that failed while the monitor was being built

    def bind(self, parts: list[Part], publisher: StepPublisher) -> None:
        """The monitor's parts and publisher, once built; a writer that failed meanwhile is answered now."""
        with self._lock:
            self._parts, self._publisher = parts, publisher
            self._bound = True
            waiting, self._at_start = self._at_start, []
        for writer in waiting:
            try:
                self._answer(writer, "could not start")
            except Exception as exc:  # no JSON Lines either (an unwritable save_dir): counted, construction goes on
                self._context.on_error("local", exc)

    def __call__(self, writer: str) -> None:
        """`writer` was switched off (called on its thread), or could not start (called while being built)."""
        with self._lock:
            if not self._bound:
                self._at_start.append(writer)
                return
        self._answer(writer, "was switched off")

    def _answer(self, writer: str, what: str) -> None:
        with self._lock:
            if writer in self._told:
                return
            self._told.add(writer)
            local = next((part for part in self._parts if isinstance(part, Sink) and part.name == "local"), None)
            if local is None:
                # Built with the monitor, a writer of the parts from the start: train begin starts its thread.
                local = self._start_json_lines(writer, now=what != "could not start")
                started = True
            else:
                started = False
        logger.warning(
            "ms_exporter: the %s writer %s; %s the step records in JSON Lines, %s",
            writer,
            what,
            "from now on" if started else "the monitor already keeps",
            getattr(local, "records_path", None),
        )

    def _start_json_lines(self, writer: str, now: bool) -> Any:
        [local] = registry.BACKENDS["local"].build(self._context)
        local.record_event("fallback", sink=writer)
        if now:
            local.start()
        self._parts.append(local)  # closed with the others; the training thread may see it from its next hook
        if self._publisher is not None:
            self._publisher.add_sink(local)
        return local
