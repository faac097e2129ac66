"""Replica fingerprints: a checksum of this rank's trained weights every `divergence.every_n_steps` steps, equal on
every replica of a group while the replicas hold the same bits (docs/divergence.md).

| name | type | labels | unit |
|---|---|---|---|
| mindspore_train_param_fingerprint | gauge | replica_group | CRC-32 of the weights' per-tensor bit sums, in order |
| mindspore_train_param_fingerprint_step | gauge | replica_group | the step it was taken at |
| mindspore_train_param_fingerprint_overflow | gauge | replica_group | 1 if that step overflowed (where the cell says) |
| mindspore_train_param_fingerprint_grad_norm | gauge | replica_group | that step's gradient norm, all-reduced |

Taken on the training thread at the end of the step (every rank at the same step numbers, so that the rules
compare like with like), over the bits themselves, on the device that holds them: each weight tensor's elements
are read as integers of their own width (float32 as int32, float16 and bfloat16 as int16; a view, no widening copy)
and added exactly modulo 2^32, one compiled reduction for all tensors (on MindSpore's CPU target numpy adds them in
place: the tensors are host memory there); the host receives 8 bytes per tensor and folds them, in parameter order,
into one CRC-32. Integer addition is exact and does not depend on the order the device adds in, so replicas holding
equal bits get equal sums; a change of one element, by one unit in the last place (the bit patterns of
neighbouring floats differ by one) or by any amount, changes its tensor's sum: the change is less than 2^32.

The optimizer's moments are left out: the replicas train the weights, and a moment that differs on one replica
changes what it adds to the weights at its next update, which the next fingerprint sees; a moment difference that
never reaches the weights changes nothing the replicas compute. Leaving them out reads a third of the bytes Adam
keeps.
"""

from __future__ import annotations

import logging
import math
import threading
import zlib
from typing import Any

import numpy as np

from ms_exporter.config import DivergenceConfig
from ms_exporter.core import catalogue as c
from ms_exporter.core.cb_params import network_of, step_of, trained_weights_of
from ms_exporter.core.device_reductions import bit_sums
from ms_exporter.core.output_layout import LayoutResolver
from ms_exporter.core.part import Part
from ms_exporter.core.ranks import RankInfo
from ms_exporter.core.replicas import read_layout, replica_group
from ms_exporter.core.sample import read_scalar
from ms_exporter.core.store import MetricStore, Series

logger = logging.getLogger("ms_exporter")


class Fingerprints(Part):
    """`next_step` is the hot path's only look: a fingerprint is due when the step reaches it."""

    name = "divergence"

    def __init__(self, store: MetricStore, config: DivergenceConfig, rank: RankInfo, layouts: LayoutResolver) -> None:
        self._store = store
        self._config = config
        self._rank = rank
        self._layouts = layouts
        self._parameters: list[Any] = []
        self._series: dict[str, Series] = {}
        self._group: str | None = None
        self._taken: tuple[float, float] | None = None  # (step, fingerprint) of the last fingerprint
        self._seen = threading.local()  # per reading thread: the pair its last read of the fingerprint saw
        self.next_step = math.inf  # never, until train begin finds a replica group

    def on_train_begin(self, cb_params: Any) -> None:
        """Finds the replica group (once) and the parameters to fingerprint, and the first step due."""
        if self._group is None:
            self._group, why = self._find_group()
            if self._group is None:
                logger.info("ms_exporter: no replica fingerprints: %s", why)
                return
            logger.info(
                "ms_exporter: replica fingerprints every %d steps in replica group %s (%s)",
                self._config.every_n_steps,
                self._group,
                why,
            )
        network = network_of(cb_params)
        self._parameters = trained_weights_of(cb_params) or (
            list(network.trainable_params()) if network is not None else []
        )
        step = step_of(cb_params)
        self.next_step = self._after(step)

    def _find_group(self) -> tuple[str | None, str]:
        if self._config.replica_group is not None:
            return self._config.replica_group, "divergence.replica_group"
        return replica_group(self._rank.rank, read_layout(self._rank.world_size), self._config.model_parallel)

    def _after(self, step: int) -> float:
        every = self._config.every_n_steps
        return float((step // every + 1) * every)

    def on_step_end(self, step: int, outputs: Any) -> None:
        if step >= self.next_step:
            self.take(step, outputs)

    def take(self, step: int, outputs: Any) -> None:
        """The fingerprint of the parameters as this step left them (the training thread, at step end)."""
        self.next_step = self._after(step)
        first = self._taken is None
        self._taken = (float(step), float(fingerprint(self._parameters)))  # one assignment: a whole pair
        if first:  # the series appear with the first fingerprint: before it there is none to show
            group = self._group or ""
            # The fingerprint family first: readers go through families in the order they were registered.
            self._store.register(c.PARAM_FINGERPRINT).bind(self._read_value, replica_group=group)
            self._store.register(c.PARAM_FINGERPRINT_STEP).bind(self._read_step, replica_group=group)
        if isinstance(outputs, (tuple, list)):
            layout = self._layouts.resolve(outputs)
            self._report(c.PARAM_FINGERPRINT_OVERFLOW, outputs, layout.overflow)
            self._report(c.PARAM_FINGERPRINT_GRAD_NORM, outputs, layout.global_norm)

    def _read_value(self) -> float:
        taken = self._seen.taken = self._taken
        return taken[1] if taken is not None else math.nan

    def _read_step(self) -> float:
        """The step of the fingerprint this thread read last in its reading (a scrape reads the fingerprint, then
        its step): a new fingerprint taken between the two reads must not pair the old value with the new step,
        which would look like a rank that left its group."""
        taken = getattr(self._seen, "taken", None) or self._taken
        self._seen.taken = None
        return taken[0] if taken is not None else math.nan

    def _report(self, family: c.MetricFamily, outputs: Any, index: int | None) -> None:
        """The value the cell returned this step, NaN where it returned none this step (a norm measured every
        n-th step); no series at all for a cell that never returns one."""
        series = self._series.get(family.name)
        value = read_scalar(outputs[index]) if index is not None and index < len(outputs) else None
        if value is None and series is None:
            return
        if series is None:
            series = self._series[family.name] = self._store.register(family).series(replica_group=self._group or "")
        series.value = math.nan if value is None else float(value)


def fingerprint(parameters: list[Any]) -> int:
    """CRC-32 of every tensor's bit sum modulo 2^32 (little-endian int64s, in parameter order): equal for equal
    bits."""
    sums = bit_sums(parameters).astype("<i8")
    return zlib.crc32(np.ascontiguousarray(sums).data)
