"""One alerting rule as a record, and what the records' texts share: who a description names, how a number is
written."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

# Who and where, for every description; rank is missing only on `up`, which has the instance instead.
WHO = "rank {{ $labels.rank }} of project {{ $labels.project }}"


@dataclass(frozen=True)
class Alert:
    """An alert as docs/alerts.md documents it; generate/rules.py adds its runbook link (the section named after
    it) and limits its selectors to scraped series."""

    name: str
    expr: str
    for_: str
    severity: Literal["critical", "warning"]
    summary: str
    description: str


def number(value: float) -> str:
    """`value` as PromQL and the texts write it."""
    # Short where that is exact (1.5, 10), every digit where it is not: the rule compares with the very number the
    # Python verdicts (`ms-exporter top`) use, and 2**20 / 60 is not 17476.3.
    short = f"{value:g}"
    return short if float(short) == value else repr(float(value))
