"""Rates of running totals over a short recent window of step ends (throughput, model FLOPs)."""

from __future__ import annotations

from collections import deque

from ms_exporter.core.compat import zip_strict

WINDOW_SECONDS = 10.0
WINDOW_POINTS = 1024  # and at most this many step ends, so that very fast steps cannot grow the window's memory


class RateWindow:
    """Keeps (time, totals) at step ends over about the last WINDOW_SECONDS or WINDOW_POINTS step ends, whichever
    is shorter. Two windows fed the same step ends span the same time, so their rates can be multiplied and
    divided: tokens/s times FLOPs per token is FLOPs/s exactly."""

    def __init__(self) -> None:
        self._points: deque[tuple[float, tuple[float, ...]]] = deque(maxlen=WINDOW_POINTS)

    def clear(self) -> None:
        self._points.clear()

    def advance(
        self, now: float, began: float, totals: tuple[float, ...], added: tuple[float, ...]
    ) -> tuple[float, tuple[float, ...]]:
        """Record the totals at a step end `now`, where this step added `added` since it `began`; return the
        window's length in seconds and how much each total grew over it."""
        points = self._points
        if not points:
            # The first call has no earlier point: its own begin is the window's start.
            points.append((began, tuple(total - part for total, part in zip_strict(totals, added))))
        points.append((now, totals))
        while len(points) > 2 and now - points[1][0] >= WINDOW_SECONDS:
            points.popleft()
        start, first = points[0]
        return now - start, tuple(total - old for total, old in zip_strict(totals, first))
