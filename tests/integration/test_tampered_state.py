"""A save_dir whose every state file was replaced (garbage, a FIFO, a symlink out of save_dir, a 2 GiB file): the
next training starts, trains every step, says what it moved aside, and writes nothing outside save_dir
(benchmarks/tampered.py plants them and runs the training; `make reliability` prints the same table)."""

from __future__ import annotations

from pathlib import Path

import pytest

from benchmarks.tampered import KINDS, STEPS, run_tampered

pytestmark = pytest.mark.integration


# The suite keeps the symlink out of save_dir (what could reach outside it); the other kinds are repeats of "the next
# training starts" and run in `make test-long` (and `make reliability`).
@pytest.mark.parametrize(
    "kind", [kind if kind == "symlink" else pytest.param(kind, marks=pytest.mark.long) for kind in KINDS]
)
def test_a_tampered_save_dir_neither_stops_the_next_training_nor_reaches_outside(tmp_path: Path, kind: str) -> None:
    row = run_tampered(kind, tmp_path, timeout=300)
    assert row["returncode"] == 0, row["stderr"][-3000:]
    assert row["trained"] == STEPS
    assert row["outside_unchanged"]
    said = "\n".join(row["said"])
    # The goodput ledger's two files are read at construction: each is named as moved, with why.
    assert said.count("-rank0.json is unusable") == 1 and said.count("-rank0.step is unusable") == 1, said
    if kind in ("fifo", "symlink"):  # no lock file can be taken there: moved too
        assert "ms_exporter-rank0.lock was no regular file" in said, said
