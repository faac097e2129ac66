"""What a scrape costs: /metrics latency and size, and training step time while being scraped."""

from __future__ import annotations

import subprocess
import sys
import time
import urllib.request
from typing import Any

from benchmarks.harness import SyntheticRun
from benchmarks.report import TARGETS, table, verdict
from benchmarks.stats import summary

# The endpoint's request budget (web.max_requests_per_second, 20 by default) is off here: these figures are
# what a request costs once it is served, and 100 scrapes a second would otherwise be served at 20.
UNLIMITED: dict[str, Any] = {"web": {"max_requests_per_second": 0}}
# A separate process scrapes at a fixed rate for a bounded time, like Prometheus would.
_SCRAPER = """
import sys, time, urllib.request
url, rate, seconds = sys.argv[1], float(sys.argv[2]), float(sys.argv[3])
end = time.monotonic() + seconds
count = 0
while time.monotonic() < end:
    began = time.monotonic()
    urllib.request.urlopen(url, timeout=5).read()
    count += 1
    time.sleep(max(0.0, 1.0 / rate - (time.monotonic() - began)))
print(count)
"""


def latency(scrapes: int) -> list[dict[str, Any]]:
    """p50/p99 of sequential GETs on loopback, after 200 synthetic steps filled the store."""
    from ms_exporter import TrainingMonitor

    rows = []
    cases: list[tuple[str, str, dict[str, Any]]] = [
        ("defaults, 1 rank", "scalar", {}),
        (
            "20 layer series (15 watched + top 5)",
            "tuple",
            {"grad_norm": {"every_n_steps": 1, "layers": ["block"], "top_k": 5, "max_series": 20}},
        ),
    ]
    for label, outputs, options in cases:
        run = SyntheticRun(outputs)
        monitor = TrainingMonitor(port=0, **options, **UNLIMITED)
        try:
            url = monitor.url
            assert url is not None, "the default backend, prometheus, serves /metrics: the monitor has its URL"
            run.begin(monitor)
            for _ in range(200):
                run.step(monitor)
            times, size = [], 0
            for _ in range(scrapes):
                began = time.perf_counter()
                with urllib.request.urlopen(url, timeout=5) as response:
                    size = len(response.read())
                times.append(time.perf_counter() - began)
            layer_series = sum(
                1
                for line in urllib.request.urlopen(url).read().decode().splitlines()
                if line.startswith("mindspore_train_layer_grad_norm{")
            )
        finally:
            monitor.close()
        rows.append({"case": label, **summary(times), "bytes": size, "layer_series": layer_series})
    return rows


def during_training(rates: list[float], rounds: int, steps: int) -> list[dict[str, Any]]:
    """Demo model in GRAPH mode with the default monitor; each round trains `steps` steps per scrape rate."""
    import mindspore as ms
    from mindspore import nn
    from mindspore.train import Model

    from benchmarks.training import StepTimer
    from ms_exporter import TrainingMonitor
    from ms_exporter.demo import build_network, synthetic_dataset

    ms.set_context(mode=ms.GRAPH_MODE)
    ms.set_seed(0)
    network = build_network()
    model = Model(network, optimizer=nn.AdamWeightDecay(network.trainable_params(), 1e-4))
    monitor = TrainingMonitor(port=0, **UNLIMITED)
    timers = {rate: StepTimer() for rate in rates}
    scrapes = {rate: 0 for rate in rates}
    try:
        model.train(1, synthetic_dataset(size=16 * 5), callbacks=[monitor], dataset_sink_mode=False)
        for round_index in range(rounds):
            for rate in rates:
                if _scraped_round(model, monitor, timers[rate], rate, steps, round_index):
                    scrapes[rate] += 1
    finally:
        monitor.close()
    return _while_scraped_rows(rates, timers)


def _scraped_round(model: Any, monitor: Any, timer: Any, rate: float, steps: int, round_index: int) -> bool:
    """`steps` steps timed while another process scrapes at `rate` a second (none at 0): whether it scraped."""
    from ms_exporter.demo import synthetic_dataset

    timer.last = None
    before = len(timer.times)
    scraper = None
    if rate > 0:
        # Long enough to cover the round; stopped when the round ends.
        scraper = subprocess.Popen(
            [sys.executable, "-c", _SCRAPER, monitor.url or "", str(rate), "120"],
            stdout=subprocess.PIPE,
            text=True,
        )
        time.sleep(0.3)
    model.train(
        1,
        synthetic_dataset(size=16 * steps, seed=round_index),
        callbacks=[monitor, timer.callback],
        dataset_sink_mode=False,
    )
    del timer.times[before : before + 2]
    if scraper is None:
        return False
    scraper.terminate()
    scraper.wait(10)
    return True


def _while_scraped_rows(rates: list[float], timers: dict[float, Any]) -> list[dict[str, Any]]:
    """A row per scrape rate: its step time, and its ratio to the first rate's (not scraped)."""
    base = None
    rows = []
    for rate in rates:
        stats = summary(timers[rate].times)
        base = base or stats["median"]
        rows.append(
            {
                "case": "not scraped" if rate == 0 else f"scraped {rate:g}/s from another process",
                **stats,
                "ratio": stats["median"] / base,
            }
        )
    return rows


def target_row(latency: list[dict[str, Any]]) -> str:
    """The scrape's line of the targets table: the worst p99 of the cases."""
    scrape_p99 = max(row["p99"] for row in latency)
    return f"| /metrics p99 < 5 ms | {verdict(scrape_p99, TARGETS['scrape_p99_ms'], 'ms')} (worst case below) |"


def scrape_section(latency: list[dict[str, Any]], scraped: list[dict[str, Any]]) -> list[str]:
    """What a scrape costs, and a training's step time while it is scraped."""
    return [
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
    ]
