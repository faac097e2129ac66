"""RSS the monitor adds over 10,000 steps, measured in fresh processes with and without it."""

from __future__ import annotations

import json
import subprocess
import sys
from typing import Any

from benchmarks.report import TARGETS, table, verdict

_PROBE = """
import json, sys, psutil
from benchmarks.harness import SyntheticRun
steps, with_monitor = int(sys.argv[1]), sys.argv[2] == "1"
run = SyntheticRun("tuple")
process = psutil.Process()
monitor = None
if with_monitor:
    from ms_exporter import TrainingMonitor
    monitor = TrainingMonitor(port=0, backend=["prometheus", "local"], save_dir=sys.argv[3], interval=1,
                              grad_norm={"every_n_steps": 10, "layers": ["block.1"]})
    run.begin(monitor)
rss = {"start": process.memory_info().rss}
for step in range(1, steps + 1):
    run.cb_params.cur_step_num = step
    if monitor is not None:
        monitor.on_train_step_begin(run.run_context)
        monitor.on_train_step_end(run.run_context)
    else:
        run.loss_tensor.asnumpy()
    if step in (1000, steps // 2, steps):
        rss[str(step)] = process.memory_info().rss
if monitor is not None:
    monitor.close()
print(json.dumps(rss))
"""


def measure(steps: int, scratch: str) -> list[dict[str, Any]]:
    rows = []
    for with_monitor in (False, True):
        out = subprocess.run(
            [sys.executable, "-c", _PROBE, str(steps), "1" if with_monitor else "0", scratch],
            capture_output=True,
            text=True,
            check=True,
        )
        rss = json.loads(out.stdout.strip().splitlines()[-1])
        rows.append(
            {
                "case": "TrainingMonitor (prometheus + local, grad norm every 10)"
                if with_monitor
                else "the same loop without the monitor",
                "start_mb": rss["start"] / 2**20,
                "after_1000_mb": rss["1000"] / 2**20,
                "end_mb": rss[str(steps)] / 2**20,
                "steps": steps,
            }
        )
    return rows


def added_mb(rss: list[dict[str, Any]]) -> float:
    """RSS the monitor adds: the end with it less the end without (rss rows: without, with)."""
    return float(rss[1]["end_mb"] - rss[0]["end_mb"])


def target_row(rss: list[dict[str, Any]]) -> str:
    return f"| RSS added < 30 MB after 10,000 steps | {verdict(added_mb(rss), TARGETS['rss_mb'], 'MB')} |"


def memory_section(rss: list[dict[str, Any]]) -> list[str]:
    """The process's resident set with and without the monitor."""
    rss_added = added_mb(rss)
    return [
        "## Memory",
        "",
        "Resident set size of a fresh process running synthetic steps (prometheus + local backends, grad norm",
        "every 10 steps from 7-tuple outputs), and of the same loop without the monitor:",
        "",
        table(
            rss,
            [
                ("case", "case", ""),
                ("start_mb", "start MB", ".1f"),
                ("after_1000_mb", "after 1,000 steps MB", ".1f"),
                ("end_mb", "end MB", ".1f"),
                ("steps", "steps", "d"),
            ],
        ),
        "",
        f"RSS added by the monitor: {rss_added:.1f} MB (end with monitor − end without).",
        "",
    ]
