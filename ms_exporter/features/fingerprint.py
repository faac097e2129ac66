"""Replica fingerprints: a checksum of this rank's trained weights every `divergence.every_n_steps` steps, equal on
every replica of a group while the replicas hold the same bits (docs/divergence.md).

| name | type | labels | unit |
|---|---|---|---|
| mindspore_train_param_fingerprint | gauge | replica_group | CRC-32 of the weights' per-tensor bit sums, in order |
| mindspore_train_param_fingerprint_step | gauge | replica_group | the step it was taken at |
| mindspore_train_param_fingerprint_overflow | gauge | replica_group | 1 if that step overflowed (where the cell says) |
| mindspore_train_param_fingerprint_grad_norm | gauge | replica_group | that step's gradient norm, all-reduced |

With the replica checks of every step (docs/sdc.md) also `mindspore_train_param_checksum` and, where the train cell
measures it, the local gradient norm families of ms_exporter.features.local_gradients.

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
import time
import zlib
from collections.abc import Callable
from typing import Any

import numpy as np

from ms_exporter.config import DivergenceConfig
from ms_exporter.core import catalogue as c
from ms_exporter.core.analysis.replicas import read_layout, replica_group
from ms_exporter.core.cb_params import (
    network_of,
    optimizer_state_of,
    step_of,
    train_network_of,
    trained_weights_of,
)
from ms_exporter.core.device.device_reductions import bit_sums
from ms_exporter.core.output_layout import LayoutResolver
from ms_exporter.core.part import Part
from ms_exporter.core.ranks import RankInfo
from ms_exporter.core.sample import read_scalar
from ms_exporter.core.store import Family, MetricStore, Series
from ms_exporter.features.check_cost import CheckCost
from ms_exporter.features.local_gradients import RUN_VIEW_KEY, LimitWriter, LocalGradientCheck
from ms_exporter.features.replica_checks import StepChecks

logger = logging.getLogger("ms_exporter")
Announce = Callable[[int, str, dict[str, Any]], None]  # (step, event, details) to the parts that keep events


class Fingerprints(Part):
    """`next_step` is the hot path's only look: a fingerprint is due when the step reaches it."""

    name = "divergence"

    def __init__(
        self,
        store: MetricStore,
        config: DivergenceConfig,
        rank: RankInfo,
        layouts: LayoutResolver,
        announce: Announce | None = None,
    ) -> None:
        self._store = store
        self._announce = announce
        self._config = config
        self._rank = rank
        self._layouts = layouts
        self._parameters: list[Any] = []
        self._series: dict[str, Series] = {}
        self._group: str | None = None
        self._checks: StepChecks | None = None  # every step's bit sums (divergence.check_every_step)
        self._cost: CheckCost | None = None  # what they cost this rank, against its step cycle
        self._checked_at: float | None = None  # perf_counter() at the end of the last step's checks
        self._local: LocalGradientCheck | None = None
        self._run: Any = None  # the run view: where the loop API leaves a local gradient norm
        self._skips: tuple[LimitWriter, Any, Series] | None = None  # divergence.skip_local_grad_outliers
        self._checksums: Family | None = None
        self._bound: set[tuple[str, str]] = set()
        # (step, fingerprint, {(kind, bucket): checksum}) of the last fingerprint: one tuple, read whole by a scrape
        self._taken: tuple[float, float, dict[tuple[str, str], int]] | None = None
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
        if self._config.check_every_step:
            tensors = {"weights": self._parameters, "optimizer": optimizer_state_of(cb_params, self._parameters)}
            self._checks = StepChecks(tensors, self._config.buckets, self._config.window_steps)
            self._cost = CheckCost(
                sum(int(t.size) for kind in tensors.values() for t in kind),
                self._config.check_every_n_steps,
                self._config.every_n_steps,
            )
            self._checked_at = None  # the first step of a training call has no cycle before it
            self._run = cb_params
            self._local = self._local or self._local_check(train_network_of(cb_params))
        step = step_of(cb_params)
        self.next_step = self._after(step)

    def _local_check(self, cell: Any) -> LocalGradientCheck | None:
        """The check of the local gradient norms, where the train cell measures them (GradNormTrainOneStepCell); a
        loop that hands them to step_end(local_grad_norm=...) gets its check at the first it hands."""
        measure = getattr(cell, "measure_local_norms", None)
        if measure is None:
            return None
        norm = measure()
        check = self._checked(lambda: float(norm.asnumpy().reshape(-1)[0]))
        skip = getattr(cell, "skip_local_outliers", None)
        if self._config.skip_local_grad_outliers and skip is not None:
            limit, skipped = skip()
            self._skips = (
                LimitWriter(limit),
                skipped,
                self._store.register(c.LOCAL_GRAD_SKIPPED).series(replica_group=self._group or ""),
            )
        return check

    def _loop_local_check(self) -> LocalGradientCheck | None:
        run = self._run
        if run is None or run.get(RUN_VIEW_KEY) is None:
            return None
        return self._checked(lambda: _number(read_scalar(self._run.get(RUN_VIEW_KEY))))

    def _checked(self, source: Callable[[], float]) -> LocalGradientCheck:
        check = LocalGradientCheck(source, self._config.local_grad_factor)
        group = self._group or ""
        self._store.register(c.LOCAL_GRAD_NORM).bind(lambda: check.last, replica_group=group)
        self._store.register(c.LOCAL_GRAD_OUTLIERS).bind(lambda: float(check.outliers), replica_group=group)
        self._store.register(c.LOCAL_GRAD_OUTLIER_STEP).bind(
            lambda: float(check.last_outlier[0]) if check.last_outlier else math.nan, replica_group=group
        )
        return check

    def _find_group(self) -> tuple[str | None, str]:
        if self._config.replica_group is not None:
            return self._config.replica_group, "divergence.replica_group"
        return replica_group(self._rank.rank, read_layout(self._rank.world_size), self._config.model_parallel)

    def _after(self, step: int) -> float:
        every = self._config.every_n_steps
        return float((step // every + 1) * every)

    def on_step_end(self, step: int, outputs: Any) -> None:
        checks = self._checks
        if checks is not None and self._group is not None:
            local = self._local or self._loop_local_check()
            self._local = local
            norm = self._read_local(local, step) if local is not None else None  # every step: 4 bytes
            if step % self._config.check_every_n_steps == 0:
                began = time.perf_counter()
                checks.read(step, norm)
                ended = time.perf_counter()
                if self._cost is not None and self._checked_at is not None:
                    self._cost.observe(ended - began, began - self._checked_at)
                self._checked_at = ended
        if step >= self.next_step:
            self.take(step, outputs)

    def _read_local(self, check: LocalGradientCheck, step: int) -> float:
        outliers = check.outliers
        norm = check.read(step)
        if self._skips is not None:
            self._skipped(step, check)
        if check.outliers > outliers and check.last_outlier is not None:
            median = check.last_outlier[2]
            logger.error(
                "ms_exporter: rank %d's local gradient norm at step %d is %.6g, %.3g times its recent median %.6g: a "
                "corrupted local gradient, %s by every replica of group %s (docs/sdc.md#local-gradients)",
                self._rank.rank,
                step,
                norm,
                norm / median if median else math.inf,
                median,
                "skipped" if self._skips is not None else "applied",
                self._group,
            )
            details = {"rank": self._rank.rank, "norm": norm, "median": median, "replica_group": self._group}
            if self._announce is not None:
                self._announce(step, "local_gradient_outlier", details)
        return norm

    def _skipped(self, step: int, check: LocalGradientCheck) -> None:
        """Counts a step the cell skipped on every replica, and hands the cell the rank's limit for the next."""
        writer, skipped, series = self._skips  # type: ignore[misc]
        if float(skipped.asnumpy().reshape(-1)[0]) > 0:
            series.value += 1
            logger.error(
                "ms_exporter: step %d was skipped on every replica of group %s: a replica's local gradient norm was "
                "an outlier (divergence.skip_local_grad_outliers)",
                step,
                self._group,
            )
            if self._announce is not None:
                self._announce(step, "local_gradient_skip", {"rank": self._rank.rank, "replica_group": self._group})
        writer.write(check.limit)

    def take(self, step: int, outputs: Any) -> None:
        """The fingerprint of the parameters as this step left them (the training thread, at step end)."""
        self.next_step = self._after(step)
        checks = self._checks
        if checks is not None and checks.last_step == step:
            value, checksums = fingerprint_of(checks.last_weight_sums()), checks.publish()
            if self._announce is not None:
                self._announce(step, "replica_checksums", {"replica_group": self._group, **checks.accumulators})
        else:
            value, checksums = fingerprint(self._parameters), {}
        self._taken = (float(step), float(value), checksums)  # one assignment: a whole tuple
        self._show(checksums)
        if isinstance(outputs, (tuple, list)):
            layout = self._layouts.resolve(outputs)
            self._report(c.PARAM_FINGERPRINT_OVERFLOW, outputs, layout.overflow)
            self._report(c.PARAM_FINGERPRINT_GRAD_NORM, outputs, layout.global_norm)

    def _show(self, checksums: dict[tuple[str, str], int]) -> None:
        """The series appear with the first fingerprint (before it there is none to show), a bucket's with its first
        checksum. The fingerprint family first, its step last: readers go through families in the order they were
        registered, and every value a scrape reads is of the fingerprint its first read saw."""
        group = self._group or ""
        if self._checksums is None:
            self._store.register(c.PARAM_FINGERPRINT).bind(self._read_value, replica_group=group)
            self._checksums = self._store.register(c.PARAM_CHECKSUM)
            self._store.register(c.PARAM_FINGERPRINT_STEP).bind(self._read_step, replica_group=group)
        for kind, bucket in sorted(checksums.keys() - self._bound):
            self._bound.add((kind, bucket))
            reader = self._checksum_reader((kind, bucket))
            self._checksums.bind(reader, replica_group=group, kind=kind, bucket=bucket)

    def _read_value(self) -> float:
        taken = self._seen.taken = self._taken
        return taken[1] if taken is not None else math.nan

    def _checksum_reader(self, key: tuple[str, str]) -> Callable[[], float]:
        def read() -> float:
            taken = getattr(self._seen, "taken", None) or self._taken
            return float(taken[2].get(key, math.nan)) if taken is not None else math.nan

        return read

    def checksums_page(self) -> str | None:
        """/debug/checksums: the per-step sums of the last `divergence.window_steps` steps (None before the first)."""
        checks = self._checks
        if checks is None or checks.last_step is None:
            return None
        return checks.page(self._rank.rank, self._group or "")

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


def _number(value: float | None) -> float:
    return math.nan if value is None else value


def fingerprint(parameters: list[Any]) -> int:
    """CRC-32 of every tensor's bit sum modulo 2^32 (little-endian int64s, in parameter order): equal for equal
    bits."""
    return fingerprint_of(bit_sums(parameters))


def fingerprint_of(sums: np.ndarray) -> int:
    return zlib.crc32(np.ascontiguousarray(sums.astype("<i8")).data)
