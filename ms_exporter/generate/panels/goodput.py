"""The Goodput row: where the ranks' time goes, the job's goodput against the GoodputLow line, restarts, the
checkpoint interval advised from the run's failures and what fail-slows cost."""

from __future__ import annotations

from ms_exporter.core import catalogue as c
from ms_exporter.core.thresholds import Thresholds
from ms_exporter.generate.panels.panel import RATE, SELECTOR, Query, Row, Stat, TimeSeries

_SPENT = f"sum by (bucket) (rate({c.TIME_SECONDS.name}{{{SELECTOR}}}[{RATE}]))"


def row(t: Thresholds) -> Row:
    return Row(
        "Goodput",
        (
            TimeSeries(
                "Where the time goes",
                "percentunit",
                (
                    Query(
                        f"{_SPENT} / ignoring (bucket) group_left () sum(rate({c.TIME_SECONDS.name}{{{SELECTOR}}}"
                        f"[{RATE}]))",
                        "{{bucket}}",
                    ),
                ),
                width=12,
                height=8,
                description="Each bucket's share of the selected ranks' wall time (docs/goodput.md): productive is "
                "the steps that advance training; redo is steps done again after a restart.",
                stacked=True,
            ),
            TimeSeries(
                "Goodput",
                "percentunit",
                (
                    Query(f'{c.PROJECT_GOODPUT_1H}{{project=~"$project"}}', "last hour {{project}}"),
                    Query(f'{c.PROJECT_GOODPUT_24H}{{project=~"$project"}}', "last day {{project}}"),
                ),
                width=6,
                height=8,
                description="Productive time over all time of every rank, from the run's totals (across restarts).",
                below=t.goodput_low,
            ),
            Stat(
                "Restarts",
                "none",
                f"max({c.RESTARTS.name}{{{SELECTOR}}})",
                width=3,
                height=4,
                description="Processes of this run that came before the current ones (crashes and restarts).",
            ),
            Stat(
                "Run goodput so far",
                "percentunit",
                f'sum({c.RUN_TIME_SECONDS.name}{{{SELECTOR}, bucket="{c.PRODUCTIVE}"}})'
                f" / sum({c.RUN_TIME_SECONDS.name}{{{SELECTOR}}})",
                width=3,
                height=4,
                description="Productive time over all time of the whole run so far, every process of it.",
            ),
            TimeSeries(
                "Checkpoint interval: advised and current",
                "s",
                (
                    Query(
                        f'max by (project) ({c.CHECKPOINT_INTERVAL_ADVISED.name}{{{SELECTOR}, bound="best"}})',
                        "advised {{project}}",
                    ),
                    Query(
                        f'max by (project) ({c.CHECKPOINT_INTERVAL_ADVISED.name}{{{SELECTOR}, bound="low"}})',
                        "advised, 90% low {{project}}",
                    ),
                    Query(
                        f'max by (project) ({c.CHECKPOINT_INTERVAL_ADVISED.name}{{{SELECTOR}, bound="high"}})',
                        "advised, 90% high {{project}}",
                    ),
                    Query(f"max by (project) ({c.CHECKPOINT_INTERVAL.name}{{{SELECTOR}}})", "current {{project}}"),
                ),
                width=12,
                height=8,
                description="The checkpoint interval of highest expected goodput from the run's own failures, save "
                "time and failure cost (docs/failslow.md#checkpoint-interval), its range over the MTBF's 90% "
                "interval, and the interval the run saves at. Appears once the run has restarted and saved.",
            ),
            TimeSeries(
                "Goodput the checkpoint interval loses",
                "percentunit",
                (
                    Query(
                        f"max by (project) ({c.CHECKPOINT_GOODPUT_LOSS.name}{{{SELECTOR}}})",
                        "current interval {{project}}",
                    ),
                    Query(
                        f"sum by (project) (rate({c.FAILSLOW_SECONDS.name}{{{SELECTOR}}}[{RATE}]))"
                        f" / sum by (project) (rate({c.TIME_SECONDS.name}{{{SELECTOR}}}[{RATE}]))",
                        "fail-slow {{project}}",
                    ),
                ),
                width=12,
                height=8,
                description="The share of wall time the current checkpoint interval loses against the advised one "
                "(Daly's model), and the share the ranks' flagged fail-slows added to their steps (docs/failslow.md).",
            ),
        ),
    )
