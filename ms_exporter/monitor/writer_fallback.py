"""A file writer that gave up falls back to JSON Lines (the first source article's rule: a failing TensorBoard or
W&B writer must not leave the run without a local record). Once, whichever writer asks first: a JSON Lines writer
(`backend: local`) joins the running monitor, or, where one runs already, the log says that the numbers are there."""

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

    def bind(self, parts: list[Part], publisher: StepPublisher) -> None:
        self._parts, self._publisher = parts, publisher

    def __call__(self, writer: str) -> None:
        """`writer` was switched off (called on its thread)."""
        with self._lock:
            if writer in self._told:
                return
            self._told.add(writer)
            local = next((part for part in self._parts if isinstance(part, Sink) and part.name == "local"), None)
            if local is None:
                local = self._start_json_lines(writer)
                started = True
            else:
                started = False
        logger.warning(
            "ms_exporter: the %s writer was switched off; %s the step records in JSON Lines, %s",
            writer,
            "from now on" if started else "the monitor already keeps",
            getattr(local, "records_path", None),
        )

    def _start_json_lines(self, writer: str) -> Any:
        [local] = registry.BACKENDS["local"].build(self._context)
        local.record_event("fallback", sink=writer)
        local.start()
        self._parts.append(local)  # closed with the others; the training thread may see it from its next hook
        if self._publisher is not None:
            self._publisher.add_sink(local)
        return local
