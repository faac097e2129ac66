"""docs/configuration.md's key tables, from the settings themselves: each key with its default, what it allows and
what it means, as its `setting()` declares them (config/checks.py). The page says which keys a table shows, in its
marker (`<!-- settings: grad_norm layernorm weight_norm -->` ... `<!-- settings:end -->`: sections and keys, a section
standing for every key under it in declaration order, `*parts` for every key of the sections parts declare beside
their class); `make generate` writes the rows, and every key is in exactly one table.

    python -m ms_exporter.generate.settings_tables --docs docs/configuration.md
"""

from __future__ import annotations

import dataclasses
import re
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import yaml

from ms_exporter.config import part_sections
from ms_exporter.config.schema import MonitorConfig
from ms_exporter.generate.markdown_table import check_each_once, rewrite_page, table_row

_BLOCK = re.compile(r"(<!-- settings: ([^>]*?) -->\n).*?(<!-- settings:end -->)", re.S)
HEADER = ("| key | default | allowed | meaning |", "|---|---|---|---|")
PARTS = "*parts"  # a marker's item that stands for every key of the parts' own sections
NO_PART_SECTIONS = "No built-in part declares a section of its own: theirs are the sections above."


@dataclass(frozen=True)
class Key:
    """One leaf key of a monitor_config, dotted, with what its declaration says of it."""

    name: str
    default: Any
    doc: str
    allowed: str
    shown: str | None

    @property
    def default_text(self) -> str:
        if self.shown is not None:
            return self.shown
        if self.default is None:
            return "unset"
        dumped = yaml.safe_dump(plain_value(self.default), default_flow_style=True, width=1_000_000)
        return f"`{dumped.removesuffix(chr(10)).removesuffix(chr(10) + '...')}`"


def plain_value(value: Any) -> Any:
    """A default as YAML writes it: tuples as lists, mappings as plain dicts."""
    if isinstance(value, (tuple, list)):
        return [plain_value(item) for item in value]
    if isinstance(value, Mapping):
        return {key: plain_value(item) for key, item in value.items()}
    return value


def keys(kind: type = MonitorConfig, prefix: str = "") -> list[Key]:
    """Every leaf key under `kind`, in declaration order (a section's keys where the section is declared)."""
    found: list[Key] = []
    for field in dataclasses.fields(kind):
        meta = field.metadata
        check = meta["check"]
        if isinstance(check, type) and dataclasses.is_dataclass(check):
            found += keys(check, f"{prefix}{field.name}.")
            continue
        factory = field.default_factory
        default = factory() if callable(factory) else field.default
        found.append(Key(prefix + field.name, default, meta.get("doc", ""), meta.get("allowed", ""), meta.get("shown")))
    return found


def every_key() -> list[Key]:
    """The built-in keys, then those of each part's own section (config/part_sections.py) under its name."""
    found = keys()
    for name in part_sections.names():
        found += keys(part_sections.section_class(name), f"{name}.")
    return found


def render_rows(selected: Sequence[Key]) -> list[str]:
    """The table rows of `selected`: a key with neither doc nor allowed joins the row before it (its name after the
    first key's, without the section they share; its default after the first's where the two differ)."""
    groups: list[list[Key]] = []
    for key in selected:
        if key.doc or key.allowed or not groups:
            groups.append([key])
        else:
            groups[-1].append(key)
    rows = []
    for first, *more in groups:
        names = ", ".join([f"`{first.name}`", *(f"`{key.name.rpartition('.')[2]}`" for key in more)])
        defaults = [key.default_text for key in (first, *more)]
        default = defaults[0] if len(set(defaults)) == 1 else ", ".join(defaults)
        rows.append(table_row((names, default, first.allowed, first.doc)))
    return rows


def select(every: Sequence[Key], items: Sequence[str]) -> list[Key]:
    """The keys a marker names: each item a key, or a section standing for every key under it."""
    chosen: list[Key] = []
    for item in items:
        if item == PARTS:
            chosen += [key for key in every if key.name.split(".")[0] in part_sections.names()]
            continue
        under = [key for key in every if key.name == item or key.name.startswith(item + ".")]
        if not under:
            raise ValueError(f"docs/configuration.md: a settings marker names {item!r}, which is no key or section")
        chosen += under
    return chosen


def render_page(text: str, every: Sequence[Key] | None = None) -> str:
    """The page with each settings block's rows written; ValueError where a key is in no block or in two."""
    every = every_key() if every is None else every
    shown: list[str] = []

    def block(match: re.Match[str]) -> str:
        chosen = select(every, match.group(2).split())
        shown.extend(key.name for key in chosen)
        if not chosen:  # the parts' own sections, where no part declares one
            return match.group(1) + NO_PART_SECTIONS + "\n" + match.group(3)
        return match.group(1) + "\n".join([*HEADER, *render_rows(chosen), ""]) + match.group(3)

    page = _BLOCK.sub(block, text)
    check_each_once("docs/configuration.md", shown, [key.name for key in every])
    return page


def main(argv: list[str] | None = None) -> int:
    return rewrite_page(argv, (__doc__ or "").splitlines()[0], render_page)


if __name__ == "__main__":
    sys.exit(main())
