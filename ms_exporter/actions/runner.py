"""Carries out what ms_exporter.actions.decisions decides: stop the run, scale the learning rate, save a snapshot;
and runs actions.rollback (ms_exporter.actions.rollback).

| name | type | labels | unit |
|---|---|---|---|
| mindspore_train_actions_total | counter | action (early_stop, lr_backoff, snapshot, rollback[_stop]) | actions |
| mindspore_train_lr_backoff_factor | gauge | | the scale on the optimizer's LR (1 = untouched) |
| mindspore_train_last_snapshot_step | gauge | | step of the newest snapshot on disk |
"""

from __future__ import annotations

import json
import logging
import math
import time
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ms_exporter import catalogue
from ms_exporter.actions.decisions import AnomalyEpisodes, EarlyStop, LrBackoff, anomaly_of
from ms_exporter.actions.rollback import Announce, Rollback, StateFollower
from ms_exporter.config import MonitorConfig
from ms_exporter.monitor.ranks import RankInfo
from ms_exporter.monitor.sample import StepSample
from ms_exporter.monitor.store import MetricStore
from ms_exporter.thresholds import Thresholds

if TYPE_CHECKING:
    from ms_exporter.actions.lr_scale import LrScaler
    from ms_exporter.probes.learning_rate import LearningRateProbe

logger = logging.getLogger("ms_exporter")

SNAPSHOT_DIR = "snapshots"
_SECTION_OF = {"rollback_stop": "rollback"}  # an action counted under another one's config section


def _unheard(step: int, action: str, details: dict[str, Any]) -> None:
    """Where events go when nobody listens (an ActionRunner built without a monitor, in tests)."""


class ActionRunner:
    """One per monitor, only when some action is enabled; runs on the training thread after the probes."""

    def __init__(self, config: MonitorConfig, store: MetricStore, rank: RankInfo | None = None,
                 announce: Announce | None = None, followers: Sequence[StateFollower] = ()) -> None:
        actions = config.actions
        self._config = actions
        self._store = store
        self._grad_threshold = config.grad_norm.threshold if config.grad_norm.enable else None
        self._snapshot_dir = Path(config.save_dir) / SNAPSHOT_DIR
        family = store.register(catalogue.ACTIONS_TAKEN)
        self._counts = {name: family.series(action=name) for name in catalogue.ACTIONS
                        if getattr(actions, _SECTION_OF.get(name, name)).enable}
        self._rollback: Rollback | None = None
        if actions.rollback.enable:
            limits = Thresholds.from_config(config)
            rank = rank or RankInfo(0, 0, 1, "")
            self._rollback = Rollback(actions.rollback, store, Path(config.save_dir), limits.grad_norm_high,
                                      limits.grad_norm_exploding, limits.memory_growth_ratio, rank.rank,
                                      rank.world_size, self._counts, announce or _unheard, config.warmup_steps,
                                      followers)
        self._factor = None
        if actions.lr_backoff.enable:
            self._factor = store.register(catalogue.LR_BACKOFF_FACTOR).series()
            self._factor.value = 1.0
        self._last_snapshot = store.register(catalogue.LAST_SNAPSHOT_STEP)
        early = actions.early_stop
        self._early = EarlyStop(early.patience, early.min_delta, early.max_nonfinite) if early.enable else None
        backoff = actions.lr_backoff
        self._backoff = LrBackoff(backoff.factor, backoff.rising_steps, backoff.cooldown, 0.0) \
            if backoff.enable else None
        self._episodes = AnomalyEpisodes(actions.snapshot.quiet_steps) if actions.snapshot.enable else None
        self._scaler: LrScaler | None = None
        self._lr_probe: LearningRateProbe | None = None
        self._network: Any = None
        self._previous_smoothed: float | None = None

    # -- lifecycle ----------------------------------------------------------------------------------------------
    def on_train_begin(self, cb_params: Any, lr_probe: LearningRateProbe | None) -> None:
        """Before the first step compiles: find the optimizer and, for lr_backoff, wrap a schedule."""
        self._network = cb_params.get("train_network") or cb_params.get("network")
        self._lr_probe = lr_probe
        if self._rollback is not None:
            self._rollback.on_train_begin(cb_params)
        if self._backoff is not None and self._scaler is None:
            from ms_exporter.actions.lr_scale import LrScaler

            optimizer = cb_params.get("optimizer") or getattr(self._network, "optimizer", None)
            self._scaler = LrScaler(optimizer)
            if self._scaler.base_lrs and self._config.lr_backoff.min_lr > 0:
                self._backoff.min_scale = self._config.lr_backoff.min_lr / min(self._scaler.base_lrs)

    # -- every step ---------------------------------------------------------------------------------------------
    def on_step(self, sample: StepSample, run_context: Any) -> None:
        # What the probes measured (NaN while not measured, or with their group off: then that trigger never fires).
        store = self._store
        loss = sample.loss
        smoothed = store.value_of(catalogue.LOSS_SMOOTHED)
        if self._early is not None:
            reason = self._early.step(loss)
            if reason is None and self._config.early_stop.unit == "step":
                reason = self._early.evaluate(smoothed)
            if reason is not None:
                self._stop(run_context, sample.step, reason)
        grad_norm = store.value_of(catalogue.GRAD_NORM)
        grad_breach = self._grad_threshold is not None and math.isfinite(grad_norm) and grad_norm > self._grad_threshold
        if self._backoff is not None and self._scaler is not None:
            rising_value = store.value_of(catalogue.LOSS_RISING)
            rising = int(rising_value) if math.isfinite(rising_value) else 0
            self._update_floor()
            decision = self._backoff.observe(sample.step, rising, grad_breach and self._config.lr_backoff.on_grad_norm)
            if decision is not None:
                self._scale_lr(sample.step, decision.scale, decision.reason)
        if self._episodes is not None:
            anomaly = anomaly_of(loss, self._previous_smoothed, self._config.snapshot.spike_factor,
                                 grad_norm if grad_breach else None, self._grad_threshold)
            opened = self._episodes.observe(sample.step, anomaly)
            if opened is not None:
                self._snapshot(sample.step, opened, loss)
        if self._rollback is not None:
            before = self._previous_smoothed if self._previous_smoothed is not None else math.nan
            if self._rollback.on_step(sample, run_context, before):
                smoothed = store.value_of(catalogue.LOSS_SMOOTHED)  # taken back with the state
        self._previous_smoothed = smoothed if math.isfinite(smoothed) else self._previous_smoothed

    def on_epoch_end(self, run_context: Any, step: int) -> None:
        smoothed = self._store.value_of(catalogue.LOSS_SMOOTHED)
        if self._early is not None and self._config.early_stop.unit == "epoch" and self._store.series_of(
                catalogue.LOSS_SMOOTHED):
            reason = self._early.evaluate(smoothed)
            if reason is not None:
                self._stop(run_context, step, reason)

    def _update_floor(self) -> None:
        """min_lr as a scale: against the fixed LR, or a schedule's current (unscaled) value."""
        min_lr = self._config.lr_backoff.min_lr
        if min_lr <= 0 or self._backoff is None or self._scaler is None or not self._scaler.wraps_schedule:
            return
        values = [series.value for series in self._store.series_of(catalogue.LEARNING_RATE)]
        current = min((v for v in values if math.isfinite(v) and v > 0), default=0.0)
        if current > 0:
            self._backoff.min_scale = min_lr / (current / self._backoff.scale)

    def close(self) -> None:
        if self._rollback is not None:
            self._rollback.close()

    # -- effects ------------------------------------------------------------------------------------------------
    def _stop(self, run_context: Any, step: int, reason: str) -> None:
        run_context.request_stop()
        self._counts["early_stop"].value += 1
        logger.warning("ms_exporter: early_stop at step %d: %s; training stops after this step", step, reason)

    def _scale_lr(self, step: int, scale: float, reason: str) -> None:
        if self._scaler is not None:
            self._scaler.apply(scale)
        if self._lr_probe is not None:
            self._lr_probe.set_scale(scale)
        if self._factor is not None:
            self._factor.value = scale
        self._counts["lr_backoff"].value += 1
        floor = " (its floor: no further back-off)" if self._backoff is not None and self._backoff.at_floor else ""
        logger.warning("ms_exporter: lr_backoff at step %d: %s; the learning rate is now %.4g times its "
                       "configured value%s", step, reason, scale, floor)

    def _snapshot(self, step: int, reason: str, loss: float | None) -> None:
        import mindspore

        if self._network is None:
            raise RuntimeError("no train network in cb_params to snapshot")
        self._snapshot_dir.mkdir(parents=True, exist_ok=True)
        # The hook runs after the step's update: what can be saved is the state after the anomaly.
        stem = f"snapshot-step{step:09d}-{reason}-post-anomaly"
        mindspore.save_checkpoint(self._network, str(self._snapshot_dir / f"{stem}.ckpt"))
        (self._snapshot_dir / f"{stem}.json").write_text(json.dumps({
            "step": step, "reason": reason, "state": "post-anomaly", "time": time.time(),
            "loss": loss if loss is not None and math.isfinite(loss) else str(loss),
            "smoothed_loss_before": self._previous_smoothed}, indent=1) + "\n")
        self._prune()
        self._last_snapshot.series().value = step
        self._counts["snapshot"].value += 1
        logger.warning("ms_exporter: snapshot at step %d (%s): %s", step, reason,
                       self._snapshot_dir / f"{stem}.ckpt")

    def _prune(self) -> None:
        snapshots = sorted(self._snapshot_dir.glob("snapshot-step*.ckpt"))
        for old in snapshots[: max(0, len(snapshots) - self._config.snapshot.max_snapshots)]:
            old.unlink(missing_ok=True)
            old.with_suffix(".json").unlink(missing_ok=True)
