"""What the fail-slow scores and onsets cost the step (docs/failslow.md), and the checkpoint advisor its thread.

The probe's on_step runs for every step in the publication batches on the training thread: it is timed record by
record on samples of the demo model's own timings (a step, a data wait and a hook time per record, jittered as a
trace is), past the settling and baseline steps, against the demo model's median GRAPH step. The checkpoint
advisor's refresh runs on the goodput saver's thread every goodput.save_seconds, off the step: it is timed as it
runs after a restart.

python -m benchmarks.slowness_cost --output docs/benchmarks.md rewrites that row of the targets table (make bench
writes it with the rest; make failslow refreshes it).
"""

from __future__ import annotations

import argparse
import datetime
import time
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks.report import TARGETS, verdict

PREFIX = "| fail-slow scores and onsets"


def measure(records: int, steps: int) -> dict[str, Any]:
    from benchmarks.opt_in import trained
    from ms_exporter.core.analysis.ledger import TimeLedger
    from ms_exporter.core.analysis.slowness import SETTLING_STEPS, WARMUP_STEPS
    from ms_exporter.core.sample import StepSample
    from ms_exporter.core.store import MetricStore
    from ms_exporter.features.checkpoint_advice import CheckpointAdvisor
    from ms_exporter.probes.slowness import SlownessProbe

    _, step_ms = trained(2, 64, steps)
    rng = np.random.default_rng(0)
    store = MetricStore((("rank", "0"), ("project", "bench")))
    probe = SlownessProbe(store)
    probe.on_train_begin(None)
    step = step_ms / 1e3
    samples = [
        StepSample(
            i, 1, 1, 1.0, step * rng.uniform(0.95, 1.05), step * rng.uniform(0.005, 0.02), 16, 512, 0.0, float(i)
        )
        for i in range(1, SETTLING_STEPS + WARMUP_STEPS + records + 1)
    ]
    for sample in samples[: SETTLING_STEPS + WARMUP_STEPS]:
        probe.on_step(sample)
    times = []
    for sample in samples[SETTLING_STEPS + WARMUP_STEPS :]:
        began = time.perf_counter()
        probe.on_step(sample)
        times.append(time.perf_counter() - began)
    record_us = float(np.median(times)) * 1e6
    ledger = TimeLedger(store, 0.0, None)
    ledger.saves.add(0.5, 10.0)
    ledger.saves.add(0.5, 110.0)
    advisor = CheckpointAdvisor(store, ledger, restarts=3, previous_saved=100.0, started=160.0)
    refresh = []
    for hours in range(1, 201):
        began = time.perf_counter()
        advisor.refresh([hours * 3600.0])
        refresh.append(time.perf_counter() - began)
    return {
        "records": records,
        "record_us": record_us,
        "record_p90_us": float(np.percentile(times, 90)) * 1e6,
        "step_ms": step_ms,
        "share": record_us / 1e3 / step_ms,
        "refresh_us": float(np.median(refresh)) * 1e6,
    }


def slowness_row(cost: dict[str, Any], when: str = "") -> str:
    """The fail-slow probe's line of the targets table (benchmarks/slowness_cost.py)."""
    return (
        f"{PREFIX} < 0.1% of step time (demo model, GRAPH) | "
        f"{verdict(cost['share'] * 100, TARGETS['slowness_share'] * 100, '%')}: the probe's on_step "
        f"{cost['record_us']:.1f} µs a record (median of {cost['records']:,}; p90 {cost['record_p90_us']:.1f} µs), "
        f"in the publication batches on the training thread, against a median step of {cost['step_ms']:.1f} ms; "
        f"the checkpoint advisor's refresh {cost['refresh_us']:.0f} µs every goodput.save_seconds on the saver's "
        f"thread, off the step{when} (docs/failslow.md) |"
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--output", default="docs/benchmarks.md")
    parser.add_argument("--records", type=int, default=20_000)
    args = parser.parse_args(argv)
    from benchmarks.report import replace_row

    cost = measure(args.records, 300)
    path = Path(args.output)
    lines = path.read_text().splitlines()
    when = f"; refreshed by `make failslow` on {datetime.date.today().isoformat()}"
    replace_row(lines, PREFIX, slowness_row(cost, when), after="| replica checks every step")
    path.write_text("\n".join(lines) + "\n")
    print(slowness_row(cost, when))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
