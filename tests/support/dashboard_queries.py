"""The dashboard's queries as a test evaluates them against a real Prometheus: its variables filled in."""

from __future__ import annotations

from collections.abc import Callable, Collection
from typing import Any

from ms_exporter.generate.dashboard import queries, render_dashboard

# Panels whose series only some runs have, each evaluated by the test that makes them.
ADVISOR_PANELS = ("Checkpoint interval: advised and current", "Goodput the checkpoint interval loses")
FAILSLOW_PANEL = "Fail-slow: flagged ranks and their onset step"


def concrete(expr: str, project: str) -> str:
    """`expr` with the dashboard's variables set: this project, every rank, a 10 s rate window."""
    return expr.replace("$project", project).replace("$rank", ".*").replace("$__rate_interval", "10s")


def without_data(
    query: Callable[[str], list[Any]], project: str, titles: Collection[str] | None = None, skip: Collection[str] = ()
) -> list[str]:
    """Each query of the panels named in `titles` (every panel but `skip` when None) that returns nothing for
    `project`, as "title: expression"."""
    empty = []
    for title, expr in queries(render_dashboard()):
        if title in skip or (titles is not None and title not in titles):
            continue
        filled = concrete(expr, project)
        if not query(filled):
            empty.append(f"{title}: {filled}")
    return empty
