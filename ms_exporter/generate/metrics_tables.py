"""docs/metrics.md's family tables, from the catalogue: each family's name, type, labels and unit as it is declared,
and when it is updated (and what sink mode changes) as its `row` says (core/catalogue.py). A table's marker names it
and the columns it shows besides the four and `updated` (`<!-- metrics: hardware; columns: group, sink mode -->` ...
`<!-- metrics:end -->`); `make generate` writes the rows, in the catalogue's order, and every family is in exactly
one table. The histogram-series table (`<!-- metrics: histogram series -->`) has each histogram's `_bucket`, `_sum`
and `_count` with what its row says they count and what of the rendered rules and dashboard reads them.

    python -m ms_exporter.generate.metrics_tables --docs docs/metrics.md
"""

from __future__ import annotations

import re
import sys
from collections.abc import Sequence
from typing import Any

from ms_exporter.core.catalogue import FAMILIES, MetricFamily, Row
from ms_exporter.generate.markdown_table import check_each_once, rewrite_page, table_row
from ms_exporter.generate.rules import render_rules

_BLOCK = re.compile(r"(<!-- metrics: (\w+)(?:; columns: ([^>]*?))? -->\n).*?(<!-- metrics:end -->)", re.S)
OPTIONAL = ("group", "sink mode")  # the columns a table may show besides name, type, labels, unit and updated
SERIES_BEGIN, SERIES_END = "<!-- metrics: histogram series -->", "<!-- metrics-series:end -->"
_SERIES_BLOCK = re.compile(f"({re.escape(SERIES_BEGIN)}\n).*?({re.escape(SERIES_END)})", re.S)


def _row_of(family: MetricFamily) -> Row:
    if family.row is None:
        raise ValueError(f"{family.name} has no row (core/catalogue.py): say when it is updated and in which table")
    return family.row


def render_rows(families: Sequence[MetricFamily], columns: Sequence[str] = ()) -> list[str]:
    """The header and rows of a table of `families`, with the `columns` of OPTIONAL it shows."""
    header = ["name", "type", "extra labels", "unit", *(["group"] if "group" in columns else []), "updated"]
    header += ["sink mode"] if "sink mode" in columns else []
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for family in families:
        row = _row_of(family)
        cells = [
            f"`{family.name}`",
            row.type or family.type,
            row.labels or ", ".join(f"`{label}`" for label in family.labels),
            row.unit or family.unit,
            *([row.group] if "group" in columns else []),
            row.updated,
            *([row.sink_mode] if "sink mode" in columns else []),
        ]
        lines.append(table_row(cells))
    return lines


def histogram_series_rows(families: Sequence[MetricFamily] = FAMILIES) -> list[str]:
    """The histogram-series table: each histogram's `_bucket`, `_sum` and `_count`, what it counts (its row's
    `series`) and what of the shipped rules and dashboard reads it, found in the rendered rules and dashboard."""
    # Here, not at the top: the dashboard's SDK needs Python 3.11 (pyproject's floor for it), the catalogue does not.
    from ms_exporter.generate.dashboard import queries, render_dashboard

    rules = [rule for group in render_rules()["groups"] for rule in group["rules"]]
    panels = queries(render_dashboard())
    lines = ["| series | type | meaning | read by |", "|---|---|---|---|"]
    for family in [family for family in families if family.type == "histogram"]:
        meanings = _row_of(family).series
        if len(meanings) != 3:
            raise ValueError(f"{family.name}: its row's `series` must say what its _bucket, _sum and _count count")
        for name, meaning in zip((family.bucket, family.sum, family.count), meanings):
            labels = [*family.labels, *(["le"] if name == family.bucket else [])]
            kind = "counter" + (f" ({', '.join(f'`{label}`' for label in labels)})" if labels else "")
            lines.append(table_row((f"`{name}`", kind, meaning, _readers(name, rules, panels))))
    return lines


def _readers(name: str, rules: Sequence[dict[str, Any]], panels: Sequence[tuple[str, str]]) -> str:
    """The recording rules and alerts whose expression reads `name`, and the dashboard panels whose queries do."""
    reads = re.compile(rf"(?<![:\w]){name}(?![\w:])")
    found = [
        f"`{rule['record']}`" if "record" in rule else f"`{rule['alert']}`"
        for rule in rules
        if reads.search(rule["expr"])
    ]
    found += [f'the dashboard\'s "{title}"' for title in dict.fromkeys(t for t, expr in panels if reads.search(expr))]
    return "; ".join(dict.fromkeys(found)) or "-"


def render_page(text: str, families: Sequence[MetricFamily] = FAMILIES) -> str:
    """The page with each metrics block's table written; ValueError where a family is in no table or in two, or a
    marker names an unknown column."""
    shown: list[str] = []

    def block(match: re.Match[str]) -> str:
        table = match.group(2)
        columns = [column.strip() for column in (match.group(3) or "").split(",") if column.strip()]
        unknown = [column for column in columns if column not in OPTIONAL]
        if unknown:
            raise ValueError(f"docs/metrics.md: table {table!r} names columns {unknown}; allowed: {list(OPTIONAL)}")
        chosen = [family for family in families if _row_of(family).table == table]
        if not chosen:
            raise ValueError(f"docs/metrics.md: no family's row is in table {table!r}")
        shown.extend(family.name for family in chosen)
        return match.group(1) + "\n".join([*render_rows(chosen, columns), ""]) + match.group(4)

    page = _BLOCK.sub(block, text)
    check_each_once("docs/metrics.md", shown, [family.name for family in families])
    if _SERIES_BLOCK.search(page) is None:
        raise ValueError(f"docs/metrics.md has no {SERIES_BEGIN} ... {SERIES_END} block")
    series = "\n".join([*histogram_series_rows(families), ""])
    return _SERIES_BLOCK.sub(lambda match: match.group(1) + series + match.group(2), page)


def main(argv: list[str] | None = None) -> int:
    return rewrite_page(argv, (__doc__ or "").splitlines()[0], render_page)


if __name__ == "__main__":
    sys.exit(main())
