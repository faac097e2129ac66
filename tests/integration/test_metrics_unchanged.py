"""The demo rank's /metrics page keeps its shape: HELP and TYPE lines, names, labels and their order, values masked
(benchmarks/metrics_shape.py). Dashboards and alerts read this page; a change that means to change it (a new family,
a renamed label) rewrites the reference with

    PATH=.venv/bin:$PATH .venv/bin/python -m benchmarks.metrics_shape > tests/integration/data/metrics_shape.txt

and says so in its commit. The reference is the page both before the package's move into layers, one lifecycle
and registries (5371dd6) and after it, and the page at f94c1e4 (before that move and before stops as asked entered
phase="ended") but for mindspore_train_phase's help text, which says on purpose that `ended` includes a stop as
asked. The hardware families (mindspore_train_device_*, the host reader's series and its error counter) come after
the sinks' families; every line before them is as it was. The fail-slow probe added its error counter (component
"slowness"); its own families appear past the demo page's steps (50 settling, 32 for the baseline), but for the
groups the rank works in (mindspore_train_parallel_group_info, published at the first training call).
"""

from __future__ import annotations

import difflib
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
REFERENCE = Path(__file__).parent / "data" / "metrics_shape.txt"


def test_the_demo_page_has_the_shape_of_the_reference() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "benchmarks.metrics_shape"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
        env={**os.environ, "GLOG_v": "3"},
    )
    assert done.returncode == 0, done.stderr[-3000:]
    expected = REFERENCE.read_text(encoding="utf-8").splitlines()
    page = done.stdout.splitlines()
    diff = "\n".join(difflib.unified_diff(expected, page, "reference", "this run", lineterm=""))
    assert page == expected, diff
