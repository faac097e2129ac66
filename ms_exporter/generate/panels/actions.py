"""The Actions row: what monitor_config.actions did to the run, the rollbacks and the health score they keep."""

from __future__ import annotations

from ms_exporter.core import catalogue as c
from ms_exporter.generate.panels.panel import RATE, SELECTOR, Query, Row, TimeSeries

ROW = Row(
    "Actions",
    (
        TimeSeries(
            "Actions the monitor took",
            "none",
            (
                Query(f"increase({c.ACTIONS_TAKEN.name}{{{SELECTOR}}}[{RATE}])", "{{action}} rank {{rank}}"),
                Query(f"{c.LR_BACKOFF_FACTOR.name}{{{SELECTOR}}}", "LR scale rank {{rank}}"),
            ),
            width=10,
            height=7,
            description="monitor_config.actions: early stops, learning-rate back-offs (and the scale now on the LR), "
            f"anomaly snapshots ({c.LAST_SNAPSHOT_STEP.name} says which step is on disk), rollbacks.",
        ),
        TimeSeries(
            "Rollbacks and steps lost",
            "none",
            (
                Query(
                    f'increase({c.ACTIONS_TAKEN.name}{{{SELECTOR},action=~"rollback|rollback_stop"}}[{RATE}])',
                    "{{action}} rank {{rank}}",
                ),
                Query(f"increase({c.ROLLBACK_LOST_STEPS.name}{{{SELECTOR}}}[{RATE}])", "steps lost rank {{rank}}"),
            ),
            width=7,
            height=7,
            description="actions.rollback: divergences rolled back to the last good state, the steps each undid, and "
            "a stop by the loop guard (docs/rollback.md).",
        ),
        TimeSeries(
            "Health score and last good step",
            "none",
            (
                Query(f"{c.HEALTH_SCORE.name}{{{SELECTOR}}}", "health rank {{rank}}"),
                Query(
                    f"{c.GLOBAL_STEP.name}{{{SELECTOR}}} - {c.LAST_GOOD_STEP.name}{{{SELECTOR}}}",
                    "steps since the good state rank {{rank}}",
                ),
            ),
            width=7,
            height=7,
            description="0 to 1: the worst of the smoothed-loss trend, gradient norm and memory growth terms; a good "
            "state is kept at or above actions.rollback.min_health. Steps since the good state: what a rollback now "
            "would undo.",
        ),
    ),
)
