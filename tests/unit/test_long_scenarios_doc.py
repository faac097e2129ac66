"""docs/development.md names every module whose tests `make test` leaves to `make test-long`, and no other."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_the_long_table_names_exactly_the_modules_with_long_tests() -> None:
    marked = {
        path.stem
        for path in (ROOT / "tests/integration").glob("test_*.py")
        if "pytest.mark.long" in path.read_text(encoding="utf-8")  # unit tests are never long
    }
    section = (ROOT / "docs/development.md").read_text(encoding="utf-8").split("## The suite and the long scenarios")[1]
    table = section.split("\n## ", 1)[0]
    named = set(re.findall(r"^\| (test_\w+):", table, flags=re.MULTILINE))
    assert marked and named == marked, (sorted(marked - named), sorted(named - marked))
