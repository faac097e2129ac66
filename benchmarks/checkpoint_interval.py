"""make failslow, its second half: the checkpoint interval advisor against the brute-force best interval, in a
discrete-event simulation of 10^4 job-days per scenario (docs/failslow.md#checkpoint-interval).

A job computes, saves every `interval` seconds of work (a save takes `save` seconds), and fails at the times a
failure law draws: exponential, or Weibull with shape 0.7 (failures come early after a restart: the decreasing
hazard field studies of HPC and GPU clusters report), both with mean `mtbf`. A failure loses the work since the
last completed save, then costs `lost` seconds (detection and restart) before the job computes again from that
save; the failure clock starts anew at the restart. Over a run of failure gaps G_i, the work kept is
sum(floor(G_i / (interval + save)) * interval) and the wall time sum(G_i + lost): goodput is their ratio, for
every interval on the same gaps (common random numbers), so the brute-force best is the best of a fine grid.

The advisor sees what a run sees: after n failures, the time they took, the save time and the cost of a failure,
and advises the interval of highest expected goodput over what the MTBF may be (advised_interval in
core/analysis/checkpoint_interval.py); Daly's interval at the plain estimate (time over n) is shown beside it.
Their goodput on the long run, over the best's, is drawn 500 times per scenario and n (other runs' first n
failures).
"""

from __future__ import annotations

import argparse
import itertools
import math
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks.report import write_section
from ms_exporter.core.analysis.checkpoint_interval import advised_interval, daly_interval, young_interval

BEGIN, END = "<!-- checkpoint-interval:begin -->", "<!-- checkpoint-interval:end -->"
DAY = 86400.0
WEIBULL_SHAPE = 0.7
MTBFS = (4 * 3600.0, 12 * 3600.0, 48 * 3600.0)
SAVES = (60.0, 300.0, 900.0)
LOSTS = (600.0, 1800.0)
OBSERVED = (1, 3, 5, 10)
DRAWS = 500


def gaps(rng: np.random.Generator, law: str, mtbf: float, count: int) -> np.ndarray:
    if law == "exponential":
        return rng.exponential(mtbf, count)
    scale = mtbf / math.gamma(1 + 1 / WEIBULL_SHAPE)
    return scale * rng.weibull(WEIBULL_SHAPE, count)


def goodput(run: np.ndarray, interval: float, save: float, lost: float) -> float:
    kept = np.floor(run / (interval + save)).sum() * interval
    return float(kept / (run.sum() + lost * len(run)))


def scenario(rng: np.random.Generator, law: str, mtbf: float, save: float, lost: float, days: float) -> dict[str, Any]:
    run = gaps(rng, law, mtbf, max(1000, int(days * DAY / mtbf)))
    # The run's goodput on a fine log grid (0.2% apart): the best of it is the brute-force best, and an advised
    # interval's goodput is read off it (between two points, the nearer one's).
    grid = np.geomspace(save / 4, 64 * mtbf, 4000)
    curve = np.array([goodput(run, interval, save, lost) for interval in grid])
    best_index = int(np.argmax(curve))
    best = float(curve[best_index])

    def at(interval: float) -> float:
        return float(curve[int(np.argmin(np.abs(np.log(grid) - math.log(interval))))]) / best

    row: dict[str, Any] = {
        "law": law,
        "mtbf": mtbf,
        "save": save,
        "lost": lost,
        "best_interval": float(grid[best_index]),
        "best": best,
        "daly_true": at(daly_interval(save, mtbf)),
        "young_true": at(young_interval(save, mtbf)),
    }
    for observed in OBSERVED:
        exposures = gaps(rng, law, mtbf, DRAWS * observed).reshape(DRAWS, observed).sum(axis=1)
        advised = np.array([at(advised_interval(save, seen, observed, lost)) for seen in exposures])
        plugged = np.array([at(daly_interval(save, seen / observed)) for seen in exposures])
        row[f"after_{observed}"] = {
            "mean": float(advised.mean()),
            "p10": float(np.percentile(advised, 10)),
            "daly_mean": float(plugged.mean()),
        }
    return row


def campaign(days: float, seed: int) -> list[dict[str, Any]]:
    rng = np.random.default_rng(seed)
    return [
        scenario(rng, law, mtbf, save, lost, days)
        for law, mtbf, save, lost in itertools.product(("exponential", "weibull"), MTBFS, SAVES, LOSTS)
    ]


def summary(rows: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    out = []
    for law in ("exponential", "weibull"):
        of_law = [row for row in rows if row["law"] == law]
        entry: dict[str, Any] = {
            "law": law,
            "scenarios": len(of_law),
            "daly_true": min(row["daly_true"] for row in of_law),
            "young_true": min(row["young_true"] for row in of_law),
        }
        for observed in OBSERVED:
            key = f"after_{observed}"
            entry[key] = {
                "mean": float(np.mean([row[key]["mean"] for row in of_law])),
                "daly_mean": float(np.mean([row[key]["daly_mean"] for row in of_law])),
                "worst_mean": min(row[key]["mean"] for row in of_law),
                "worst_p10": min(row[key]["p10"] for row in of_law),
            }
        out.append(entry)
    return out


def section(rows: Sequence[dict[str, Any]], days: float, command: str, seconds: float) -> str:
    lines = [
        BEGIN,
        f"`{command}` ({seconds:.0f} s): {len(rows)} scenarios (MTBF 4, 12, 48 hours; save 1, 5, 15 minutes; "
        f"detection and restart 10, 30 minutes; both laws), each {days:,.0f} job-days of failures; "
        f"{DRAWS:,} advisors per scenario and number of failures seen. Goodput as a share of the brute-force "
        "best interval's on the same failures.",
        "",
        "| law | Daly at the true MTBF: worst scenario | Young at the true MTBF: worst | after 1 failure: the "
        "advisor's mean (worst scenario's mean, worst 10th percentile; Daly at the estimate: mean) | after 3 | "
        "after 5 | after 10 |",
        "|---|---|---|---|---|---|---|",
    ]
    for entry in summary(rows):
        cells = [
            f"{entry[f'after_{n}']['mean']:.2%} ({entry[f'after_{n}']['worst_mean']:.2%}, "
            f"{entry[f'after_{n}']['worst_p10']:.2%}; {entry[f'after_{n}']['daly_mean']:.2%})"
            for n in OBSERVED
        ]
        lines.append(
            f"| {entry['law']} | {entry['daly_true']:.2%} | {entry['young_true']:.2%} | " + " | ".join(cells) + " |"
        )
    lines.append(END)
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--days", type=float, default=1e4, help="job-days of failures per scenario")
    parser.add_argument("--seed", type=int, default=1974)
    parser.add_argument("--output", default="docs/failslow.md")
    parser.add_argument("--no-page", action="store_true")
    args = parser.parse_args(argv)
    began = time.monotonic()
    rows = campaign(args.days, args.seed)
    for entry in summary(rows):
        print(entry)
    if not args.no_page:
        command = "make failslow" if not argv else "python -m benchmarks.checkpoint_interval " + " ".join(argv)
        write_section(
            section(rows, args.days, command, time.monotonic() - began),
            Path(args.output),
            BEGIN,
            END,
            heading="## Measured: the advisor against the best interval",
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
