"""Two commits side by side on this machine: the hot path and the /metrics latency of each, in alternating runs.

python -m benchmarks.compare OLD NEW [--runs 3] [--output docs/benchmark-comparison.md]

`make bench`'s figures depend on the machine (docs/benchmarks.md names it); whether a change made the monitor
slower is a question for one machine and one time, so each commit is checked out into a git worktree and measured
in its own fresh process, OLD, NEW, OLD, NEW ..., so that a drift of the machine's load falls on both alike. Each
run imports ms_exporter from its worktree only (never the venv's editable install of this checkout).
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from benchmarks.report import machine

ROOT = Path(__file__).resolve().parents[1]
# One run of the checkout in argv[1]: the hot path (the default settings' row), the scrape latency (every case), and
# the /metrics page rendered in process (prometheus_client's generate_latest over the endpoint's registry, found by
# its class name, which older checkouts share with this one): a scrape mostly serves a cached page, so this is
# the render alone.
_RUN = """
import gc, json, sys, time
tree = sys.argv[1]
sys.path.insert(0, tree)
sys.meta_path[:] = [finder for finder in sys.meta_path if "editable" not in repr(finder).lower()]
import ms_exporter
assert ms_exporter.__file__.startswith(tree), ms_exporter.__file__
from prometheus_client import generate_latest
from benchmarks import hotpath, scrape
from benchmarks.harness import SyntheticRun
from benchmarks.stats import summary
from ms_exporter import TrainingMonitor
run = SyntheticRun("scalar")
monitor = TrainingMonitor(port=0)
run.begin(monitor)
for _ in range(200):
    run.step(monitor)
endpoint = next(o for o in gc.get_objects() if type(o).__name__ == "PrometheusEndpoint")
times = []
for _ in range(int(sys.argv[3])):
    began = time.perf_counter()
    generate_latest(endpoint.registry)
    times.append(time.perf_counter() - began)
monitor.close()
figures = {"render": summary(times), "hot": hotpath.measure(int(sys.argv[2]))}
print(json.dumps({**figures, "scrape": scrape.latency(int(sys.argv[3]))}))
"""


def _resolve(commit: str) -> str:
    return subprocess.run(
        ["git", "rev-parse", "--short", commit], cwd=ROOT, capture_output=True, text=True, check=True
    ).stdout.strip()


def measure(old: str, new: str, runs: int, steps: int, scrapes: int) -> dict[str, list[dict[str, Any]]]:
    results: dict[str, list[dict[str, Any]]] = {old: [], new: []}
    with tempfile.TemporaryDirectory(prefix="ms_exporter_compare_") as scratch:
        trees = {commit: Path(scratch) / commit for commit in (old, new)}
        for commit, tree in trees.items():
            subprocess.run(["git", "worktree", "add", "-q", "--detach", str(tree), commit], cwd=ROOT, check=True)
        try:
            for _ in range(runs):
                for commit, tree in trees.items():
                    done = subprocess.run(
                        [sys.executable, "-c", _RUN, str(tree), str(steps), str(scrapes)],
                        cwd=scratch,
                        capture_output=True,
                        text=True,
                        check=True,
                        env={**{k: v for k, v in os.environ.items() if k != "PYTHONPATH"}, "GLOG_v": "3"},
                    )
                    results[commit].append(json.loads(done.stdout.strip().splitlines()[-1]))
        finally:
            for tree in trees.values():
                subprocess.run(["git", "worktree", "remove", "--force", str(tree)], cwd=ROOT, check=False)
    return results


def render(old: str, new: str, results: dict[str, list[dict[str, Any]]], command: str) -> str:
    def figures(commit: str) -> dict[str, list[float]]:
        out: dict[str, list[float]] = {"hot path, default settings: mean µs": []}
        for run in results[commit]:
            out["hot path, default settings: mean µs"].append(run["hot"][0]["mean_us"])
            if "render" in run:
                out.setdefault("/metrics rendered in process, defaults: median ms", []).append(run["render"]["median"])
            for case in run["scrape"]:
                out.setdefault(f"/metrics, {case['case']}: median ms", []).append(case["median"])
                out.setdefault(f"/metrics, {case['case']}: p99 ms", []).append(case["p99"])
        return out

    before, after = figures(old), figures(new)
    lines = [
        "# Benchmark comparison",
        "",
        f"Produced by `{command}` on {datetime.date.today().isoformat()}. Machine: {machine()}.",
        "",
        f"{old} and {new}, each in {len(results[old])} fresh processes taken in turns (benchmarks/compare.py). Each",
        "cell lists every run; the last column is the median of the runs of the new commit over that of the old.",
        "",
        f"| figure | {old} | {new} | new / old |",
        "|---|---|---|---|",
    ]
    for name, old_values in before.items():
        new_values = after.get(name, [])
        ratio = statistics.median(new_values) / statistics.median(old_values) if new_values else float("nan")
        lines.append(
            f"| {name} | {', '.join(f'{v:.2f}' for v in old_values)} | {', '.join(f'{v:.2f}' for v in new_values)} "
            f"| {ratio:.2f} |"
        )
    return "\n".join([*lines, ""])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("old")
    parser.add_argument("new")
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--steps", type=int, default=20_000, help="hot-path steps per run")
    parser.add_argument("--scrapes", type=int, default=1_000, help="/metrics requests per case per run")
    parser.add_argument("--output", default="docs/benchmark-comparison.md")
    args = parser.parse_args(argv)
    old, new = _resolve(args.old), _resolve(args.new)
    results = measure(old, new, args.runs, args.steps, args.scrapes)
    command = f"python -m benchmarks.compare {args.old} {args.new} --runs {args.runs}"
    Path(args.output).write_text(render(old, new, results, command), encoding="utf-8")
    print(f"wrote {args.output}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
