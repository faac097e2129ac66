"""make failslow, its first half: fail-slow localisation and onset on simulated jobs of 64 to 1,024 ranks, driven by
a real trace (docs/failslow.md).

The trace: the demo Transformer trains here with the monitor on for --trace-steps steps, and each step's own work
(its data wait) and cycle are kept. Every simulated rank's clean series is that trace's jitter, drawn in blocks of
50 consecutive steps from random places (so bursts stay bursts), on top of an own-work share of its own drawn from
1-10% of the cycle; the job's cycle is the trace's cycle jitter plus the slowest rank's excess (a synchronous job
waits for it). Extra hiccups the trace may lack are added: with probability 1e-3 per step and rank a single step of
10-100% of the cycle.

Each injected job slows one rank, or one group of 8 consecutive ranks (a node, a stage), by 5%, 10% or 25% of the
cycle from a random step: persistent (to the end) or intermittent (slow for 10-50 steps, then normal for 20-100, in
turn). Every rank runs the probe's own detector (ms_exporter.core.analysis.slowness.SlownessDetector), one per rank.

- localised: the ranks flagged in the LOCALISE_STEPS steps from the onset are exactly the slowed rank, or exactly
  the slowed group (named as the group by `culprits`);
- steps to detection: from the first slow step to the step the culprit is flagged (a group: its last member), 1 =
  flagged at the first slow step; each burst of an intermittent slowdown that began after the detector had let go
  of the previous one is a detection of its own;
- onset: each culprit rank's onset step (the detector's change-point estimate) against the burst's first slow step;
- false alarms: onsets flagged on clean traces, per 10^6 rank-steps.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import json
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks.report import write_section
from ms_exporter.core.analysis.slowness import SETTLING_STEPS, SlownessDetector, culprits

BEGIN, END = "<!-- failslow:begin -->", "<!-- failslow:end -->"
BLOCK = 50  # steps of the real trace drawn together
HICCUP_RATE = 1e-3  # per step and rank
GROUP = 8
SIZES = (0.05, 0.10, 0.25)
WARMUP = 100  # steps before a slowdown may begin
LOCALISE_STEPS = 50  # the ranks flagged in this many steps from the onset are the ones the slowdown is blamed on


@dataclasses.dataclass(frozen=True)
class Trace:
    """A real run's per-step own work and cycle, seconds (from the second step: the first compiles)."""

    own: np.ndarray
    cycle: np.ndarray

    @property
    def jitter(self) -> np.ndarray:
        """Own work's deviation from its median, as a share of the median cycle."""
        jitter: np.ndarray = (self.own - np.median(self.own)) / np.median(self.cycle)
        return jitter

    @property
    def cycle_jitter(self) -> np.ndarray:
        jitter: np.ndarray = self.cycle / np.median(self.cycle)
        return jitter


def record_trace(steps: int) -> Trace:
    """The demo Transformer trained here for `steps` steps with the monitor on; each step's data wait and cycle."""
    import mindspore as ms

    from ms_exporter.core.probe import Probe
    from ms_exporter.demo import BATCH, build_model, synthetic_dataset
    from ms_exporter.monitor.callback import TrainingMonitor

    rows: list[tuple[float, float]] = []

    class Recorder(Probe):
        name = "failslow_trace"

        def on_step(self, sample: Any) -> None:
            if sample.data_wait is not None:
                rows.append((sample.data_wait, sample.data_wait + sample.duration))

    ms.set_context(mode=ms.GRAPH_MODE)
    monitor = TrainingMonitor({"backend": ["prometheus"], "port": 0, "goodput": {"enable": False}}, probes=[Recorder()])
    try:
        # Two epochs: an epoch's first batch (the pipeline starting again) is part of a real trace.
        build_model(decay_steps=steps).train(
            2, synthetic_dataset(size=(steps // 2 + 1) * BATCH), callbacks=[monitor], dataset_sink_mode=False
        )
    finally:
        monitor.close()
    own, cycle = np.array(rows[SETTLING_STEPS:]).T  # what the probe judges
    return Trace(own, cycle)


def _blocks(rng: np.random.Generator, source: np.ndarray, steps: int, ranks: int) -> np.ndarray:
    """(steps, ranks) drawn from `source` in blocks of BLOCK consecutive values from random places."""
    count = -(-steps // BLOCK)
    starts = rng.integers(0, len(source) - BLOCK, size=(count, ranks))
    drawn = source[starts[:, None, :] + np.arange(BLOCK)[None, :, None]]  # (count, BLOCK, ranks)
    return drawn.reshape(count * BLOCK, ranks)[:steps]


@dataclasses.dataclass(frozen=True)
class Slowdown:
    ranks: tuple[int, ...]
    size: float  # share of the cycle
    onset: int
    intermittent: bool


def slow_mask(slowdown: Slowdown, steps: int, rng: np.random.Generator) -> np.ndarray:
    """1 where the slowed ranks are slow, per step."""
    mask = np.zeros(steps, dtype=bool)
    if not slowdown.intermittent:
        mask[slowdown.onset :] = True
        return mask
    step = slowdown.onset
    while step < steps:
        on = int(rng.integers(10, 51))
        mask[step : step + on] = True
        step += on + int(rng.integers(20, 101))
    return mask


def simulate(
    rng: np.random.Generator, trace: Trace, ranks: int, steps: int, slowdown: Slowdown | None
) -> dict[str, Any]:
    """One simulated job: what the detectors flagged, per rank."""
    # A slowdown's size is a share of the job's clean cycle, the slowest rank's jitter included.
    cycle0 = float(np.median(trace.cycle))
    share = rng.uniform(0.01, 0.10, size=ranks)
    excess = _blocks(rng, trace.jitter, steps, ranks)
    hiccups = rng.random((steps, ranks)) < HICCUP_RATE
    excess[hiccups] += rng.uniform(0.1, 1.0, size=int(hiccups.sum()))
    own = np.maximum(share + excess, 0.0) * cycle0
    cycle = cycle0 * _blocks(rng, trace.cycle_jitter, steps, 1)[:, 0] + np.max(own, axis=1) - np.max(share) * cycle0
    slow = np.zeros(steps, dtype=bool)
    if slowdown is not None:
        slow = slow_mask(slowdown, steps, rng)
        added = slowdown.size * float(np.median(cycle))
        own[np.ix_(slow, np.asarray(slowdown.ranks))] += added
        cycle[slow] += added  # every rank waits for the slowed ones
    detectors = [SlownessDetector() for _ in range(ranks)]
    flags: list[tuple[int, int, int]] = []  # (rank, onset step, flagged at)
    own_by_step, cycle_by_step = own.tolist(), cycle.tolist()
    for step in range(steps):
        cycle_now = cycle_by_step[step]
        for rank, (detector, own_now) in enumerate(zip(detectors, own_by_step[step])):
            onset = detector.observe(step, own_now, cycle_now)
            if onset is not None:
                flags.append((rank, onset.step, onset.flagged_at))
    return {"flags": flags, "slow": slow}


def judge(slowdown: Slowdown, flags: list[tuple[int, int, int]], slow: np.ndarray) -> dict[str, Any]:
    """Localised or not, and the steps from each burst's onset to its detection."""
    culprit = set(slowdown.ranks)
    after = [flag for flag in flags if flag[2] >= slowdown.onset]
    first = [flag for flag in after if flag[2] < slowdown.onset + LOCALISE_STEPS]
    groups = [range(first, first + GROUP) for first in range(0, max(culprit) + GROUP, GROUP)]
    named = culprits(sorted({rank for rank, _, _ in first}), groups)
    expected = culprits(sorted(culprit), groups)
    latencies: list[int | None] = []  # None: a burst never detected
    onset_errors: list[int] = []
    starts = np.flatnonzero(slow & ~np.concatenate(([False], slow[:-1])))
    for start in starts:
        # A burst is detected by the flags raised from its start up to the next burst's start.
        end = next((s for s in starts if s > start), len(slow))
        raised = {rank: (onset, at) for rank, onset, at in after if start <= at < end and rank in culprit}
        if len(raised) == len(culprit):
            latencies.append(int(max(at for _, at in raised.values()) - start + 1))
            onset_errors.extend(int(onset - start) for onset, _ in raised.values())
        elif start == slowdown.onset or not slowdown.intermittent:
            latencies.append(None)
    return {
        "localised": named == expected,
        "false_ranks": len({rank for rank, _, _ in flags} - culprit),
        "latencies": latencies,
        "onset_errors": onset_errors,
    }


def campaign(
    trace: Trace, rank_counts: Sequence[int], jobs: int, steps: int, clean_steps: int, seed: int
) -> dict[str, Any]:
    rng = np.random.default_rng(seed)
    results = []
    for ranks in rank_counts:
        for index in range(jobs):
            size = SIZES[index % len(SIZES)]
            group = index % 2 == 1
            intermittent = (index // 2) % 2 == 1
            first = int(rng.integers(0, ranks // GROUP)) * GROUP if group else int(rng.integers(0, ranks))
            slowdown = Slowdown(
                tuple(range(first, first + GROUP)) if group else (first,),
                size,
                int(rng.integers(WARMUP, steps - 200)),
                intermittent,
            )
            seen = simulate(rng, trace, ranks, steps, slowdown)
            verdict = judge(slowdown, seen["flags"], seen["slow"])
            results.append({"ranks": ranks, "size": size, "group": group, "intermittent": intermittent, **verdict})
    clean: dict[int, dict[str, int]] = {}
    for ranks in rank_counts:
        alarms = rank_steps = 0
        while rank_steps < clean_steps:
            seen = simulate(rng, trace, ranks, steps, None)
            alarms += len(seen["flags"])
            rank_steps += ranks * steps
        clean[ranks] = {"alarms": alarms, "rank_steps": rank_steps}
    return {"jobs": results, "clean": clean}


def summary(result: dict[str, Any]) -> list[dict[str, Any]]:
    """One row per (size, target, pattern): localisation accuracy and steps to detection."""
    rows = []
    for size in SIZES:
        for group in (False, True):
            for intermittent in (False, True):
                runs = [
                    r
                    for r in result["jobs"]
                    if r["size"] == size and r["group"] == group and r["intermittent"] == intermittent
                ]
                if not runs:
                    continue
                latencies = [lat for r in runs for lat in r["latencies"]]
                found = [lat for lat in latencies if lat is not None]
                errors = [error for r in runs for error in r["onset_errors"]]
                rows.append(
                    {
                        "size": size,
                        "target": "group of 8" if group else "one rank",
                        "pattern": "intermittent" if intermittent else "persistent",
                        "jobs": len(runs),
                        "localised": sum(r["localised"] for r in runs) / len(runs),
                        "bursts": len(latencies),
                        "detected": len(found) / len(latencies) if latencies else float("nan"),
                        "median_steps": float(np.median(found)) if found else float("nan"),
                        "max_steps": max(found) if found else float("nan"),
                        "within_3": sum(lat <= 3 for lat in found) / len(latencies) if latencies else float("nan"),
                        "onset_exact": sum(e == 0 for e in errors) / len(errors) if errors else float("nan"),
                        "onset_within_1": sum(abs(e) <= 1 for e in errors) / len(errors) if errors else float("nan"),
                    }
                )
    return rows


def section(result: dict[str, Any], command: str, seconds: float) -> str:
    trace = result["trace"]
    cycle = float(np.median(trace["cycle"]))
    jitter = Trace(np.array(trace["own"]), np.array(trace["cycle"])).jitter
    ranks = ", ".join(f"{r:,}" for r in result["clean"])
    lines = [
        BEGIN,
        f"`{command}` on {datetime.date.today().isoformat()} ({seconds:.0f} s on this machine): "
        f"{len(result['jobs'])} injected jobs of {ranks} ranks, {result['steps']:,} steps each. The trace: "
        f"{len(trace['cycle']):,} steps of the demo Transformer here, a median cycle of {cycle * 1e3:.1f} ms, own work "
        f"jitter of {np.percentile(jitter, 99) * 100:.1f}% of the cycle at the 99th percentile and "
        f"{np.max(jitter) * 100:.1f}% at most; hiccups of 10-100% of the cycle added at {HICCUP_RATE:g} per step and "
        "rank.",
        "",
        "| slowdown | target | pattern | jobs | localised | bursts detected | steps to detection: median | max | "
        "within 3 steps | onset step named exactly | within a step |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for row in result["summary"]:
        lines.append(
            f"| {row['size']:.0%} | {row['target']} | {row['pattern']} | {row['jobs']} | {row['localised']:.1%} | "
            f"{row['detected']:.1%} of {row['bursts']} | {row['median_steps']:g} | {row['max_steps']:g} | "
            f"{row['within_3']:.1%} | {row['onset_exact']:.1%} | {row['onset_within_1']:.1%} |"
        )
    lines += ["", "| ranks | clean rank-steps | false alarms | per 10^6 rank-steps |", "|---|---|---|---|"]
    for ranks, clean in result["clean"].items():
        rate = clean["alarms"] / clean["rank_steps"] * 1e6
        lines.append(f"| {int(ranks):,} | {clean['rank_steps']:,} | {clean['alarms']} | {rate:.2f} |")
    lines.append(END)
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trace-steps", type=int, default=1000)
    parser.add_argument("--trace", help="a trace JSON written by an earlier run (--json) instead of training")
    parser.add_argument("--ranks", type=int, nargs="+", default=[64, 256, 1024])
    parser.add_argument("--jobs", type=int, default=240, help="injected jobs per rank count")
    parser.add_argument("--steps", type=int, default=1000)
    parser.add_argument("--clean-rank-steps", type=float, default=3e7, help="per rank count")
    parser.add_argument("--seed", type=int, default=49)
    parser.add_argument("--json", help="write the raw results (and the trace) here")
    parser.add_argument("--output", default="docs/failslow.md", help="the page whose measured section is rewritten")
    parser.add_argument("--no-page", action="store_true", help="write the raw results only (the suite's short run)")
    args = parser.parse_args(argv)
    began = time.monotonic()
    if args.trace:
        raw = json.loads(Path(args.trace).read_text())["trace"]
        trace = Trace(np.array(raw["own"]), np.array(raw["cycle"]))
    else:
        trace = record_trace(args.trace_steps)
    result = campaign(trace, args.ranks, args.jobs, args.steps, int(args.clean_rank_steps), args.seed)
    result["summary"] = summary(result)
    result["steps"] = args.steps
    result["trace"] = {"own": trace.own.tolist(), "cycle": trace.cycle.tolist()}
    if args.json:
        Path(args.json).write_text(json.dumps(result))
    if not args.no_page:
        command = "make failslow" if argv is None or not argv else "python -m benchmarks.failslow " + " ".join(argv)
        write_section(
            section(result, command, time.monotonic() - began),
            Path(args.output),
            BEGIN,
            END,
            heading="## Measured: localisation and onset",
        )
    for row in result["summary"]:
        print(row)
    for ranks, clean in result["clean"].items():
        if clean["rank_steps"]:
            print(ranks, clean, clean["alarms"] / clean["rank_steps"] * 1e6, "per 10^6 rank-steps")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
