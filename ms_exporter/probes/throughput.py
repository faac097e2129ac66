"""Samples and tokens consumed, in total and per second over a short recent window."""

from __future__ import annotations

from ms_exporter.config import MonitorConfig
from ms_exporter.core import catalogue
from ms_exporter.core.part import PartContext
from ms_exporter.core.probe import Probe
from ms_exporter.core.rate_window import RateWindow
from ms_exporter.core.registry import ProbeEntry
from ms_exporter.core.sample import StepSample
from ms_exporter.core.store import MetricStore, Series


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
        self._window = RateWindow()
        self._samples = 0
        self._tokens = 0

    def on_train_begin(self, cb_params: object) -> None:
        self._window.clear()

    def on_step(self, sample: StepSample) -> None:
        self._samples += sample.samples
        self._samples_total.value = self._samples
        if sample.tokens and self._tokens_total is None:
            self._bind_token_series()
        self._tokens += sample.tokens
        added = (sample.samples, sample.tokens)
        elapsed, (samples, tokens) = self._window.advance(
            sample.monotonic, sample.cycle_began, (self._samples, self._tokens), added
        )
        if elapsed <= 0:
            return
        if self._samples_rate is None and self._samples_rate_family is not None:
            self._samples_rate = self._samples_rate_family.series()
        if self._samples_rate is not None:
            self._samples_rate.value = samples / elapsed
        if self._tokens_total is not None:
            self._tokens_total.value = self._tokens
            if self._tokens_rate is not None:
                self._tokens_rate.value = tokens / elapsed

    def _bind_token_series(self) -> None:
        self._tokens_total = self._store.register(catalogue.TOKENS).series()
        if self._want_tokens:
            self._tokens_rate = self._store.register(catalogue.TOKENS_PER_SECOND).series()


def build(context: PartContext) -> list[Probe]:
    config: MonitorConfig = context.config
    return [ThroughputProbe(context.store, config.wants("samples_per_second"), config.wants("tokens_per_second"))]


PART = ProbeEntry("throughput", build, ("samples_per_second", "tokens_per_second"), order=80)
