"""The decisions behind monitor_config.actions: pure state machines, no MindSpore, no I/O.

Each machine is fed one observation at a time and answers what to do; the action runner carries it out
(ms_exporter/actions/runner.py) and counts it. Keeping the decisions here keeps them deterministic and unit-testable.

EarlyStop      WATCHING --(no improvement > min_delta for `patience` evaluations)--> STOPPED
               WATCHING --(`max_nonfinite` non-finite losses in a row)------------> STOPPED
LrBackoff      READY --(loss rose `rising_steps` steps in a row, or grad norm over threshold)--> COOLING
               (the LR scale is multiplied by `factor`, not below min_lr / base LR)
               COOLING --(`cooldown` steps)--> READY;  a scale at its floor stays there (FLOOR)
AnomalyEpisodes QUIET --(an anomaly)--> IN_EPISODE (a snapshot is due on this transition only)
               IN_EPISODE --(`quiet_steps` steps without anomaly)--> QUIET
"""

from __future__ import annotations

import math
from dataclasses import dataclass


class EarlyStop:
    """Counts evaluations without improvement of the smoothed loss; patience survives epoch boundaries."""

    def __init__(self, patience: int, min_delta: float, max_nonfinite: int | None) -> None:
        self.patience = patience
        self.min_delta = min_delta
        self.max_nonfinite = max_nonfinite
        self.best = math.inf
        self.waited = 0
        self.nonfinite_run = 0
        self.stopped: str | None = None  # the reason, once stopped

    def evaluate(self, smoothed_loss: float) -> str | None:
        """One evaluation (a step or an epoch end, as configured). Returns the reason when training should stop."""
        if self.stopped or not math.isfinite(smoothed_loss):
            return None
        if smoothed_loss < self.best - self.min_delta:
            self.best = smoothed_loss
            self.waited = 0
            return None
        self.waited += 1
        if self.waited >= self.patience:
            self.stopped = (
                f"the smoothed loss has not improved by more than {self.min_delta:g} on "
                f"{self.best:.6g} for {self.waited} evaluations"
            )
        return self.stopped

    def step(self, loss: float | None) -> str | None:
        """Every step: a run of non-finite losses stops at once, whatever the patience."""
        if self.stopped or self.max_nonfinite is None:
            return None
        if loss is not None and not math.isfinite(loss):
            self.nonfinite_run += 1
            if self.nonfinite_run >= self.max_nonfinite:
                self.stopped = f"{self.nonfinite_run} non-finite losses in a row"
                return self.stopped
        else:
            self.nonfinite_run = 0
        return None


@dataclass
class Backoff:
    """What LrBackoff decided: the new scale of the learning rate and why."""

    scale: float
    reason: str


class LrBackoff:
    """Multiplies a learning-rate scale by `factor` on trouble, at most once per `cooldown` steps."""

    def __init__(self, factor: float, rising_steps: int, cooldown: int, min_scale: float) -> None:
        self.factor = factor
        self.rising_steps = rising_steps
        self.cooldown = cooldown
        self.min_scale = min_scale  # min_lr / base LR: the scale never goes below it
        self.scale = 1.0
        self.ready_at = 0  # the first step at which another back-off may happen

    @property
    def at_floor(self) -> bool:
        return self.scale <= self.min_scale

    def observe(self, step: int, rising: int, grad_norm_breach: bool) -> Backoff | None:
        if step < self.ready_at or self.at_floor:
            return None
        if rising >= self.rising_steps:
            reason = f"the loss rose {rising} steps in a row"
        elif grad_norm_breach:
            reason = "the gradient norm is over its threshold"
        else:
            return None
        self.scale = max(self.scale * self.factor, self.min_scale)
        self.ready_at = step + self.cooldown
        return Backoff(self.scale, reason)


class AnomalyEpisodes:
    """An episode starts at the first anomaly and ends after `quiet_steps` steps without one."""

    def __init__(self, quiet_steps: int) -> None:
        self.quiet_steps = quiet_steps
        self.in_episode = False
        self.last_anomaly_step = -1

    def observe(self, step: int, anomaly: str | None) -> str | None:
        """Returns the anomaly when it opens a new episode (the moment to snapshot), else None."""
        if anomaly is None:
            if self.in_episode and step - self.last_anomaly_step >= self.quiet_steps:
                self.in_episode = False
            return None
        self.last_anomaly_step = step
        if self.in_episode:
            return None
        self.in_episode = True
        return anomaly


def anomaly_of(
    loss: float | None,
    smoothed: float | None,
    spike_factor: float,
    grad_norm: float | None,
    grad_threshold: float | None,
) -> str | None:
    """The anomaly a step shows, if any: a non-finite loss, a loss spike, or a gradient norm over threshold."""
    if loss is not None and not math.isfinite(loss):
        return "nonfinite_loss"
    if (
        loss is not None
        and smoothed is not None
        and math.isfinite(smoothed)
        and smoothed > 0
        and loss > spike_factor * smoothed
    ):
        return "loss_spike"
    if grad_norm is not None and grad_threshold is not None and grad_norm > grad_threshold:
        return "grad_norm"
    return None
