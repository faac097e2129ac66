"""Samples and tokens consumed, in total and per second over a short recent window."""

from __future__ import annotations

from collections import deque

from ms_exporter import catalogue
from ms_exporter.monitor.sample import StepSample
from ms_exporter.monitor.store import MetricStore, Series
from ms_exporter.probes.base import Probe

WINDOW_SECONDS = 10.0
WINDOW_POINTS = 1024  # and at most this many step ends, so that very fast steps cannot grow the window's memory


class ThroughputProbe(Probe):
    """Rates are (count now - count at the window's start) / elapsed, over about the last 10 seconds or the
    last 1,024 step ends, whichever is shorter.

    | name | type | labels | unit |
    |---|---|---|---|
    | mindspore_train_samples_total | counter | | samples |
    | mindspore_train_tokens_total | counter | | tokens (non-padding) |
    | mindspore_train_samples_per_second | gauge | | samples/s |
    | mindspore_train_tokens_per_second | gauge | | tokens/s |
    """

    name = "throughput"

    def __init__(self, store: MetricStore, samples: bool, tokens: bool) -> None:
        self._store = store
        self._want_samples = samples
        self._want_tokens = tokens
        self._samples_total = store.register(catalogue.SAMPLES).series()
        # Rates appear with the first one measured; before it a 0 would read as a stopped job.
        self._samples_rate_family = store.register(catalogue.SAMPLES_PER_SECOND) if samples else None
        self._samples_rate: Series | None = None
        # Token series appear only once a batch with a token column was seen: image data has none.
        self._tokens_total: Series | None = None
        self._tokens_rate: Series | None = None
        self._points: deque[tuple[float, int, int]] = deque(maxlen=WINDOW_POINTS)
        self._samples = 0
        self._tokens = 0

    def on_train_begin(self, cb_params: object) -> None:
        self._points.clear()

    def on_step(self, sample: StepSample) -> None:
        self._samples += sample.samples
        self._samples_total.value = self._samples
        if sample.tokens and self._tokens_total is None:
            self._bind_token_series()
        self._tokens += sample.tokens
        points = self._points
        now = sample.monotonic
        if not points:
            # The first call has no earlier point: its own begin is the window's start.
            points.append((now - sample.duration - (sample.data_wait or 0.0), self._samples - sample.samples,
                           self._tokens - sample.tokens))
        points.append((now, self._samples, self._tokens))
        while len(points) > 2 and now - points[1][0] >= WINDOW_SECONDS:
            points.popleft()
        start, samples0, tokens0 = points[0]
        elapsed = now - start
        if elapsed <= 0:
            return
        if self._samples_rate is None and self._samples_rate_family is not None:
            self._samples_rate = self._samples_rate_family.series()
        if self._samples_rate is not None:
            self._samples_rate.value = (self._samples - samples0) / elapsed
        if self._tokens_total is not None:
            self._tokens_total.value = self._tokens
            if self._tokens_rate is not None:
                self._tokens_rate.value = (self._tokens - tokens0) / elapsed

    def _bind_token_series(self) -> None:
        self._tokens_total = self._store.register(catalogue.TOKENS).series()
        if self._want_tokens:
            self._tokens_rate = self._store.register(catalogue.TOKENS_PER_SECOND).series()
