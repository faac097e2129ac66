"""The replica checks' cost in a real 3-rank msrun data-parallel job (docs/sdc.md): the demo's
examples/distributed_train.py with them on (the default: bit sums of every weight and optimizer state tensor, the
local gradient norm in the train cell) and off (`divergence.check_every_step: false`), in turn, `--runs` times each.

Each run's cost is the mean step time of each rank over the steps between two reads of its /metrics (from
`--skip` steps on, past compilation, to the end of training), from the step duration histogram's _sum and _count;
the three ranks' means are averaged. Written as a section of docs/sdc.md.
"""

from __future__ import annotations

import argparse
import datetime
import json
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families

from benchmarks.report import write_section
from tests.support.distributed import msrun_command, msrun_environment
from tests.support.waiting import free_port

ROOT = Path(__file__).resolve().parents[1]
WORKERS = 3
BEGIN, END = "<!-- sdc-msrun:begin -->", "<!-- sdc-msrun:end -->"
DURATION = "mindspore_train_step_duration_seconds"


def _read(port: int) -> tuple[float, float, float]:
    """(steps, step duration _sum, _count) of one rank's /metrics."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as response:
        text = response.read().decode()
    steps = total = count = 0.0
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == "mindspore_train_steps_total":
                steps = sample.value
            elif sample.name == f"{DURATION}_sum":
                total = sample.value
            elif sample.name == f"{DURATION}_count":
                count = sample.value
    return steps, total, count


def one_run(checks: bool, epochs: int, skip: int, scratch: Path) -> float:
    """The ranks' mean step time (ms) past `skip` steps, with the replica checks on or off."""
    base, master = free_port(WORKERS), free_port()
    env = msrun_environment(MS_EXPORTER_DIVERGENCE=json.dumps({"check_every_step": checks}))
    log_dir = scratch / f"log-{checks}-{time.monotonic_ns()}"
    job = subprocess.Popen(
        msrun_command(env, WORKERS, master, log_dir, "--port", str(base), "--epochs", str(epochs), "--linger", "15"),
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        first: dict[int, tuple[float, float, float]] = {}
        last: dict[int, tuple[float, float, float]] = {}
        deadline = time.monotonic() + 1800
        while time.monotonic() < deadline and job.poll() is None:
            for rank in range(WORKERS):
                try:
                    read = _read(base + rank)
                except OSError:
                    continue
                if rank not in first and read[0] >= skip:
                    first[rank] = read
                if rank in first:
                    last[rank] = read
            if len(last) == WORKERS and all(last[r][0] >= epochs * 21 for r in last):  # training ended
                break
            time.sleep(0.5)
    finally:
        job.wait(timeout=120)
    means = [
        (last[r][1] - first[r][1]) / (last[r][2] - first[r][2]) * 1e3
        for r in range(WORKERS)
        if r in first and last[r][2] > first[r][2]
    ]
    if len(means) != WORKERS:
        raise RuntimeError(f"not every rank was read past step {skip}: see {log_dir}")
    return sum(means) / len(means)


def section(results: dict[str, list[float]], epochs: int, skip: int) -> str:
    on, off = results["on"], results["off"]
    mean_on, mean_off = sum(on) / len(on), sum(off) / len(off)
    runs = ", ".join(f"{a:.1f}/{b:.1f}" for a, b in zip(on, off))
    spread = max((max(values) - min(values)) / min(values) for values in (on, off)) * 100
    return "\n".join(
        [
            BEGIN,
            f"`python -m benchmarks.sdc_msrun --runs {len(on)}` on {datetime.date.today().isoformat()}: three msrun "
            f"ranks of the demo ({epochs * 21} steps a run, the steps from {skip} on), replica checks on and off in "
            f"turn. Mean step {mean_on:.1f} ms with them against {mean_off:.1f} ms without "
            f"({(mean_on / mean_off - 1) * 100:+.1f}%; each pair of runs, on/off: {runs} ms). Three ranks share this "
            f"machine's two cores, and runs of one setting differ by up to {spread:.1f}%: the cost is read from the "
            "one-process row of benchmarks.md; this says it stays within that spread in a real job.",
            END,
        ]
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=2)
    parser.add_argument("--epochs", type=int, default=20)
    parser.add_argument("--skip", type=int, default=40, help="steps left out at the start (compilation)")
    parser.add_argument("--output", default="docs/sdc.md")
    args = parser.parse_args(argv)
    results: dict[str, list[float]] = {"on": [], "off": []}
    with tempfile.TemporaryDirectory(prefix="ms_exporter_sdc_msrun_") as scratch:
        for run in range(args.runs):
            for checks in (True, False) if run % 2 == 0 else (False, True):
                mean = one_run(checks, args.epochs, args.skip, Path(scratch))
                results["on" if checks else "off"].append(mean)
                print(f"run {run}: checks {'on' if checks else 'off'}: {mean:.1f} ms", file=sys.stderr)
    text = section(results, args.epochs, args.skip)
    write_section(text, Path(args.output), BEGIN, END, heading="### Per-step cost in a 3-rank msrun job")
    print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
