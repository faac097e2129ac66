"""The README's "Where things are" names every module of the package, so a newcomer finds each one."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_the_readme_names_every_module() -> None:
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    table = text[text.index("## Where things are"):]
    table = table[: table.index("\n## ")] if "\n## " in table else table
    named = set(re.findall(r"[\w/]*?(\w+\.py)", table))
    missing = sorted(str(path.relative_to(ROOT)) for path in (ROOT / "ms_exporter").rglob("*.py")
                     if path.name not in named and path.name != "__init__.py")
    assert missing == [], f"modules the README's 'Where things are' does not name: {missing}"
