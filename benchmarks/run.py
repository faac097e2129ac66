"""`make bench`: run every benchmark section and rewrite docs/benchmarks.md with the figures.

python -m benchmarks.run [--quick] [--output docs/benchmarks.md]
"""

from __future__ import annotations

import argparse
import datetime
import os
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from benchmarks import (
    fingerprint,
    good_state,
    hardware,
    hotpath,
    memory,
    opt_in,
    paired,
    scrape,
    slowness_cost,
    training,
)
from benchmarks.report import machine


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="ms_exporter benchmarks")
    parser.add_argument("--quick", action="store_true", help="a few steps of each section (a smoke run)")
    parser.add_argument("--output", default="docs/benchmarks.md")
    args = parser.parse_args(argv)
    quick = args.quick
    command = "make bench" if not quick else "python -m benchmarks.run --quick"
    started = time.monotonic()
    load_before = os.getloadavg()
    workspace = tempfile.TemporaryDirectory(prefix="ms_exporter_bench_")  # removed when main returns
    scratch = workspace.name
    # The monitors measured without a save_dir (the hot path's, the scrape's) keep their run state here, not in
    # ./monitor_output of the checkout the benchmarks run from.
    os.environ.setdefault("MS_EXPORTER_SAVE_DIR", scratch)
    log = print if not quick else (lambda *a, **k: None)

    measured = _measure(quick, scratch, log)
    doc = render(
        command,
        quick=quick,
        seconds=time.monotonic() - started,
        loads=(load_before, os.getloadavg()),
        **measured,
    )
    Path(args.output).parent.mkdir(parents=True, exist_ok=True)
    Path(args.output).write_text(doc)
    log(f"wrote {args.output} in {time.monotonic() - started:.0f} s")
    return 0


def _measure(quick: bool, scratch: str, log: Callable[..., None]) -> dict[str, Any]:
    """Every suite in turn, by the names `render` takes them under."""
    log("hot path ...", flush=True)
    hot = hotpath.measure(500 if quick else 20_000) + hotpath.measure_loop(500 if quick else 20_000)
    log("scrape latency ...", flush=True)
    latency = scrape.latency(50 if quick else 2_000)
    log("memory ...", flush=True)
    rss = memory.measure(1_000 if quick else 10_000, scratch)  # 1,000: the first reading
    steps_tables = []
    for title, mode, (layers, d_model), rounds, steps, selection in _training_plans(quick):
        log(f"training: {title} ...", flush=True)
        steps_tables.append((title, rounds, steps, training.measure(mode, layers, d_model, rounds, steps, selection)))
    log("replica fingerprint ...", flush=True)
    prints = fingerprint.measure(20 if quick else 500, 30 if quick else 300)
    log("rollback good states ...", flush=True)
    goods = good_state.measure(20 if quick else 200, 30 if quick else 300, (16,) if quick else (16, 128, 512))
    log("fail-slow probe ...", flush=True)
    slowness = slowness_cost.measure(500 if quick else 20_000, 30 if quick else 300)
    log("step-interleaved pairs ...", flush=True)
    pairs = paired.measure(150 if quick else 6000, 1 if quick else 3)
    log("step time while scraped ...", flush=True)
    scraped = scrape.during_training([0, 1, 100], 1 if quick else 4, 30 if quick else 150)
    log("hardware readers ...", flush=True)
    readers = hardware.measure(20 if quick else 500)
    log("opt-in features per sample ...", flush=True)
    opt_ins = opt_in.measure(5 if quick else 100, 20 if quick else 60, ((2, 64),) if quick else ((2, 64), (6, 256)))
    return {
        "hot": hot,
        "latency": latency,
        "rss": rss,
        "steps_tables": steps_tables,
        "scraped": scraped,
        "pairs": pairs,
        "prints": prints,
        "goods": goods,
        "readers": readers,
        "opt_ins": opt_ins,
        "slowness": slowness,
    }


def _training_plans(quick: bool) -> list[tuple[str, str, tuple[int, int], int, int, str]]:
    """(title, mode, model, rounds, steps per round, which configurations) for each step-time table."""
    demo, larger = (2, 64), (6, 256)
    if quick:
        return [("demo model (2 layers, d_model 64), GRAPH", "graph", demo, 1, 20, "quick")]  # one round: a smoke run
    return [
        ("demo model (2 layers, d_model 64), GRAPH: the targets", "graph", demo, 50, 30, "headline"),
        ("demo model (2 layers, d_model 64), GRAPH: every configuration", "graph", demo, 8, 40, "all"),
        ("demo model (2 layers, d_model 64), PYNATIVE", "pynative", demo, 4, 12, "all"),
        ("larger model (6 layers, d_model 256), GRAPH", "graph", larger, 4, 20, "all"),
        ("larger model (6 layers, d_model 256), PYNATIVE", "pynative", larger, 3, 6, "all"),
    ]


def render(
    command: str,
    hot: list[dict[str, Any]],
    latency: list[dict[str, Any]],
    rss: list[dict[str, Any]],
    steps_tables: list[tuple[str, int, int, list[dict[str, Any]]]],
    scraped: list[dict[str, Any]],
    pairs: dict[str, Any],
    prints: dict[str, Any],
    goods: dict[str, Any],
    readers: list[dict[str, Any]],
    quick: bool,
    seconds: float,
    loads: tuple[tuple[float, ...], tuple[float, ...]] = ((), ()),
    opt_ins: list[dict[str, Any]] | None = None,
    slowness: dict[str, Any] | None = None,
) -> str:
    """docs/benchmarks.md: the run's header, the targets table (a row from each suite), then each suite's section."""
    out = _header(command, quick, seconds, loads)
    out += [
        "## Targets",
        "",
        "| target | result |",
        "|---|---|",
        *paired.target_rows(pairs, steps_tables[0][3]),
        fingerprint.fingerprint_row(prints),
        fingerprint.check_row(prints),
        *([slowness_cost.slowness_row(slowness)] if slowness is not None else []),
        good_state.rollback_row(goods),
        hotpath.target_row(hot),
        scrape.target_row(latency),
        memory.target_row(rss),
        "",
        *paired.cost_sections(pairs),
        *good_state.rollback_section(goods),
        *training.step_time_sections(steps_tables),
        *hotpath.hot_path_section(hot),
        *scrape.scrape_section(latency, scraped),
        *memory.memory_section(rss),
        *hardware.hardware_section(readers, steps_tables),
        *opt_in.opt_in_section(opt_ins or []),
    ]
    return "\n".join(out)


def _header(command: str, quick: bool, seconds: float, loads: tuple[tuple[float, ...], tuple[float, ...]]) -> list[str]:
    """The page's title, how and where it was produced, and the machine's load before and after."""
    out = [
        "# Benchmarks",
        "",
        f"Produced by `{command}` on {datetime.date.today().isoformat()} in {seconds:.0f} s. "
        "Every figure below was measured in that run; rerun the command to refresh them.",
        "",
        f"Machine: {machine()}.",
        "",
        "Load average (1, 5, 15 min) when the run began: "
        + ", ".join(f"{value:.2f}" for value in loads[0])
        + "; when it ended: "
        + ", ".join(f"{value:.2f}" for value in loads[1])
        + f" (on {os.cpu_count()} cores; other work on the machine shows here).",
        "",
    ]
    if quick:
        out += ["**This is a smoke run (`--quick`): too few steps for the figures to mean anything.**", ""]
    return out


if __name__ == "__main__":
    sys.exit(main())
