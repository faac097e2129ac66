"""The recording rules as records: per-rank means and per-project sums, medians and ratios that the alerts and the
dashboard read by name (core/catalogue.py names them)."""

from __future__ import annotations

from dataclasses import dataclass

from ms_exporter.core import catalogue as c
from ms_exporter.generate.timing import Timing


@dataclass(frozen=True)
class Recording:
    record: str
    expr: str


def recording_rules(w: Timing) -> tuple[Recording, ...]:
    """Every recording rule, in the order the rules file lists them."""
    step_mean, wait_mean, cycle_mean = c.RANK_STEP_MEAN, c.RANK_WAIT_MEAN, c.RANK_CYCLE_MEAN
    return (
        Recording(c.PROJECT_LOSS_MEAN, f"avg by (project) ({c.LOSS.name})"),
        Recording(c.PROJECT_LOSS_MIN, f"min by (project) ({c.LOSS.name})"),
        Recording(c.PROJECT_LOSS_MAX, f"max by (project) ({c.LOSS.name})"),
        Recording(c.PROJECT_TOKENS_PER_SECOND, f"sum by (project) ({c.TOKENS_PER_SECOND.name})"),
        Recording(c.PROJECT_SAMPLES_PER_SECOND, f"sum by (project) ({c.SAMPLES_PER_SECOND.name})"),
        Recording(
            step_mean,
            f"rate({c.STEP_DURATION.sum}[{w.rate_window}]) / rate({c.STEP_DURATION.count}[{w.rate_window}])",
        ),
        Recording(c.PROJECT_STEP_MAX, f"max by (project) ({step_mean})"),
        Recording(c.PROJECT_STEP_MEDIAN, f"quantile by (project) (0.5, {step_mean})"),
        Recording(c.PROJECT_RANKS_REPORTING, f"count by (project) ({c.INFO.name})"),
        # Per step, not per wait: in sink mode one wait covers a whole sink of steps.
        Recording(
            wait_mean, f"rate({c.DATA_WAIT.sum}[{w.rate_window}]) / rate({c.STEP_DURATION.count}[{w.rate_window}])"
        ),
        # Step plus data wait: a rank's whole time per step. Equal on every rank of a synchronous job.
        Recording(cycle_mean, f"{step_mean} + {wait_mean}"),
        Recording(c.PROJECT_WAIT_MEDIAN, f"quantile by (project) (0.5, {wait_mean})"),
        Recording(c.PROJECT_CYCLE_MEDIAN, f"quantile by (project) (0.5, {cycle_mean})"),
        # From the run's totals, which go on across a restart where the process's own counters start again: the
        # time between a process's last scrape and its end, and the next one's start, is in the next reading.
        Recording(c.PROJECT_GOODPUT_1H, _goodput("1h")),
        Recording(c.PROJECT_GOODPUT_24H, _goodput("24h")),
        Recording(c.RANK_REPLICAS_AGREEING, _agreeing()),
        Recording(c.PROJECT_MODEL_FLOPS, f"sum by (project) ({c.MODEL_FLOPS_PER_SECOND.name})"),
        # The job's MFU: the model FLOPs of the ranks that know their peak, over the sum of those peaks.
        Recording(
            c.PROJECT_MFU,
            f"sum by (project) ({c.MODEL_FLOPS_PER_SECOND.name} and on (job, instance) {c.MFU.name})"
            f" / sum by (project) ({c.PEAK_FLOPS.name} and on (job, instance) {c.MFU.name})",
        ),
        Recording(c.PROJECT_MFU_MEAN, f"avg by (project) ({c.MFU.name})"),
    )


def _goodput(window: str) -> str:
    """A project's productive share of its run time over `window`."""
    return (
        f'sum by (project) (increase({c.RUN_TIME_SECONDS.name}{{bucket="{c.PRODUCTIVE}"}}[{window}]))'
        f" / sum by (project) (increase({c.RUN_TIME_SECONDS.name}[{window}]))"
    )


def _agreeing() -> str:
    """Per rank, the share of its replica group whose fingerprint equals its own, at the group's latest fingerprint
    step, and only while every rank of the group reports that step (a rank still at an earlier step is not
    compared with ranks past it). count_values turns the fingerprint into a label, so that ranks can be matched by
    it; the recorded series drop it again (a new value every comparison would be a new series)."""
    fingerprint, step = c.PARAM_FINGERPRINT.name, c.PARAM_FINGERPRINT_STEP.name
    group = "project, replica_group"
    at_latest = (
        f"({fingerprint} and on (job, instance) ({step} == on ({group}) group_left () max by ({group}) ({step})))"
    )
    compared = (
        f"({at_latest} and on ({group}) (count by ({group}) ({at_latest}) == count by ({group}) ({fingerprint})))"
    )
    return (
        f'sum without (fingerprint) (count_values without () ("fingerprint", {compared}) * on ({group}, '
        f'fingerprint) group_left () count_values by ({group}) ("fingerprint", {compared}))'
        f" / on ({group}) group_left () count by ({group}) ({compared})"
    )
