"""Carries out what ms_exporter.actions.decisions decides: stop the run, scale the learning rate, save a snapshot;
and runs actions.rollback (ms_exporter.actions.rollback).

| name | type | labels | unit |
|---|---|---|---|
| mindspore_train_actions_total | counter | action (early_stop, lr_backoff, snapshot, rollback[_stop]) | actions |
| mindspore_train_lr_backoff_factor | gauge | | the scale on the optimizer's LR (1 = untouched) |
| mindspore_train_last_snapshot_step | gauge | | step of the newest snapshot on disk |

Each action is a part that fails alone (ms_exporter.actions.parts): nothing here raises into the callback, and a
part that fails 3 times in a row is switched off while the others go on.
"""

from __future__ import annotations

import json
import logging
import math
import time
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ms_exporter.actions.decisions import AnomalyEpisodes, EarlyStop, LrBackoff, anomaly_of
from ms_exporter.actions.parts import PartFailures
from ms_exporter.actions.rollback import Announce, Rollback, StateFollower
from ms_exporter.config import MonitorConfig
from ms_exporter.config.alert_thresholds import thresholds_of
from ms_exporter.config.run_identity import run_id_of
from ms_exporter.core import catalogue
from ms_exporter.core.cb_params import network_of, optimizer_of
from ms_exporter.core.files.safe_files import make_dir, replace_file
from ms_exporter.core.part import Part
from ms_exporter.core.ranks import RankInfo
from ms_exporter.core.sample import StepSample
from ms_exporter.core.store import MetricStore
from ms_exporter.probes.learning_rate import LearningRateProbe

if TYPE_CHECKING:
    from ms_exporter.actions.lr_scale import LrScaler

logger = logging.getLogger("ms_exporter")

SNAPSHOT_DIR = "snapshots"
_SECTION_OF = {"rollback_stop": "rollback"}  # an action counted under another one's config section
PARTS = ("early_stop", "lr_backoff", "snapshot", "rollback")


def _unheard(step: int, action: str, details: dict[str, Any]) -> None:
    """Where events go when nobody listens (an ActionRunner built without a monitor, in tests)."""


class ActionRunner(Part):
    """One per monitor, only when some action is enabled; runs on the training thread after the probes."""

    name = "actions"

    def __init__(
        self,
        config: MonitorConfig,
        store: MetricStore,
        rank: RankInfo | None = None,
        announce: Announce | None = None,
        followers: Sequence[StateFollower] = (),
    ) -> None:
        actions = config.actions
        self._config = actions
        self._store = store
        self._grad_threshold = config.grad_norm.threshold if config.grad_norm.enable else None
        self._snapshot_dir = Path(config.save_dir) / SNAPSHOT_DIR
        self._announce = announce or _unheard
        family = store.register(catalogue.ACTIONS_TAKEN)
        self._counts = {
            name: family.series(action=name)
            for name in catalogue.ACTIONS
            if getattr(actions, _SECTION_OF.get(name, name)).enable
        }
        self._parts = PartFailures(store, [part for part in PARTS if getattr(actions, part).enable])
        self._calls = 0  # act() calls: the index by which failures in a row are judged
        self._snapshot_calls = 0
        self._rollback: Rollback | None = None
        if actions.rollback.enable:
            limits = thresholds_of(config)
            rank = rank or RankInfo(0, 0, 1, "")
            run_id = run_id_of(config)
            self._rollback = Rollback(
                actions.rollback,
                store,
                Path(config.save_dir),
                limits.grad_norm_high,
                limits.grad_norm_exploding,
                limits.memory_growth_ratio,
                rank.rank,
                rank.world_size,
                self._counts,
                announce or _unheard,
                config.warmup_steps,
                followers,
                self._parts,
                run_id,
            )
        self._factor = None
        if actions.lr_backoff.enable:
            self._factor = store.register(catalogue.LR_BACKOFF_FACTOR).series()
            self._factor.value = 1.0
        self._last_snapshot = store.register(catalogue.LAST_SNAPSHOT_STEP)
        early = actions.early_stop
        self._early = EarlyStop(early.patience, early.min_delta, early.max_nonfinite) if early.enable else None
        backoff = actions.lr_backoff
        self._backoff = (
            LrBackoff(backoff.factor, backoff.rising_steps, backoff.cooldown, 0.0) if backoff.enable else None
        )
        self._episodes = AnomalyEpisodes(actions.snapshot.quiet_steps) if actions.snapshot.enable else None
        self._scaler: LrScaler | None = None
        # lr_backoff reports the LR it set through the learning-rate probe, when that probe is on.
        self._lr_probe = next((f for f in followers if isinstance(f, LearningRateProbe)), None)
        self._network: Any = None
        self._previous_smoothed: float | None = None
        self._world_size = rank.world_size if rank is not None else 1
        self._loss_shared = actions.shared_loss
        self._said_unshared = False

    # -- lifecycle ----------------------------------------------------------------------------------------------
    def on_train_begin(self, cb_params: Any) -> None:
        """Before the first step compiles: find the optimizer and, for lr_backoff, wrap a schedule; in a job of
        several ranks, have the train cell share its loss."""
        self._network = network_of(cb_params)
        self._share_the_loss()
        if self._backoff is not None and self._scaler is None:
            try:
                from ms_exporter.actions.lr_scale import LrScaler

                optimizer = optimizer_of(cb_params) or getattr(self._network, "optimizer", None)
                self._scaler = LrScaler(optimizer)
                if self._scaler.base_lrs and self._config.lr_backoff.min_lr > 0:
                    self._backoff.min_scale = self._config.lr_backoff.min_lr / min(self._scaler.base_lrs)
            except Exception as exc:  # lr_backoff cannot reach the optimizer: it alone is off
                self._set_up_failed("lr_backoff", exc)
        if self._rollback is not None:
            try:
                self._rollback.on_train_begin(cb_params)
            except Exception as exc:
                self._set_up_failed("rollback", exc)

    def _share_the_loss(self) -> None:
        """Every rank must take the same decisions (a rank that stops alone leaves the others waiting in their next
        collective; one that backs off or rolls back alone leaves its replicas), so in a job of more than one rank
        the actions that read the loss must read the same loss on every rank. GradNormTrainOneStepCell averages
        its loss over the replicas once asked; any other train cell returns this rank's own loss, and a loop hands
        what it has: said once, with what keeps the ranks together."""
        readers = [
            name
            for name, section in (
                ("early_stop", self._config.early_stop),
                ("lr_backoff", self._config.lr_backoff),
                ("rollback", self._config.rollback),
            )
            if section.enable
        ]
        if self._world_size <= 1 or not readers or self._loss_shared or self._said_unshared:
            return
        share = getattr(self._network, "share_loss", None)
        if callable(share) and share():
            self._loss_shared = True
            return
        self._said_unshared = True
        logger.warning(
            "ms_exporter: %s decide from the loss, and in this job of %d ranks the train cell hands each rank its "
            "own loss (of its own batch): a rank may then stop, back off its learning rate or roll back alone, "
            "leaving the others waiting in their next collective or apart from its weights. Train with "
            "ms_exporter.GradNormTrainOneStepCell (it averages the loss over the replicas), or hand the monitor the "
            "loss averaged over the replicas and set actions.shared_loss: true (docs/rollback.md#in-a-job-of-"
            "several-ranks)",
            ", ".join(f"actions.{name}" for name in readers),
            self._world_size,
        )

    # -- every step ---------------------------------------------------------------------------------------------
    def act(self, sample: StepSample, run_context: Any) -> None:
        """One published step: the actions' triggers, and what they do to the run (run_context.request_stop)."""
        # What the probes measured (NaN while not measured, or with their group off: then that trigger never fires).
        store = self._store
        self._calls += 1
        smoothed = store.value_of(catalogue.LOSS_SMOOTHED)
        grad_norm = store.value_of(catalogue.GRAD_NORM)
        grad_breach = self._grad_threshold is not None and math.isfinite(grad_norm) and grad_norm > self._grad_threshold
        if self._early is not None:
            self._part("early_stop", self._calls, self._early_stop_step, sample, run_context, smoothed)
        if self._backoff is not None and self._scaler is not None:
            self._part("lr_backoff", self._calls, self._lr_backoff_step, sample, grad_breach)
        if self._episodes is not None:
            self._part("snapshot", self._calls, self._snapshot_step, sample, grad_norm, grad_breach)
        if self._rollback is not None:
            before = self._previous_smoothed if self._previous_smoothed is not None else math.nan
            if self._part("rollback", self._calls, self._rollback.on_step, sample, run_context, before):
                smoothed = store.value_of(catalogue.LOSS_SMOOTHED)  # taken back with the state
        self._previous_smoothed = smoothed if math.isfinite(smoothed) else self._previous_smoothed

    def _early_stop_step(self, sample: StepSample, run_context: Any, smoothed: float) -> None:
        assert self._early is not None
        reason = self._early.step(sample.loss)
        if reason is None and self._config.early_stop.unit == "step":
            reason = self._early.evaluate(smoothed)
        if reason is not None:
            self._stop(run_context, sample.step, reason)

    def _lr_backoff_step(self, sample: StepSample, grad_breach: bool) -> None:
        assert self._backoff is not None
        rising_value = self._store.value_of(catalogue.LOSS_RISING)
        rising = int(rising_value) if math.isfinite(rising_value) else 0
        self._update_floor()
        decision = self._backoff.observe(sample.step, rising, grad_breach and self._config.lr_backoff.on_grad_norm)
        if decision is not None:
            self._scale_lr(sample.step, decision.scale, decision.reason)

    def _snapshot_step(self, sample: StepSample, grad_norm: float, grad_breach: bool) -> None:
        assert self._episodes is not None
        anomaly = anomaly_of(
            sample.loss,
            self._previous_smoothed,
            self._config.snapshot.spike_factor,
            grad_norm if grad_breach else None,
            self._grad_threshold,
        )
        opened = self._episodes.observe(sample.step, anomaly)
        if opened is not None:
            self._snapshot_calls += 1  # snapshots are rare: failures in a row are judged by their own count
            self._part("snapshot", self._snapshot_calls, self._snapshot, sample.step, opened, sample.loss)

    def on_epoch_end(self, run_context: Any, step: int) -> None:
        if self._early is not None and self._config.early_stop.unit == "epoch":
            self._part("early_stop", self._calls, self._early_stop_epoch, run_context, step)

    def _early_stop_epoch(self, run_context: Any, step: int) -> None:
        if self._early is not None and self._store.series_of(catalogue.LOSS_SMOOTHED):
            reason = self._early.evaluate(self._store.value_of(catalogue.LOSS_SMOOTHED))
            if reason is not None:
                self._stop(run_context, step, reason)

    # -- parts that fail alone ----------------------------------------------------------------------------------
    def _part(self, part: str, index: int, func: Any, *args: Any) -> Any:
        """`func(*args)`, whose failure counts against `part` alone (switched off after 3 in a row)."""
        try:
            return func(*args)
        except Exception as exc:
            if self._parts.failed(part, exc, index, self._off_means(part)):
                self._switch_off(part)
            return None

    def _set_up_failed(self, part: str, exc: BaseException) -> None:
        """A part that cannot set itself up is off at once (a rollback that binds no network would restore
        nothing; a back-off without its optimizer would scale nothing)."""
        self._parts.absorb(part, exc)
        self._parts.switched_off(part)
        self._switch_off(part)
        logger.error("ms_exporter: %s could not start (%r): %s", part, exc, self._off_means(part))

    def _off_means(self, part: str) -> str:
        if part == "lr_backoff":
            scale = self._backoff.scale if self._backoff is not None else 1.0
            return f"LR back-off is off: the learning rate stays at {scale:.4g} times its configured value"
        return {
            "early_stop": "early stop is off",
            "snapshot": "snapshots are off",
            "rollback": "rollback is off: a divergence is no longer undone",
        }[part]

    def _switch_off(self, part: str) -> None:
        if part == "early_stop":
            self._early = None
        elif part == "lr_backoff":
            self._backoff = None
        elif part == "snapshot":
            self._episodes = None
        elif part == "rollback":
            self._rollback = None

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
            try:
                self._rollback.close()
            except Exception as exc:
                self._parts.absorb("rollback", exc)

    # -- effects ------------------------------------------------------------------------------------------------
    def _stop(self, run_context: Any, step: int, reason: str) -> None:
        run_context.request_stop()
        self._counts["early_stop"].value += 1
        logger.warning("ms_exporter: early_stop at step %d: %s; training stops after this step", step, reason)
        # The run's records say it was stopped on purpose: `ms-exporter triage` and `report` read this event, and
        # without it a run cut short by early stop reads as one that failed.
        self._announce(step, "early_stop", {"reason": reason})

    def _scale_lr(self, step: int, scale: float, reason: str) -> None:
        if self._scaler is not None:
            self._scaler.apply(scale)
        if self._lr_probe is not None:
            self._lr_probe.set_scale(scale)
        if self._factor is not None:
            self._factor.value = scale
        self._counts["lr_backoff"].value += 1
        floor = " (its floor: no further back-off)" if self._backoff is not None and self._backoff.at_floor else ""
        logger.warning(
            "ms_exporter: lr_backoff at step %d: %s; the learning rate is now %.4g times its configured value%s",
            step,
            reason,
            scale,
            floor,
        )

    def _snapshot(self, step: int, reason: str, loss: float | None) -> None:
        import mindspore

        if self._network is None:
            raise RuntimeError("no train network in cb_params to snapshot")
        make_dir(self._snapshot_dir)
        # The hook runs after the step's update: what can be saved is the state after the anomaly.
        stem = f"snapshot-step{step:09d}-{reason}-post-anomaly"
        mindspore.save_checkpoint(self._network, str(self._snapshot_dir / f"{stem}.ckpt"))
        replace_file(
            self._snapshot_dir / f"{stem}.json",
            (
                json.dumps(
                    {
                        "step": step,
                        "reason": reason,
                        "state": "post-anomaly",
                        "time": time.time(),
                        "loss": loss if loss is not None and math.isfinite(loss) else str(loss),
                        "smoothed_loss_before": self._previous_smoothed,
                    },
                    indent=1,
                )
                + "\n"
            ).encode(),
        )
        self._prune()
        self._last_snapshot.series().value = step
        self._counts["snapshot"].value += 1
        logger.warning("ms_exporter: snapshot at step %d (%s): %s", step, reason, self._snapshot_dir / f"{stem}.ckpt")

    def _prune(self) -> None:
        snapshots = sorted(self._snapshot_dir.glob("snapshot-step*.ckpt"))
        for old in snapshots[: max(0, len(snapshots) - self._config.snapshot.max_snapshots)]:
            old.unlink(missing_ok=True)
            old.with_suffix(".json").unlink(missing_ok=True)
