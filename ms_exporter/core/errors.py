"""Absorbs failures after construction: count them, log each component once, never raise."""

from __future__ import annotations

import logging
import threading
import traceback
from collections.abc import Callable, Iterable

from ms_exporter.core import catalogue
from ms_exporter.core.redaction import hide_url_passwords
from ms_exporter.core.store import Family, MetricStore

logger = logging.getLogger("ms_exporter")

# How a part reports a failure it absorbed: the component (the `component` label of mindspore_exporter_errors_total)
# and the exception. ErrorSink.absorb is one.
OnError = Callable[[str, BaseException], None]
# The same for a part whose component is bound already (`lambda exc: errors.absorb("watchdog", exc)`).
OnPartError = Callable[[BaseException], None]


def described(exc: BaseException) -> str:
    """The error and its traceback for the log, with any password in a URL (user:password@host) hidden."""
    return hide_url_passwords(
        repr(exc) + "\n" + "".join(traceback.format_exception(type(exc), exc, exc.__traceback__)).rstrip()
    )


class ErrorSink:
    """Counts absorbed errors in `mindspore_exporter_errors_total{component}` and logs the first of each."""

    def __init__(self, store: MetricStore, components: Iterable[str] = ()) -> None:
        self._store = store
        self._registered: Family | None = None
        self._logged: set[str] = set()
        self._lock = threading.Lock()  # errors come from the training, sampler, writer and scrape threads
        if components:
            self.expect(components)

    @property
    def _family(self) -> Family:
        # Registered at the first expect() or absorb(), not at construction: the monitor builds its error sink
        # before its parts (they report through it) and shows the family where /metrics has always listed it.
        if self._registered is None:
            self._registered = self._store.register(catalogue.ERRORS)
        return self._registered

    def expect(self, components: Iterable[str]) -> None:
        """Show these components at 0 from the start: a dashboard then sees a series before the first failure."""
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
                    "component are only counted in %s): %s",
                    component,
                    catalogue.ERRORS.name,
                    described(exc),
                )
        except Exception:  # the error path itself must never raise into training
            pass


DISABLE_AFTER = catalogue.FAILURES_BEFORE_DISABLE


class Breaker:
    """Takes a component out after DISABLE_AFTER failures in a row; the rest of the monitor keeps working.

    "In a row" is judged by the caller's call index (the step number for step probes, the tick for the
    sampler), so a success costs nothing: only failures are recorded.
    """

    def __init__(self, errors: ErrorSink, store: MetricStore, limit: int = DISABLE_AFTER) -> None:
        self._errors = errors
        self._limit = limit
        self._streaks: dict[str, tuple[int, int]] = {}  # component -> (failures in a row, index of the last)
        self._store = store
        self._registered: Family | None = None
        self.disabled: set[str] = set()

    @property
    def _disabled_family(self) -> Family:
        if self._registered is None:  # at show() or the first switch-off, as ErrorSink's family
            self._registered = self._store.register(catalogue.COMPONENT_DISABLED)
        return self._registered

    def show(self) -> None:
        """Register mindspore_exporter_component_disabled now (its place on /metrics), before any switch-off."""
        _ = self._disabled_family

    def failed(
        self, component: str, exc: BaseException, index: int, then: str = "the other metrics keep working"
    ) -> bool:
        """Count the failure; True when this one switches the component off (`then`: what that means, for the log)."""
        self._errors.absorb(component, exc)
        try:
            count, last = self._streaks.get(component, (0, index - 2))
            count = count + 1 if index == last + 1 else 1
            self._streaks[component] = (count, index)
            if count < self._limit or component in self.disabled:
                return False
            self.disabled.add(component)
            self._disabled_family.series(component=component).value = 1
            logger.error(
                "ms_exporter: %s failed %d times in a row and is switched off for the rest of this "
                "process (last error: %s); %s",
                component,
                count,
                hide_url_passwords(repr(exc)),
                then,
            )
            return True
        except Exception:
            return False
