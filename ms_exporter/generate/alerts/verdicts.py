"""A verdict record (ms_exporter/core/verdicts.py) as the PromQL of its alert rule: the same comparisons `top` runs in
Python, with the same thresholds."""

from __future__ import annotations

from ms_exporter.core.thresholds import Thresholds
from ms_exporter.core.verdicts import Over, Verdict
from ms_exporter.generate.alerts.alert import number


def promql(verdict: Verdict, thresholds: Thresholds) -> str:
    """Any clause, each all of its comparisons: a clause of several is parenthesised, as is each clause of several."""
    clauses = []
    for clause in verdict.clauses:
        parts = [_comparison(over, thresholds) for over in clause]
        clauses.append(" and ".join(f"({part})" for part in parts) if len(parts) > 1 else parts[0])
    return " or ".join(f"({clause})" for clause in clauses) if len(clauses) > 1 else clauses[0]


def _comparison(over: Over, thresholds: Thresholds) -> str:
    op = ">=" if over.inclusive else ">"
    bound = number(float(getattr(thresholds, over.threshold)))
    if over.scale is None:
        return f"{over.quantity} {op} {bound}"
    if over.scale_of_project:
        return f"{over.quantity} {op} on (project) group_left () ({bound} * {over.scale})"
    return f"{over.quantity} {op} {bound} * {over.scale}"
