"""The benchmark suite still runs end to end (figures are judged in docs/benchmarks.md, never here)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration
ROOT = Path(__file__).resolve().parents[2]


def run_quick(module: str, output: Path) -> None:
    """A benchmark module's smoke run (--quick) writing `output`."""
    run = subprocess.run(
        [sys.executable, "-m", module, "--quick", "--output", str(output)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert run.returncode == 0, run.stderr[-3000:]


def test_quick_benchmark_run_writes_every_section(tmp_path: Path) -> None:
    output = tmp_path / "benchmarks.md"
    run_quick("benchmarks.run", output)
    text = output.read_text()
    for heading in (
        "## Targets",
        "## Training step time: demo model",
        "## The hot path alone",
        "## Scrape cost",
        "## Step-interleaved",
        "## Rollback: keeping and restoring",
        "## Memory",
        "## Hardware readers",
        "## Opt-in features, per sample",
        "update ratio (copy, norms, export)",
        "TrainingMonitor, defaults, hardware monitor off: ",
        "Machine: ",
        "python -m benchmarks.run --quick",
    ):
        assert heading in text, heading
    assert "smoke run" in text  # a quick run says that its figures mean nothing
    assert "nan" not in text.split("## Training step time")[1]  # every measured cell was filled
    # make bench-reductions rewrites its rows and sections of the same page in place, and says so at the top.
    run_quick("benchmarks.reductions_refresh", output)
    refreshed = output.read_text()
    assert "Refreshed by `make bench-reductions` --quick" in refreshed.split("## Targets")[0]
    for heading in ("## Rollback: keeping and restoring", "## Opt-in features, per sample", "| a replica fingerprint"):
        assert refreshed.count(heading) == 1, heading

    def step_tables(page: str) -> str:  # a part the refresh does not measure
        return page.split("## Training step time")[1].split("## The hot path alone")[0]

    assert step_tables(refreshed) == step_tables(text)
