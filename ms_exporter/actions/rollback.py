"""actions.rollback: keep the last good state; on a divergence restore it, list the batches trained since, go on.

| name | type | labels | unit |
|---|---|---|---|
| mindspore_train_health_score | gauge | | 0 to 1 (ms_exporter.actions.health) |
| mindspore_train_last_good_step | gauge | | step of the newest good state |
| mindspore_train_rollback_lost_steps_total | counter | | steps undone |
| mindspore_train_actions_total | counter | action (rollback, rollback_stop) | actions |

Runs on the training thread at the end of every step (the step's update is done: a divergence seen in its loss
is already in the weights, which is why a state is only kept after `quiet_steps` quiet steps).

Its parts fail alone (ms_exporter.actions.parts): keeping good states that fails 3 times in a row is switched off
while restoring goes on with the states kept before; a good state that cannot be read back is removed and the one
before it restored; a list that cannot be written still leaves the rollback counted and announced.

A good state on disk is written by a background thread (ms_exporter.actions.good_state): it counts as kept when its
file is complete, which the step ends look for. Until then the batches trained since the state before stay listed,
and a write that fails counts as a keep that failed (the next quiet, healthy step tries again).
"""

from __future__ import annotations

import logging
import math
import time
from collections import deque
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, Protocol

import numpy as np

from ms_exporter.actions.decisions import anomaly_of
from ms_exporter.actions.good_state import STATE_DIR, GoodState, GoodStates
from ms_exporter.actions.health import HealthScore, hottest_accelerator
from ms_exporter.actions.parts import PartFailures
from ms_exporter.actions.skipped_batches import SkippedBatches, batch_identity
from ms_exporter.config import RollbackConfig
from ms_exporter.core import catalogue
from ms_exporter.core.analysis.ledger import process_started
from ms_exporter.core.cb_params import batch_of, network_of, optimizer_of, step_of, steps_per_epoch_of
from ms_exporter.core.sample import StepSample
from ms_exporter.core.store import MetricStore, Series

logger = logging.getLogger("ms_exporter")

# (action, details) to the sinks that keep events (the JSON Lines file)
Announce = Callable[[int, str, dict[str, Any]], None]


class StateFollower(Protocol):
    """What keeps figures of the steps it saw (the probes: ms_exporter.core.probe.Probe) and follows the
    training back to a good state."""

    def on_good_state(self, step: int) -> None: ...

    def on_rollback(self, good_step: int) -> None: ...


def divergence_of(
    config: RollbackConfig,
    loss: float | None,
    smoothed_before: float,
    grad_norm: float,
    grad_limit: float,
    warm: bool = True,
) -> str | None:
    """What makes this step a divergence, if anything: the anomalies actions.snapshot knows (anomaly_of), each
    trigger as configured. Before the run is `warm` (its first warmup_steps steps) a loss spike does not count: a
    smoothed loss of a few steps says little."""
    if loss is not None and not math.isfinite(loss) and not config.on_nonfinite:
        return None
    spike_factor = config.spike_factor if warm and config.spike_factor is not None else math.inf
    return anomaly_of(loss, smoothed_before, spike_factor, None if math.isnan(grad_norm) else grad_norm, grad_limit)


class LoopGuard:
    """At most `max_rollbacks` rollbacks within `window_steps` steps; the next divergence inside the window stops."""

    def __init__(self, max_rollbacks: int, window_steps: int) -> None:
        self._max = max_rollbacks
        self._window = window_steps
        self._steps: deque[int] = deque()

    def allows(self, step: int) -> bool:
        while self._steps and self._steps[0] <= step - self._window:
            self._steps.popleft()
        return len(self._steps) < self._max

    def record(self, step: int) -> None:
        self._steps.append(step)

    @property
    def recent(self) -> int:
        return len(self._steps)


class Rollback:
    def __init__(
        self,
        config: RollbackConfig,
        store: MetricStore,
        save_dir: Path,
        grad_high: float,
        grad_exploding: float,
        memory_growth_limit: float,
        rank: int,
        world_size: int,
        counts: dict[str, Series],
        announce: Announce,
        warmup_steps: int = 0,
        followers: Sequence[StateFollower] = (),
        parts: PartFailures | None = None,
        run_id: str = "run",
    ) -> None:
        self._config = config
        self._followers = tuple(followers)
        self._warmup = warmup_steps
        self._steps_seen = 0
        self._grad_limit = config.grad_norm_above if config.grad_norm_above is not None else grad_exploding
        self._health = HealthScore(config.quiet_steps, grad_high, grad_exploding, memory_growth_limit)
        self._states = GoodStates(
            config.storage,
            config.memory_limit_mb * 2**20,
            save_dir / STATE_DIR,
            config.max_kept,
            owner=f"{run_id}-rank{rank}",
        )
        self._parts = parts if parts is not None else PartFailures(store, ("rollback",))
        self._keeping = True
        self._keep_calls = 0
        self._tidied = False
        self._skipped = SkippedBatches(save_dir)
        self._guard = LoopGuard(config.max_rollbacks, config.window_steps)
        self._rank = rank
        self._replicas = world_size > 1  # then memory (not the same on every rank) stays out of the decision
        self._counts = counts
        self._announce = announce
        self._health_gauge = store.register(catalogue.HEALTH_SCORE).series()
        self._last_good = store.register(catalogue.LAST_GOOD_STEP).series()
        self._lost = store.register(catalogue.ROLLBACK_LOST_STEPS).series()
        self._store = store
        # the batches trained since the newest good state kept, each with the count of steps seen at its end
        self._since_good: list[tuple[int, dict[str, Any]]] = []
        self._in_flight: dict[GoodState, tuple[int, int]] = {}  # a state being written: (steps seen, keep call)
        self._quiet = 0
        self._next_good = config.good_every
        self._warned_no_state = False
        self._stopped = False
        self._network: Any = None

    def on_train_begin(self, cb_params: Any) -> None:
        network = network_of(cb_params)
        if network is None:
            raise RuntimeError("no train network in cb_params: rollback has nothing to restore")
        optimizer = optimizer_of(cb_params) or getattr(network, "optimizer", None)
        learning_rate = getattr(optimizer, "learning_rate", None)
        from mindspore import Parameter, ParameterTuple

        fixed_lr = (
            (learning_rate,)
            if isinstance(learning_rate, Parameter)
            else tuple(learning_rate)
            if isinstance(learning_rate, ParameterTuple)
            else ()
        )
        if network is not self._network:  # another train call on the same network keeps its good states
            self._network = network
            self._states.bind(network, leave_out=fixed_lr, optimizer=optimizer)
            self._in_flight.clear()
        if not self._tidied:
            self._tidied = True
            self._remove_leftovers()
        step = step_of(cb_params)
        self._next_good = (step // self._config.good_every + 1) * self._config.good_every
        logger.info(
            "ms_exporter: rollback keeps good states of %d parameters (%.1f MiB of device memory each) %s every %d "
            "steps",
            len(self._states.names),
            self._states.nbytes / 2**20,
            "as device copies" if self._states.where == "memory" else "in files written from a device copy",
            self._config.good_every,
        )

    def on_step(self, sample: StepSample, run_context: Any, smoothed_before: float) -> bool:
        """One step; True when it rolled the training back to a good state."""
        if self._stopped:
            return False
        cb_params = run_context.original_args()
        step = sample.step
        self._steps_seen += 1
        self._since_good.append((self._steps_seen, self._identity(cb_params, step, sample.epoch)))
        self._take_in(self._states.finished())
        store = self._store
        grad_norm = store.value_of(catalogue.GRAD_NORM)
        health = self._health.observe(
            sample.loss,
            store.value_of(catalogue.LOSS_SMOOTHED),
            grad_norm,
            store.value_of(catalogue.MEMORY_GROWTH_RATIO),
            hottest_accelerator(store),
        )
        self._health_gauge.value = health.score
        reason = divergence_of(
            self._config,
            sample.loss,
            smoothed_before,
            grad_norm,
            self._grad_limit,
            warm=self._steps_seen > self._warmup,
        )
        if reason is not None:
            self._quiet = 0
            return self._diverged(run_context, step, reason, sample.loss)
        self._quiet += 1
        gate = health.replica_score if self._replicas else health.score
        if (
            self._keeping
            and step >= self._next_good
            and self._quiet >= self._config.quiet_steps
            and gate >= self._config.min_health
        ):
            if self._states.writing:  # the state before is still being written: keep at the next quiet step
                return False
            self._keep_calls += 1
            try:
                state = self._states.capture(step)
            except Exception as exc:  # no device memory, no directory: the states kept before stay; the next step
                self._keep_failed(exc, self._keep_calls)  # tries again
                return False
            for follower in self._followers:
                follower.on_good_state(step)
            if state.path is None:  # in memory: kept now
                self._kept(state, self._steps_seen)
            else:  # kept once its file is written (finished() says; it may have failed already)
                self._in_flight[state] = (self._steps_seen, self._keep_calls)
            self._next_good = (step // self._config.good_every + 1) * self._config.good_every
            logger.debug(
                "ms_exporter: good state at step %d (%.1f MiB, %.1f ms on the training thread)",
                step,
                state.nbytes / 2**20,
                state.seconds * 1e3,
            )
        return False

    def _kept(self, state: GoodState, seen: int) -> None:
        """`state` is kept: the batches trained up to it (`seen` steps) are no longer the rollback's business."""
        self._since_good = [entry for entry in self._since_good if entry[0] > seen]
        self._last_good.value = state.step

    def _take_in(self, ended: list[GoodState]) -> None:
        """The good states whose file write ended: kept, or a keep that failed."""
        for state in ended:
            if state not in self._in_flight:
                continue
            seen, call = self._in_flight.pop(state)
            if state.error is None:
                self._kept(state, seen)
                logger.debug(
                    "ms_exporter: good state of step %d written (%.1f ms in the background)",
                    state.step,
                    state.write_seconds * 1e3,
                )
            elif self._keeping:
                self._keep_failed(state.error, call)
                self._next_good = 0  # the next quiet, healthy step tries again, as after a keep that failed at once

    def _keep_failed(self, exc: BaseException, call: int) -> None:
        if self._parts.failed("rollback.keep", exc, call, self._keeping_off()):
            self._keeping = False

    def _keeping_off(self) -> str:
        kept = self._states.kept_steps
        before = (
            f"a rollback restores the states kept before (step{'s' if len(kept) > 1 else ''} "
            f"{', '.join(map(str, kept))})"
            if kept
            else "none was kept, so a divergence is logged, not undone"
        )
        return f"keeping good states is off: {before}"

    def _remove_leftovers(self) -> None:
        """What earlier processes of this run and rank left (killed before close), said in the log."""
        started = time.time() - (time.perf_counter() - process_started())
        removed = []
        for remove in (self._states.remove_leftovers, self._skipped.remove_leftovers):
            try:
                removed += remove(started)
            except Exception as exc:  # a tidy-up that fails costs nothing but disk space
                self._parts.absorb("rollback", exc)
        if removed:
            logger.warning(
                "ms_exporter: rollback removed %d files earlier processes of this run and rank left behind: %s",
                len(removed),
                ", ".join(str(p) for p in removed[:10]),
            )

    def _identity(self, cb_params: Any, step: int, epoch: int) -> dict[str, Any]:
        batch_num = steps_per_epoch_of(cb_params)
        position = (step - 1) % batch_num + 1 if batch_num > 0 else None
        element = batch_of(cb_params)
        columns = None
        if isinstance(element, (list, tuple)) and element:
            columns = [np.asarray(t.asnumpy() if hasattr(t, "asnumpy") else t) for t in element]
        return {**batch_identity(step, epoch, position, columns), "rank": self._rank}

    def _diverged(self, run_context: Any, step: int, reason: str, loss: float | None) -> bool:
        state = self._states.newest
        if state is None:
            if not self._warned_no_state:
                self._warned_no_state = True
                logger.warning(
                    "ms_exporter: rollback: %s at step %d, but no good state was kept yet (the first "
                    "comes after step %d and %d quiet steps); training goes on",
                    reason,
                    step,
                    self._config.good_every,
                    self._config.quiet_steps,
                )
            return False
        if not self._guard.allows(step):
            self._stop(run_context, step, reason)
            return False
        state = self._states.restore_newest()
        self._take_in(self._states.finished())  # the write it waited for
        if state is None:
            logger.warning(
                "ms_exporter: rollback: %s at step %d, but none of the good states kept can be read back "
                "(the log above says why); training goes on",
                reason,
                step,
            )
            return False
        self._last_good.value = state.step  # an older one when the newest could not be read back
        self._health.restart()
        for follower in self._followers:
            follower.on_rollback(state.step)
        self._guard.record(step)
        lost = step - state.step
        batches = [
            {**identity, "reason": reason, "rolled_back_at": step, "good_step": state.step}
            for _, identity in self._since_good
        ]
        self._since_good.clear()
        # The rollback happened: it is counted and announced whether or not its batches can be listed.
        self._counts["rollback"].value += 1
        self._lost.value += lost
        details: dict[str, Any] = {
            "reason": reason,
            "good_step": state.step,
            "steps_lost": lost,
            "batches_listed": len(batches),
        }
        try:
            listed = f"{len(batches)} batches listed in {self._skipped.path} ({self._skipped.append(batches)} in all)"
        except Exception as exc:
            self._parts.absorb("rollback.list", exc)
            details.update(batches_listed=0, list_error=repr(exc))
            listed = (
                f"its {len(batches)} batches (steps {batches[0]['step'] if batches else '-'} to {step}) could "
                f"not be listed in {self._skipped.path}: {exc!r}"
            )
        shown = loss if loss is None or math.isfinite(loss) else str(loss)
        logger.warning(
            "ms_exporter: rollback at step %d (%s, loss %s): restored the good state of step %d, %d steps lost; %s",
            step,
            reason,
            shown,
            state.step,
            lost,
            listed,
        )
        self._announce(step, "rollback", details)
        return True

    def _stop(self, run_context: Any, step: int, reason: str) -> None:
        self._stopped = True
        run_context.request_stop()
        self._counts["rollback_stop"].value += 1
        why = (
            f"{reason} at step {step} after {self._guard.recent} rollbacks within {self._config.window_steps} "
            f"steps (actions.rollback.max_rollbacks {self._config.max_rollbacks})"
        )
        logger.error(
            "ms_exporter: rollback_stop: %s; training stops after this step: the divergence comes back "
            "(docs/alerts.md#mindsporetrainingrollbackloop)",
            why,
        )
        self._announce(step, "rollback_stop", {"reason": why})

    def close(self) -> None:
        self._states.close()
