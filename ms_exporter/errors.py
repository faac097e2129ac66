"""Absorbs failures after construction: count them, log each component once, never raise."""

from __future__ import annotations

import logging
import threading

from ms_exporter.store import MetricStore

logger = logging.getLogger("ms_exporter")

ERRORS_METRIC = "mindspore_exporter_errors_total"


class ErrorSink:
    """Counts absorbed errors in `mindspore_exporter_errors_total{component}` and logs the first of each."""

    def __init__(self, store: MetricStore, components: tuple[str, ...] = ()) -> None:
        self._family = store.counter(ERRORS_METRIC, "Failures the monitor absorbed instead of raising into training.")
        self._logged: set[str] = set()
        self._lock = threading.Lock()  # errors come from the training, sampler, writer and scrape threads
        for component in components:
            self._family.series(component=component)

    def absorb(self, component: str, exc: BaseException) -> None:
        try:
            with self._lock:
                self._family.series(component=component).value += 1
                first = component not in self._logged
                self._logged.add(component)
            if first:
                logger.error(
                    "ms_exporter: %s failed and was skipped (training continues; further failures of this "
                    "component are only counted in %s): %r",
                    component,
                    ERRORS_METRIC,
                    exc,
                    exc_info=exc,
                )
        except Exception:  # the error path itself must never raise into training
            pass
