"""The rows of docs/benchmarks.md that the device reductions decide, measured again without the whole `make bench`
(about 80 minutes on 2 cores): the replica fingerprint, replica check and rollback targets, rollback by the state's
size, and the opt-in features per sample. `make bench-reductions` (about a minute) rewrites those rows and sections
in place with the same code `make bench` runs for them, and says in the file's opening paragraph when, at which
commit and under which load they were measured; every other figure stays as `make bench` wrote it.
"""

from __future__ import annotations

import argparse
import datetime
import os
import subprocess
import tempfile
import time
from pathlib import Path

from benchmarks import fingerprint, good_state, opt_in
from benchmarks.report import replace_row, replace_section

NOTE = "Refreshed by `make bench-reductions`"


def _commit() -> str:
    try:
        head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, check=True)
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], capture_output=True, text=True)
    except (OSError, subprocess.CalledProcessError):
        return "unknown"
    return head.stdout.strip() + (" (with uncommitted changes)" if dirty.stdout.strip() else "")


def note_in_opening(lines: list[str], note: str) -> None:
    """The opening paragraph's refresh note, replaced or added at its end (the paragraph ends at the first blank
    line after the title)."""
    for i, line in enumerate(lines):
        if line.startswith(NOTE):
            lines[i] = note
            return
    end = lines.index("", 2)
    lines[end:end] = [note]


def refresh(path: Path, quick: bool = False) -> str:
    started, load = time.monotonic(), os.getloadavg()
    with tempfile.TemporaryDirectory(prefix="ms_exporter_bench_") as scratch:
        os.environ.setdefault("MS_EXPORTER_SAVE_DIR", scratch)
        print("replica fingerprint ...", flush=True)
        prints = fingerprint.measure(20 if quick else 500, 30 if quick else 300)
        print("rollback good states ...", flush=True)
        goods = good_state.measure(20 if quick else 200, 30 if quick else 300, (16,) if quick else (16, 128, 512))
        print("opt-in features per sample ...", flush=True)
        opt_ins = opt_in.measure(5 if quick else 100, 20 if quick else 60, ((2, 64),) if quick else ((2, 64), (6, 256)))
    lines = path.read_text().splitlines()
    replace_row(lines, "| a replica fingerprint every 100 steps", fingerprint.fingerprint_row(prints))
    replace_row(
        lines, "| replica checks every step", fingerprint.check_row(prints), after="| a replica fingerprint every"
    )
    replace_row(lines, "| rollback: a good state every 100 steps", good_state.rollback_row(goods))
    replace_section(
        lines, "## Rollback: keeping and restoring a good state by its size", good_state.rollback_section(goods)
    )
    replace_section(lines, "## Opt-in features, per sample", opt_in.opt_in_section(opt_ins))
    note_in_opening(
        lines,
        f"{NOTE}{' --quick (a smoke run)' if quick else ''} on {datetime.date.today().isoformat()} at commit "
        f"{_commit()} in {time.monotonic() - started:.0f} s, load average {load[0]:.1f} when it began: the "
        'fingerprint, replica check and rollback targets, "Rollback: keeping and restoring a good state by its '
        'size" and "Opt-in features, per sample" (the rows the device reductions decide).',
    )
    text = "\n".join(lines) + "\n"
    path.write_text(text)
    return text


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--output", default="docs/benchmarks.md")
    parser.add_argument("--quick", action="store_true", help="a few samples of each (a smoke run)")
    args = parser.parse_args(argv)
    refresh(Path(args.output), args.quick)
    print(f"rewrote the reductions' rows of {args.output}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
