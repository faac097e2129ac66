"""backend: console: one progress line through logging every `interval` seconds (the monitor_config article's minimal
monitor prints the step, the loss and the learning rate; the strategy-container article keeps print() off the
step path).

The same line comes without `backend: console` too, on rank 0, whenever `log_level` lets INFO through: the
monitor_config article's check that the monitor works is this line in the training's output, and the other backends
(Prometheus, OTLP, JSON Lines, TensorBoard, W&B) write nowhere a person reading the training's output looks
(`progress_line`).

The line is an INFO record of the `ms_exporter` logger, written when a step is published (on the training thread,
at most once per `interval`): `step 1200 epoch 3 loss 2.314 lr 0.0001 tokens/s 10240 step 21.3 ms`. A quantity the
run does not measure is left out of the line.
"""

from __future__ import annotations

import logging
import math

from ms_exporter.core import catalogue
from ms_exporter.core.part import PartContext
from ms_exporter.core.registry import BackendEntry
from ms_exporter.core.sample import StepSample
from ms_exporter.core.sink import Sink
from ms_exporter.core.store import MetricStore

logger = logging.getLogger("ms_exporter")


class ConsoleLine(Sink):
    name = "console"

    def __init__(self, store: MetricStore, interval: float) -> None:
        self._store = store
        self._interval = interval
        self._next = -math.inf

    def on_step(self, sample: StepSample) -> None:
        if sample.monotonic < self._next:
            return
        self._next = sample.monotonic + self._interval
        logger.info("ms_exporter: %s", self.line(sample))

    def line(self, sample: StepSample) -> str:
        parts = [f"step {sample.step}", f"epoch {sample.epoch}"]
        if sample.loss is not None:
            parts.append(f"loss {sample.loss:.4g}")
        for label, family, form in (
            ("lr", catalogue.LEARNING_RATE, ".4g"),
            ("tokens/s", catalogue.TOKENS_PER_SECOND, ".0f"),
        ):
            value = self._store.value_of(family)
            if not math.isnan(value):
                parts.append(f"{label} {value:{form}}")
        parts.append(f"step {sample.duration * 1e3:.1f} ms")
        return " ".join(parts)


def build(context: PartContext) -> list[Sink]:
    return [ConsoleLine(context.store, context.config.interval)]


def progress_line(context: PartContext) -> list[Sink]:
    """The line for a run that did not list `console`: on rank 0 only (the articles print their summary from the
    main rank; 1,000 ranks' lines would bury it), and only where log_level shows INFO lines."""
    config = context.config
    if "console" in config.backend or context.rank.rank != 0:
        return []
    if logging.getLevelName(config.log_level.upper()) > logging.INFO:
        return []
    return [ConsoleLine(context.store, config.interval)]


PART = BackendEntry("console", build, order=60)
