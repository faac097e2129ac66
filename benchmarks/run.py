"""`make bench`: run every benchmark section and rewrite docs/benchmarks.md with the figures.

python -m benchmarks.run [--quick] [--output docs/benchmarks.md]
"""

from __future__ import annotations

import argparse
import datetime
import os
import platform
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import psutil

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

TARGETS = {
    "step_ratio": 0.01,
    "grad_ratio": 0.02,
    "hot_path_us": 30.0,
    "scrape_p99_ms": 5.0,
    "rss_mb": 30.0,
    "fingerprint_share": 0.001,
    "check_share": 0.01,
    "slowness_share": 0.001,
    "rollback_share": 0.02,
}


def machine() -> str:
    import mindspore

    cpu = platform.processor() or "unknown"
    try:
        with open("/proc/cpuinfo") as info:
            cpu = next(line.split(":", 1)[1].strip() for line in info if line.startswith("model name"))
    except (OSError, StopIteration):
        pass
    return (
        f"{cpu}, {os.cpu_count()} cores, {psutil.virtual_memory().total / 2**30:.0f} GiB RAM; "
        f"{platform.platform()}; Python {platform.python_version()}; MindSpore {mindspore.__version__}"
    )


def table(rows: list[dict[str, Any]], columns: list[tuple[str, str, str]]) -> str:
    head = "| " + " | ".join(title for _, title, _ in columns) + " |"
    rule = "|" + "|".join("---" for _ in columns) + "|"
    lines = [head, rule]
    for row in rows:
        lines.append(
            "| " + " | ".join(format(row[key], fmt) if fmt else str(row[key]) for key, _, fmt in columns) + " |"
        )
    return "\n".join(lines)


STEP_COLUMNS = [
    ("case", "configuration", ""),
    ("median", "median ms/step", ".2f"),
    ("p90", "p90 ms", ".2f"),
    ("n", "steps", "d"),
    ("ratio", "ratio to no callbacks (median of rounds)", ".3f"),
    ("ratio_low", "lowest round", ".3f"),
    ("ratio_high", "highest round", ".3f"),
]


def verdict(measured: float, target: float, unit: str, lower_is_better: bool = True) -> str:
    met = measured <= target if lower_is_better else measured >= target
    if met:
        return f"met ({measured:.3g} {unit} against {target:g} {unit})"
    return f"**missed** by {measured - target:.3g} {unit} ({measured:.3g} {unit} against {target:g} {unit})"


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

    log("hot path ...", flush=True)
    hot = hotpath.measure(500 if quick else 20_000) + hotpath.measure_loop(500 if quick else 20_000)
    log("scrape latency ...", flush=True)
    latency = scrape.latency(50 if quick else 2_000)
    log("memory ...", flush=True)
    rss = memory.measure(1_000 if quick else 10_000, scratch)  # 1,000: the first reading
    demo, larger = (2, 64), (6, 256)
    # (title, mode, model, rounds, steps per round, which configurations)
    plans = [
        ("demo model (2 layers, d_model 64), GRAPH: the targets", "graph", demo, 50, 30, "headline"),
        ("demo model (2 layers, d_model 64), GRAPH: every configuration", "graph", demo, 8, 40, "all"),
        ("demo model (2 layers, d_model 64), PYNATIVE", "pynative", demo, 4, 12, "all"),
        ("larger model (6 layers, d_model 256), GRAPH", "graph", larger, 4, 20, "all"),
        ("larger model (6 layers, d_model 256), PYNATIVE", "pynative", larger, 3, 6, "all"),
    ]
    if quick:
        plans = [("demo model (2 layers, d_model 64), GRAPH", "graph", demo, 1, 20, "quick")]  # one round: a smoke run
    steps_tables = []
    for title, mode, (layers, d_model), rounds, steps, selection in plans:
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

    doc = render(
        command,
        hot,
        latency,
        rss,
        steps_tables,
        scraped,
        pairs,
        prints,
        goods,
        readers,
        quick,
        time.monotonic() - started,
        (load_before, os.getloadavg()),
        opt_ins,
        slowness,
    )
    Path(args.output).parent.mkdir(parents=True, exist_ok=True)
    Path(args.output).write_text(doc)
    log(f"wrote {args.output} in {time.monotonic() - started:.0f} s")
    return 0


def _ratio(rows: list[dict[str, Any]], prefix: str) -> float:
    return next(r["ratio"] for r in rows if r["case"].startswith(prefix))


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
    graph_rows = steps_tables[0][3]
    second = next(r for r in graph_rows if r["case"].startswith("no callbacks, a second"))
    noise, spread = abs(second["ratio"] - 1), second["ratio_high"] - second["ratio_low"]
    default_cost = _ratio(graph_rows, "TrainingMonitor, defaults") - 1
    grad_cost = _ratio(graph_rows, "TrainingMonitor + GradNormTrainOneStepCell, grad norm every 10") - 1
    grad_reading = (
        _ratio(graph_rows, "TrainingMonitor + GradNormTrainOneStepCell, grad norm every 10")
        / _ratio(graph_rows, "GradNormTrainOneStepCell without")
        - 1
    )
    loss_monitor = next((r["ratio"] - 1 for r in graph_rows if r["case"].startswith("LossMonitor")), float("nan"))
    paired_monitor, paired_loss_monitor, paired_grad = pairs["monitor"], pairs["loss_time"], pairs["grad"]
    control, published, below = pairs["control"], pairs["publications"], pairs["below_loss_time"]
    grad_total = paired_monitor["all_steps"] + paired_grad["cost"]

    def interval(row: dict[str, Any]) -> str:
        return f"95% interval {row['cost_low'] * 100:+.2f}% to {row['cost_high'] * 100:+.2f}%, {row['pairs']} pairs"

    hot_default = hot[0]["mean_us"]
    scrape_p99 = max(row["p99"] for row in latency)
    rss_added = rss[1]["end_mb"] - rss[0]["end_mb"]
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
    out += [
        "## Targets",
        "",
        "| target | result |",
        "|---|---|",
        f"| default settings cost < 1% of step time (demo model, GRAPH) | step-interleaved, over all steps: "
        f"{verdict(paired_monitor['all_steps'] * 100, TARGETS['step_ratio'] * 100, '%')} "
        f"(95% interval {paired_monitor['all_steps_low'] * 100:+.2f}% to "
        f"{paired_monitor['all_steps_high'] * 100:+.2f}%): "
        f"the steps that do not publish {paired_monitor['cost'] * 100:+.2f}% ({interval(paired_monitor)}; per "
        f"training {paired_monitor['per_training']}) plus {published['share'] * 100:.2f}% for the publications "
        f"({published['publications']} of median {published['publish_ms']:.2f} ms in "
        f"{published['records']} steps of a median {published['step_ms']:.1f} ms, the monitor on every step). "
        f"The A/A control in the same trainings: {control['cost'] * 100:+.2f}% ({interval(control)}). "
        f"Rounds of whole trainings: {default_cost * 100:+.2g}%, where a second model instance without callbacks "
        f"differs by {noise * 100:.2g}% (per-round ratios span {spread * 100:.2g}%) |",
        f"| default settings cost less than MindSpore's LossMonitor + TimeMonitor | step-interleaved, in turns "
        f"within the same trainings: monitor {paired_monitor['all_steps'] * 100:+.2f}% over all steps, "
        f"LossMonitor + TimeMonitor {paired_loss_monitor['cost'] * 100:+.2f}% ({interval(paired_loss_monitor)}; "
        f"they do the same work every step); difference {below['difference'] * 100:+.2f}% (95% interval "
        f"{below['low'] * 100:+.2f}% to {below['high'] * 100:+.2f}%): "
        f"{'met' if below['high'] < 0 else ('**not shown**' if below['difference'] < 0 else '**missed**')}. "
        f"Rounds: monitor "
        f"{default_cost * 100:+.2g}%, LossMonitor + TimeMonitor {loss_monitor * 100:+.2g}% |",
        f"| grad norm every 10 steps < 2% (demo model, GRAPH) | step-interleaved: "
        f"{verdict(grad_total * 100, TARGETS['grad_ratio'] * 100, '%')} (the monitor's per-step cost plus the "
        f"measured steps' extra spread over 10 steps, {paired_grad['cost'] * 100:+.2f}%, {interval(paired_grad)}). "
        f"Rounds: {grad_cost * 100:+.2g}% against no monitor on another model instance; the monitor's reading "
        f"alone, against the same cell without a monitor, {grad_reading * 100:+.2g}% |",
        _fingerprint_row(prints),
        _check_row(prints),
        *([_slowness_row(slowness)] if slowness is not None else []),
        _rollback_row(goods),
        f"| hot path < 30 µs | {verdict(hot_default, TARGETS['hot_path_us'], 'µs')} (mean per step with the "
        f"publications, defaults; median {hot[0]['median_us']:.1f} µs) |",
        f"| /metrics p99 < 5 ms | {verdict(scrape_p99, TARGETS['scrape_p99_ms'], 'ms')} (worst case below) |",
        f"| RSS added < 30 MB after 10,000 steps | {verdict(rss_added, TARGETS['rss_mb'], 'MB')} |",
        "",
        "## What bounds the default cost",
        "",
        f"The monitor's publications cost {published['share'] * 100:.2f}% of training time: every second the "
        f"records of that second go through the probes, about "
        f"{published['records'] / max(published['publications'], 1):.0f} "
        f"records in {published['publish_ms']:.2f} ms (median), {published['record_us']:.0f} µs a record, spread "
        "over the probes, the",
        "`warn_on_value` checks, the live page's history and the LayerNorm probe's parameter reads every 25 steps",
        "(docs/development.md has a cProfile). A publication's cost is mostly per batch rather than per record",
        "(docs/development.md: publishing every 0.25 s cost about twice as much a record as every second in",
        "earlier paired runs), which is why the monitor publishes once a second. About a third of a record is",
        "the batch's attention mask (holding the tensor until the step is published and reading it;",
        "`Tensor.get_bytes()` instead of `asnumpy()` did not help in training). The steps that only record cost "
        f"{paired_monitor['cost'] * 100:+.2f}%, the A/A control in the same trainings "
        f"{control['cost'] * 100:+.2f}%;",
        "the hooks' own time on a step is a few µs, and what is left is Python running cold between training",
        "steps (5-10x slower than the synthetic hot path below: cold caches, the dataset's threads). Keeping the",
        "step's whole batch until it was published cost about 0.4% of its own (docs/development.md), so step",
        "begin keeps only the batch's shape and its mask. Publishing from a background thread was tried and is",
        "not an option: MindSpore calls from a second thread during a step deadlocked, and steps overlapping such a",
        "publication slowed by about what it costs on the training thread.",
        "",
        "How to read the step-time ratios: each configuration trains its own copy of the model; configurations",
        "take turns in rounds (A B C ... then B C ... A, rotating) after a warm-up round that compiles every",
        "graph, and the first 3 steps of each round are dropped. A step's time is the interval between",
        "consecutive step ends as seen by a timing callback that runs last and reads the loss (GRAPH mode does",
        "not synchronise otherwise), so it includes data loading and every callback. This machine's speed",
        "drifts by 10-30% over minutes, more than the effects measured, so each configuration's median step",
        "time in a round is divided by the bare run's in the same round, and the table gives the median of",
        "those ratios with the lowest and highest round. Configurations that differ only in their callbacks",
        "train the same Model object; two instances of the same model differ by a few percent on their own",
        '(memory layout), which the "second model instance" row measures: a difference between instances',
        "smaller than that is not a measurement.",
        "",
        "Why two methods: on this 2-core machine the per-round ratios of two identical configurations spread",
        "over tens of percent, so rounds of whole trainings carry an uncertainty of a few percent, larger than",
        "the 1% and 2% targets. The step-interleaved measurement (below) changes the configuration from one step",
        "to the next inside one training of one model and compares each step with its neighbours; drift cancels.",
        "One training of a few thousand steps still moves by a few tenths of a percent from the next (see the",
        "per-training column and the A/A control), so the pairs of several trainings are pooled, and the targets",
        "are judged on the pooled median. The monitor publishes its records to the probes once a second; its",
        "publishing steps are left out of its pairs (a median would move with their share) and the publications'",
        "time, measured in a training with the monitor on every step as in use, is added back as a share of",
        "training time. What it does not see: the monitor's threads (the memory sampler once per `interval`;",
        "the endpoint when scraped) run during both kinds of steps; the scrape cost is measured separately below.",
        "",
        "## Step-interleaved: callbacks on one step in six",
        "",
        f"The demo model (2 layers, d_model 64) in GRAPH mode, {pairs['trainings']} `Model.train` calls of "
        f"{pairs['steps']} steps. A wrapper",
        "forwards step hooks by turns: step k runs the monitor when k % 6 is 0, LossMonitor + TimeMonitor when it",
        "is 2, the A/A control (a callback whose hooks only fetch cb_params) when it is 4, and nothing on odd",
        "steps. Each hooked step's interval (previous step end to its end, read after the loss is synchronised) is",
        "divided by each odd neighbour's. For grad norm every 10 steps, GradNormTrainOneStepCell and the monitor",
        "run on every step of another training, and each 10th step (where the cell runs its measuring graph and",
        "the monitor reads the norms) is divided by its neighbours; that extra is spread over the 10 steps.",
        "Cost = median ratio − 1 (per step for the last row), pooled over the trainings, with each training's",
        "own figure; the targets add the monitor's publications to the first row as described above.",
        "",
        table(
            pairs["rows"],
            [
                ("case", "case", ""),
                ("pairs", "pairs", "d"),
                ("ratio", "median ratio", ".4f"),
                ("cost", "cost per step", ".2%"),
                ("cost_low", "95% low", ".2%"),
                ("cost_high", "95% high", ".2%"),
                ("per_training", "per training", ""),
            ],
        ),
        "",
    ]
    out += _rollback_section(goods)
    for title, rounds, steps, rows in steps_tables:
        out += [
            f"## Training step time: {title}",
            "",
            f"{rounds} rounds × {steps} steps per configuration.",
            "",
            table(rows, STEP_COLUMNS),
            "",
        ]
    out += _hot_path_section(hot)
    out += [
        "## Scrape cost",
        "",
        "Sequential GETs of `/metrics` over loopback after 200 synthetic steps, with the endpoint's request budget",
        "(`web.max_requests_per_second`) off: what a request costs once it is served:",
        "",
        table(
            latency,
            [
                ("case", "case", ""),
                ("median", "median ms", ".2f"),
                ("p90", "p90 ms", ".2f"),
                ("p99", "p99 ms", ".2f"),
                ("bytes", "bytes", "d"),
                ("layer_series", "layer series", "d"),
            ],
        ),
        "",
        "Training step time (demo model, GRAPH, default monitor with the request budget off, so that 100",
        "scrapes a second are served at 100; with the default budget of 20 a second the endpoint serves at most",
        "that, see docs/reliability.md) while another process scrapes the endpoint:",
        "",
        table(
            scraped,
            [
                ("case", "case", ""),
                ("median", "median ms/step", ".2f"),
                ("p90", "p90 ms", ".2f"),
                ("n", "steps", "d"),
                ("ratio", "median / not scraped", ".3f"),
            ],
        ),
        "",
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
        *_hardware_section(readers, steps_tables),
        *_opt_in_section(opt_ins or []),
    ]
    return "\n".join(out)


def _fingerprint_row(prints: dict[str, Any]) -> str:
    """The fingerprint's line of the targets table."""
    return (
        f"| a replica fingerprint every 100 steps < 0.1% of step time (demo model, GRAPH) | "
        f"{verdict(prints['share'] * 100, TARGETS['fingerprint_share'] * 100, '%')}: a CRC-32 of the "
        f"{prints['parameters']:,} trained parameters ({prints['tensors']} tensors) in "
        f"{prints['fingerprint_ms']:.2f} ms "
        f"(median of {prints['n']}; p90 {prints['fingerprint_p90_ms']:.2f} ms) against {prints['every_n_steps']} "
        f"steps of a median {prints['step_ms']:.1f} ms (docs/divergence.md) |"
    )


def _slowness_row(cost: dict[str, Any], when: str = "") -> str:
    """The fail-slow probe's line of the targets table (benchmarks/slowness_cost.py)."""
    return (
        f"{slowness_cost.PREFIX} < 0.1% of step time (demo model, GRAPH) | "
        f"{verdict(cost['share'] * 100, TARGETS['slowness_share'] * 100, '%')}: the probe's on_step "
        f"{cost['record_us']:.1f} µs a record (median of {cost['records']:,}; p90 {cost['record_p90_us']:.1f} µs), "
        f"in the publication batches on the training thread, against a median step of {cost['step_ms']:.1f} ms; "
        f"the checkpoint advisor's refresh {cost['refresh_us']:.0f} µs every goodput.save_seconds on the saver's "
        f"thread, off the step{when} (docs/failslow.md) |"
    )


def _check_row(prints: dict[str, Any]) -> str:
    """The replica checks' line of the targets table."""
    local = prints["local"]
    return (
        f"| replica checks every step < 1% of step time (demo model, GRAPH) | "
        f"{verdict(prints['check_share'] * 100, TARGETS['check_share'] * 100, '%')}: the bit sums of "
        f"{prints['check_values']:,} values ({prints['check_tensors']} tensors: weights and optimizer state) in "
        f"{prints['check_ms']:.3f} ms (median of {prints['n']}; p90 {prints['check_p90_ms']:.3f} ms) against a "
        f"median step of {prints['step_ms']:.1f} ms ({prints['check_sums_share'] * 100:.2f}%), plus the local "
        f"gradient norm in the train cell: median step {local['local_ms']:.2f} ms against {local['plain_ms']:.2f} ms "
        f"without ({prints['local_share'] * 100:+.2f}%, {local['steps']:,} steps each, in turn); skipping outliers "
        f"too (off by default): {local['skip_ms']:.2f} ms ({prints['skip_share'] * 100:+.2f}%) (docs/sdc.md) |"
    )


def _rollback_row(goods: dict[str, Any]) -> str:
    """Rollback's line of the targets table."""
    return (
        f"| rollback: a good state every 100 steps < 2% of step time (demo model, GRAPH) | "
        f"{verdict(goods['share'] * 100, TARGETS['rollback_share'] * 100, '%')}: keeping the state of "
        f"{goods['parameters']:,} values ({goods['tensors']} Parameters, {goods['state_mib']:.1f} MiB: weights, "
        f"Adam's moments and step) as device copies takes {goods['capture_ms']:.2f} ms (median of {goods['n']}), "
        f"spread over {goods['every_n_steps']} steps of a median {goods['step_ms']:.1f} ms, plus "
        f"{goods['identity_us']:.0f} µs a step for the batch's content hashes ({', '.join(goods['batch'])}) and "
        f"{goods['health_us']:.1f} µs for the health score; a restore takes {goods['restore_ms']:.1f} ms "
        f"(docs/rollback.md) |"
    )


def _rollback_section(goods: dict[str, Any]) -> list[str]:
    """Keeping and restoring a good state by its size."""
    return [
        "## Rollback: keeping and restoring a good state by its size",
        "",
        "A state of 16 float32 Parameters of the given total size (GRAPH mode), kept and restored by",
        "`ms_exporter/actions/good_state.py` as device copies (memory: a copy of each Parameter on the device",
        "where it lives, here the CPU) and on disk (the same copies, written by a background thread into one",
        "uncompressed .npz under `save_dir/good-states`, to a temporary name then renamed); median of 5 keeps",
        "and 3 restores. A keep is what the training thread spends (the device copies); the disk write is the",
        "background thread's. In memory a keep reuses the memory of the state let go last, once there is one",
        "(from the third keep on here). On an accelerator a device copy runs at the speed of its memory, queued",
        "behind the step: these CPU figures do not carry over (docs/rollback.md says what a keep costs there).",
        "",
        table(
            goods["by_size"],
            [
                ("mib", "state MiB", "d"),
                ("memory_capture_ms", "memory: keep ms", ".1f"),
                ("memory_restore_ms", "memory: restore ms", ".1f"),
                ("disk_capture_ms", "disk: keep ms", ".1f"),
                ("disk_write_ms", "disk: write ms (background)", ".1f"),
                ("disk_restore_ms", "disk: restore ms", ".1f"),
            ],
        ),
        "",
    ]


def _hot_path_section(hot: list[dict[str, Any]]) -> list[str]:
    """The hot path's section: the Callback's hooks and the loop API on the same synthetic step."""
    return [
        "## The hot path alone",
        "",
        "`on_train_step_begin` + `on_train_step_end` on a synthetic step: real MindSpore optimizer (decaying LR",
        "schedule), a real padded batch (the attention mask is read), 40 parameters. The loss is handed over as",
        "a float; reading it from a Tensor is measured on its own in the fifth row. Most steps only record; the",
        "records go through the probes every second, so the mean (publications spread over every step) is the",
        "cost per step and the median the cost of a step that only records.",
        "",
        table(
            hot,
            [
                ("case", "case", ""),
                ("mean_us", "mean µs", ".1f"),
                ("median_us", "median µs", ".1f"),
                ("p90_us", "p90 µs", ".1f"),
                ("p99_us", "p99 µs", ".1f"),
                ("n", "calls", "d"),
            ],
        ),
        "",
        "With 7-tuple outputs (MindSpore Transformers' shape) the overflow flag is read every step; at sampled",
        "steps the norms are moved to the host and turned into layer series. The loop API rows drive the same step",
        "through `monitor.steps()` (the step's begin) and `monitor.step_end()`, from one step_end's return to the",
        "next; with `grads=` the gradients' norms are taken on the device by one compiled reduction at the sampled",
        "steps (every 10th) and read in one transfer: its cost grows with the gradients' bytes (the last loop row:",
        "10.5 M parameters, a CPU reading them at memory speed).",
        "",
    ]


def _opt_in_section(rows: list[dict[str, Any]]) -> list[str]:
    """The sampled, opt-in features (docs/update-ratio.md): what one sample costs, and where."""
    if not rows:
        return []
    return [
        "",
        "## Opt-in features, per sample",
        "",
        "Off by default, so the default cost above does not include them. One sample of each, called as the callback",
        "calls it, on the trained GRAPH-mode model (benchmarks/opt_in.py); the share is the sample's time over the",
        "model's own steps at the feature's default interval (`update_ratio.every_n_steps` 100,",
        "`tensorboard.collect_freq` 10, `data_quality.every_n_steps` 1). Only the training thread's part adds to a",
        "step; the writer thread's part takes a core beside it. Activation statistics switch compiled graphs around",
        "their measured steps, so a call cannot be timed alone: `python -m benchmarks.activations` times whole",
        "trainings with them ([activations.md](activations.md#what-it-costs)).",
        "",
        table(
            rows,
            [
                ("case", "model: feature", ""),
                ("where", "where", ""),
                ("median", "median ms", ".2f"),
                ("p90", "p90 ms", ".2f"),
                ("n", "samples", "d"),
                ("step_ms", "step ms", ".1f"),
                ("every", "every n steps", "d"),
                ("share", "share of those steps", ".2e"),
            ],
        ),
    ]


def _hardware_section(
    readers: list[dict[str, Any]], steps_tables: list[tuple[str, int, int, list[dict[str, Any]]]]
) -> list[str]:
    """The hardware monitor (docs/hardware.md): each reader's time per sample, and whole trainings with it off."""
    rows = [
        (title, row)
        for title, _, _, table_rows in steps_tables
        for row in table_rows
        if "hardware" in row["case"] or row["case"] == "TrainingMonitor, defaults"
    ]
    lines = [
        "## Hardware readers",
        "",
        "The hardware monitor is on by default and reads on threads of its own, never on the step path",
        "(docs/hardware.md). Each reader's time per sample, on its thread, and that time as a share of one core at",
        "the default `hardware.interval` (10 s). The host reader ran for real; NVML against the scripted binding",
        "of tests/support/fake_nvml.py (no GPU here: the reader's own Python side, without the driver's time);",
        "npu-smi is not timed here (its cost is the npu-smi process's on an Ascend host).",
        "",
        table(
            readers,
            [
                ("case", "reader", ""),
                ("median", "median ms", ".3f"),
                ("p90", "p90 ms", ".3f"),
                ("p99", "p99 ms", ".3f"),
                ("n", "samples", "d"),
                ("share_at_default", "share of a core at 10 s", ".2e"),
            ],
        ),
        "",
        "Whole trainings (the rounds of the step-time tables above) with the default monitor, with its hardware",
        "monitor off, and with it reading every 0.5 s (20 times the default rate): the ratio to no callbacks.",
        "The step-interleaved figures cannot see a thread that runs beside every step alike; these rounds can,",
        "within the spread of the no-callbacks control.",
        "",
    ]
    lines += [
        f"- {title}: {row['case']}: {row['ratio']:.3f} ({row['ratio_low']:.3f} to {row['ratio_high']:.3f})"
        for title, row in rows
    ]
    return [*lines, ""]


if __name__ == "__main__":
    sys.exit(main())
