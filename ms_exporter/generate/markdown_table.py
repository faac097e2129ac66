"""A Markdown table row from cells, the check that a page's generated tables show each name once, and the command
that rewrites a page's tables: what the key tables of docs/configuration.md and the family tables of docs/metrics.md
share."""

from __future__ import annotations

import argparse
from collections.abc import Callable, Sequence
from pathlib import Path


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


def rewrite_page(argv: list[str] | None, description: str, render_page: Callable[[str], str]) -> int:
    """The command: `--docs PAGE` rewritten in place by `render_page`."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--docs", required=True, help="the page whose generated tables to rewrite")
    path = Path(parser.parse_args(argv).docs)
    path.write_text(render_page(path.read_text(encoding="utf-8")), encoding="utf-8")
    return 0
