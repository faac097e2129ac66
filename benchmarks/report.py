"""What every benchmark's page is written with: the machine it ran on, Markdown tables, a target's verdict, and a
measured block put in place between its markers. The one home of these; the suites import them, nothing here
imports a suite."""

from __future__ import annotations

import os
import platform
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from ms_exporter.generate.marked_block import replace_block

# `make bench`'s targets (docs/benchmarks.md, "Targets"): shares of a step, microseconds, milliseconds, MiB.
TARGETS = {
    "step_ratio": 0.01,
    "grad_ratio": 0.02,
    "hot_path_us": 30.0,
    "scrape_p99_ms": 5.0,
    "rss_mb": 30.0,
    "fingerprint_share": 0.001,
    "check_share": 0.01,
    "slowness_share": 0.001,
    "rollback_share": 0.02,
}


def host() -> str:
    """The CPU model, cores, memory, OS and Python: the part of the machine line that needs no MindSpore."""
    import psutil

    cpu = platform.processor() or "unknown"
    try:
        with open("/proc/cpuinfo") as info:
            cpu = next(line.split(":", 1)[1].strip() for line in info if line.startswith("model name"))
    except (OSError, StopIteration):
        pass
    return (
        f"{cpu}, {os.cpu_count()} cores, {psutil.virtual_memory().total / 2**30:.0f} GiB RAM; "
        f"{platform.platform()}; Python {platform.python_version()}"
    )


def machine() -> str:
    """The host and the MindSpore it trained with."""
    import mindspore

    return f"{host()}; MindSpore {mindspore.__version__}"


def table(rows: list[dict[str, Any]], columns: Sequence[tuple[str, str] | tuple[str, str, str]]) -> str:
    """A Markdown table: columns are (key, title) or (key, title, format spec; "" for str())."""
    specs = [(column[0], column[1], column[2] if len(column) > 2 else "") for column in columns]
    lines = ["| " + " | ".join(title for _, title, _ in specs) + " |", "|" + "|".join("---" for _ in specs) + "|"]
    for row in rows:
        lines.append("| " + " | ".join(format(row[key], fmt) if fmt else str(row[key]) for key, _, fmt in specs) + " |")
    return "\n".join(lines)


def verdict(measured: float, target: float, unit: str, lower_is_better: bool = True) -> str:
    met = measured <= target if lower_is_better else measured >= target
    if met:
        return f"met ({measured:.3g} {unit} against {target:g} {unit})"
    return f"**missed** by {measured - target:.3g} {unit} ({measured:.3g} {unit} against {target:g} {unit})"


def write_section(section: str, path: Path, begin: str, end: str, heading: str = "") -> None:
    """`section` (its own begin and end markers included) in place of the one between those markers in `path`, or
    appended under `heading` where there is none yet: a page other benchmarks rewrite keeps this part."""
    text = path.read_text()
    replaced = replace_block(text, section, begin, end)
    if replaced is None:
        replaced = text.rstrip("\n") + "\n\n" + (f"{heading}\n\n" if heading else "") + section + "\n"
    path.write_text(replaced)


def replace_row(lines: list[str], prefix: str, row: str, after: str | None = None) -> None:
    """The table row that starts with `prefix`, replaced; where there is none, added below the row that starts with
    `after`."""
    index = next((i for i, line in enumerate(lines) if line.startswith(prefix)), None)
    if index is None and after is not None:
        lines.insert(next(i for i, line in enumerate(lines) if line.startswith(after)) + 1, row)
        return
    if index is None:
        raise ValueError(f"no row starts with {prefix!r}")
    lines[index] = row


def replace_section(lines: list[str], heading: str, section: list[str]) -> None:
    """From `heading` up to the next heading of its level, replaced by `section` (which starts with the heading)."""
    start = lines.index(heading)
    end = next((i for i in range(start + 1, len(lines)) if lines[i].startswith("## ")), len(lines))
    body = section[section.index(heading) :]
    while body and not body[-1]:
        body = body[:-1]
    lines[start:end] = [*body, ""]
