"""The Hangs row: each rank's phase, its time in it against its deadline, hangs suspected and stack dumps."""

from __future__ import annotations

from ms_exporter.core import catalogue as c
from ms_exporter.generate.panels.panel import RATE, SELECTOR, PhaseTimeline, Query, Row, TimeSeries

ROW = Row(
    "Hangs",
    (
        PhaseTimeline(
            "Phase per rank",
            width=12,
            height=8,
            description="Where each rank is (docs/hangs.md). In a hang the ranks that wait sit in step, inside "
            "the collective; the rank they wait for is the row of another colour "
            "(MindSporeTrainingHang names it).",
        ),
        TimeSeries(
            "Time in phase and its deadline",
            "s",
            (
                Query(f"{c.PHASE_SECONDS.name}{{{SELECTOR}}}", "in phase rank {{rank}}"),
                Query(f"{c.HANG_DEADLINE.name}{{{SELECTOR}}}", "deadline rank {{rank}}"),
            ),
            width=6,
            height=8,
            description="A rank whose time in its phase crosses its deadline is stalled (MindSporeTrainingStalled); "
            "the deadline is learned from the run's own step cycles.",
        ),
        TimeSeries(
            "Hangs suspected and stack dumps",
            "none",
            (
                Query(f"{c.HANG_SUSPECTED.name}{{{SELECTOR}}}", "suspected rank {{rank}}"),
                Query(f"increase({c.HANG_DUMPS.name}{{{SELECTOR}}}[{RATE}])", "dumps rank {{rank}}"),
            ),
            width=6,
            height=8,
            description="1 while a rank is past its hang deadline; its stacks are in save_dir/hang-rank*.txt and at "
            "/debug/stacks on its endpoint.",
        ),
    ),
)
