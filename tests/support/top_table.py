"""The rows of `ms-exporter top`'s table, as a test reads them."""

from __future__ import annotations


def table_rows(text: str) -> dict[str, list[str]]:
    """Table lines by rank: the words of each line, the '>' marker first when it is there."""
    rows: dict[str, list[str]] = {}
    for line in text.splitlines():
        words = line.split()
        if words and words[0] == ">" and len(words) > 1 and words[1].isdigit():
            rows[words[1]] = words
        elif words and words[0].isdigit():
            rows[words[0]] = [" ", *words]
    return rows
