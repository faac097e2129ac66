"""A Markdown table row from cells, and the check that a page's generated tables show each name once, which the key
tables of docs/configuration.md and the family tables of docs/metrics.md share."""

from __future__ import annotations

from collections.abc import Sequence


def table_row(cells: Sequence[str]) -> str:
    """One row: each cell on one line with its `|` escaped, an empty cell left empty."""
    cleaned = [" ".join(cell.split()).replace("|", "\\|") for cell in cells]
    return "|" + "|".join(f" {cell} " if cell else " " for cell in cleaned) + "|"


def check_each_once(page: str, shown: Sequence[str], every: Sequence[str]) -> None:
    """ValueError naming what `page`'s tables show twice and what they do not show of `every`."""
    twice = sorted({name for name in shown if shown.count(name) > 1})
    missing = [name for name in every if name not in shown]
    if twice or missing:
        raise ValueError(f"{page}'s generated tables: in two tables {twice}, in none {missing}")
