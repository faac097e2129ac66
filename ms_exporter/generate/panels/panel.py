"""The dashboard's panels as records, one kind of record per kind of panel, and what their queries share: the
selector of the dashboard's variables and the rate interval. generate/dashboard.py builds them with the Grafana
Foundation SDK."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Union

# Every per-rank query is limited to the dashboard's `project` and `rank` variables.
SELECTOR = 'project=~"$project", rank=~"$rank"'
RATE = "$__rate_interval"


@dataclass(frozen=True)
class Query:
    expr: str
    legend: str


@dataclass(frozen=True)
class TimeSeries:
    """A time series panel; `above`/`below` draw the alert threshold a value should stay under/over as a dashed
    line (the numbers from ms_exporter/core/thresholds.py); `stacked` fills the series one on top of the other."""

    title: str
    unit: str
    queries: tuple[Query, ...]
    width: int
    height: int
    description: str = ""
    above: float | None = None
    below: float | None = None
    stacked: bool = False


@dataclass(frozen=True)
class Stat:
    """One number: the last value of `expr`."""

    title: str
    unit: str
    expr: str
    width: int
    height: int
    description: str = ""


@dataclass(frozen=True)
class PhaseTimeline:
    """A state timeline of each rank's phase; a rank that stands out in a hang is the row of another colour."""

    title: str
    width: int
    height: int
    description: str = ""


# typing.Union: a module-level `|` of classes is evaluated at import, which Python 3.9 cannot do.
Panel = Union[TimeSeries, Stat, PhaseTimeline]


@dataclass(frozen=True)
class Row:
    """A titled row and its panels, left to right; every line of panels fills Grafana's 24 columns."""

    title: str
    panels: tuple[Panel, ...]
