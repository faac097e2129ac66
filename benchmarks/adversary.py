"""`make reliability`'s adversary cases: each finding of the third hostile round, reproduced for real and judged.

A case runs a real scenario (a training process, a forked child, a flood of clients, a planted file) in a fresh
scratch directory and returns what it observed as plain facts (return codes, seconds, whether a checkpoint
exists, ...); `holds` says whether those facts are what docs/reliability.md promises. The integration tests call the
same `run` and assert the same `holds`, so the table in docs/reliability.md and the suite cannot disagree.

    python -m benchmarks.adversary [KEY ...]      the table for these cases (default: all)
"""

from __future__ import annotations

import importlib
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from benchmarks.report import table

# The modules that declare cases, each a `CASES: tuple[Case, ...]`, in the order their findings are numbered.
MODULES = (
    "benchmarks.adversary_signals",
    "benchmarks.adversary_strategies",
    "benchmarks.adversary_access",
    "benchmarks.adversary_devices",
    "benchmarks.adversary_writers",
)


@dataclass(frozen=True)
class Case:
    """One adversary scenario: `run(scratch)` plays it in an empty directory and returns the observed facts;
    `holds(facts)` is True when they are what the docs promise; `shown(facts)` is the table cell that says so."""

    key: str
    finding: str  # what the adversary (or the unlucky environment) does, in a sentence
    promise: str  # what must happen instead, in a sentence
    run: Callable[[Path], dict[str, Any]]
    holds: Callable[[dict[str, Any]], bool]
    shown: Callable[[dict[str, Any]], str]


def cases() -> list[Case]:
    found: list[Case] = []
    for name in MODULES:
        try:
            module = importlib.import_module(name)
        except ModuleNotFoundError as exc:
            if exc.name != name:
                raise
            continue
        found.extend(module.CASES)
    return found


def play(case: Case) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix=f"ms_exporter_adversary_{case.key}_") as scratch:
        started = time.monotonic()
        facts = case.run(Path(scratch))
        return {"case": case, "facts": facts, "seconds": time.monotonic() - started}


def adversary(keys: tuple[str, ...] = ()) -> list[dict[str, Any]]:
    """Plays every case (or those named), one after another."""
    return [play(case) for case in cases() if not keys or case.key in keys]


def render_adversary(rows: list[dict[str, Any]]) -> str:
    shown = table(
        [
            {
                "key": row["case"].key,
                "finding": row["case"].finding,
                "promise": row["case"].promise,
                "observed": row["case"].shown(row["facts"]),
                "held": "yes" if row["case"].holds(row["facts"]) else "NO",
                "seconds": row["seconds"],
            }
            for row in rows
        ],
        [
            ("key", "case", ""),
            ("finding", "what the adversary does", ""),
            ("promise", "what must happen", ""),
            ("observed", "observed", ""),
            ("held", "held", ""),
            ("seconds", "seconds", ".0f"),
        ],
    )
    return f"""### Adversary cases: signals, strategies, forks, floods, device readers
`python -m benchmarks.adversary` (part of `make reliability`): each case plays one way a job could be harmed, for
real, in a new scratch directory and reports what it saw; the integration tests run the same scenarios and assert
the same verdicts (docs/reliability.md, "Signals the monitor does not own, strategies, forks, floods, device
readers", says what each became).

{shown}
"""


def main(argv: list[str]) -> int:
    rows = adversary(tuple(argv))
    print(render_adversary(rows))
    return 0 if all(row["case"].holds(row["facts"]) for row in rows) else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
