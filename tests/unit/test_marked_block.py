"""A generated block is put in place between its markers, the rest of the page kept; a page without them is named."""

from __future__ import annotations

from pathlib import Path

import pytest

from ms_exporter.generate.marked_block import replace_block, write_block

BEGIN, END = "<!-- x:begin -->", "<!-- x:end -->"


def test_the_block_between_the_markers_is_replaced_and_the_rest_kept(tmp_path: Path) -> None:
    page = tmp_path / "page.md"
    page.write_text(f"# Page\n\nprose\n\n{BEGIN}\nold\n{END}\n\nmore prose\n")
    write_block(page, f"{BEGIN}\nnew\n{END}", BEGIN, END)
    assert page.read_text() == f"# Page\n\nprose\n\n{BEGIN}\nnew\n{END}\n\nmore prose\n"
    assert replace_block("no markers here", "x", BEGIN, END) is None
    other = tmp_path / "other.md"
    other.write_text("a page without the block")
    with pytest.raises(ValueError, match="x:begin"):
        write_block(other, "x", BEGIN, END)
