"""The Overview row: where the job is, how long it has left, how many ranks report, how many alerts fire."""

from __future__ import annotations

from ms_exporter.core import catalogue as c
from ms_exporter.generate.panels.panel import RATE, SELECTOR, Row, Stat

ROW = Row(
    "Overview",
    (
        Stat("Global step", "none", f"max({c.GLOBAL_STEP.name}{{{SELECTOR}}})", width=4, height=4),
        Stat(
            "ETA",
            "s",
            f"(max({c.PLANNED_STEPS.name}{{{SELECTOR}}}) - max({c.GLOBAL_STEP.name}{{{SELECTOR}}}))"
            f" / clamp_min(avg(rate({c.STEPS.name}{{{SELECTOR}}}[{RATE}])), 1e-9)",
            width=4,
            height=4,
            description="Time left in the current Model.train call at the current step rate.",
        ),
        Stat(
            "Last step age",
            "s",
            f"max(time() - {c.LAST_STEP_TIMESTAMP.name}{{{SELECTOR}}})",
            width=4,
            height=4,
            description="Seconds since the slowest rank finished a step.",
        ),
        Stat("Ranks reporting", "none", f"count({c.INFO.name}{{{SELECTOR}}})", width=4, height=4),
        Stat("World size", "none", f"max({c.WORLD_SIZE.name}{{{SELECTOR}}})", width=4, height=4),
        Stat(
            "Alerts firing",
            "none",
            'count(ALERTS{alertstate="firing", project=~"$project"}) or vector(0)',
            width=4,
            height=4,
        ),
    ),
)
