"""A generated block of a page: the text between its begin and end markers (both kept), put in place by `make
generate` or a benchmark, so the hand-written rest of the page is left as it is."""

from __future__ import annotations

import re
from pathlib import Path


def replace_block(text: str, block: str, begin: str, end: str) -> str | None:
    """`text` with the span from `begin` to `end` replaced by `block` (which carries both markers); None where `text`
    has no `begin` marker."""
    if begin not in text:
        return None
    return re.sub(re.escape(begin) + ".*?" + re.escape(end), lambda _: block, text, flags=re.S)


def write_block(path: Path, block: str, begin: str, end: str) -> None:
    """`block` in place of the marked one in `path`; a page without the markers is an error naming them."""
    text = replace_block(path.read_text(encoding="utf-8"), block, begin, end)
    if text is None:
        raise ValueError(f"{path} has no {begin} ... {end} block to write into")
    path.write_text(text, encoding="utf-8")
