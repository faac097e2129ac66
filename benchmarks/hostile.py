"""`make reliability`'s hostile cases: clients that try to take the endpoint down or slow training through it.

Each case trains the demo Transformer with the monitor while an attacker process (benchmarks/hostile_load.py, or
wrk with benchmarks/wrk_check.lua) is switched on and off in blocks of steps, as the load cases of
benchmarks/reliability.py are, and a well-behaved scraper (4 scrapes a second, a new connection each) runs all
along. Reported: the step time ratio of attacked blocks over their neighbours, and the scraper's latencies.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks.blocks import SETTLE_STEPS, block_ratios, train_in_blocks
from benchmarks.report import table
from benchmarks.stats import median_interval

ROOT = Path(__file__).resolve().parents[1]
USER, PASSWORD = "prometheus", "scrape-me-please"
# (key, what the attacker does, which monitor it attacks)
CASES = (
    ("slowloris", "50 sockets, each sending one byte of a request head a second (reopened when dropped)", "open"),
    ("silent", "200 connections that never send a byte (reopened when dropped)", "open"),
    (
        "password",
        "wrong passwords for a user with a bcrypt hash (cost 10), a new one per request, 20 requests/s",
        "auth",
    ),
    ("series", "GET /api/series?since=-1 (the live page's whole history), 50 requests/s", "open"),
)
FLOOD_CONNECTIONS = 8
FLOOD_RATES = {"password": 20.0, "series": 50.0}


def _attacker(case: str, url: str) -> subprocess.Popen[str]:
    host_port = url.split("//", 1)[1].split("/", 1)[0]
    host, port = host_port.rsplit(":", 1)
    if case in ("slowloris", "silent"):
        count = 50 if case == "slowloris" else 200
        return subprocess.Popen(
            [sys.executable, "-m", "benchmarks.hostile_load", case, host, port, str(count)],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            text=True,
            cwd=ROOT,
        )
    delay_ms = max(1, round(1000 * FLOOD_CONNECTIONS / FLOOD_RATES[case]))
    return subprocess.Popen(
        [
            "wrk",
            "-t1",
            f"-c{FLOOD_CONNECTIONS}",
            "-d600s",
            "--timeout",
            "5s",
            "-s",
            str(ROOT / "benchmarks" / "wrk_check.lua"),
            f"http://{host_port}/",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
        env={**os.environ, "DELAY_MS": str(delay_ms), "MODE": case, "USER_NAME": USER},
    )


def _stop_attacker(case: str, attacker: subprocess.Popen[str]) -> dict[str, Any]:
    attacker.send_signal(signal.SIGCONT)
    if case in ("slowloris", "silent"):
        attacker.kill()
        attacker.wait(10)
        return {}
    time.sleep(0.5)  # wrk ignores a SIGINT right after SIGCONT
    attacker.send_signal(signal.SIGINT)
    out, _ = attacker.communicate(timeout=30)
    return dict(json.loads(next(line for line in reversed(out.splitlines()) if line.startswith("{"))))


def hostile(passes: int, blocks: int, block_steps: int) -> list[dict[str, Any]]:
    import bcrypt
    import mindspore as ms
    from mindspore import nn
    from mindspore.train import Model

    from ms_exporter import TrainingMonitor
    from ms_exporter.demo import build_network, synthetic_dataset

    ms.set_context(mode=ms.GRAPH_MODE)
    ms.set_seed(0)
    network = build_network()
    model = Model(network, optimizer=nn.AdamWeightDecay(network.trainable_params(), 1e-4))
    hashed = bcrypt.hashpw(PASSWORD.encode(), bcrypt.gensalt(10)).decode()
    monitors = {
        "open": TrainingMonitor(port=0, project="hostile"),
        "auth": TrainingMonitor(port=0, project="hostile-auth", web={"basic_auth_users": {USER: hashed}}),
    }
    ratios: dict[str, list[float]] = {case: [] for case, _, _ in CASES}
    latencies: dict[str, list[float]] = {case: [] for case, _, _ in CASES}
    attacks: dict[str, dict[str, float]] = {case: {} for case, _, _ in CASES}
    medians: dict[str, list[float]] = {case: [] for case, _, _ in CASES}
    try:
        for monitor in monitors.values():  # compile, and give each endpoint a full page
            model.train(1, synthetic_dataset(size=16 * 5), callbacks=[monitor], dataset_sink_mode=False)
        for pass_index in range(passes):
            for case, _, target in CASES:
                attack, scraped, timer = _attacked_training(
                    model, monitors[target], case, target == "auth", blocks, block_steps, pass_index
                )
                for key, value in attack.items():
                    attacks[case][key] = attacks[case].get(key, 0.0) + value
                latencies[case] += scraped
                ratios[case] += block_ratios(timer.steps, settle=SETTLE_STEPS)
                medians[case].append(float(np.median([interval for _, _, interval in timer.steps])))
    finally:
        for monitor in monitors.values():
            monitor.close()
    return _summary(ratios, latencies, attacks, medians)


def _attacked_training(
    model: Any,
    monitor: Any,
    case: str,
    authenticated: bool,
    blocks: int,
    block_steps: int,
    pass_index: int,
) -> tuple[dict[str, Any], list[float], Any]:
    """One training whose blocks alternate unattacked and attacked, with the well-behaved scraper all along: what
    the attacker saw, the scraper's latencies, and the block timer."""
    url = monitor.url or ""
    scraper = _scraper(url, authenticated=authenticated)
    attacker = _attacker(case, url)
    time.sleep(2.0)  # connected and at its pace
    timer = train_in_blocks(model, monitor, attacker, blocks, block_steps, pass_index)
    attack = _stop_attacker(case, attacker)
    scraper.send_signal(signal.SIGTERM)
    out, _ = scraper.communicate(timeout=30)
    return attack, json.loads(out.strip().splitlines()[-1])["latencies"], timer


def _scraper(url: str, authenticated: bool) -> subprocess.Popen[str]:
    """A well-behaved scraper of `url` in a process of its own; it prints its latencies when terminated."""
    return subprocess.Popen(
        [
            sys.executable,
            "-m",
            "benchmarks.hostile_load",
            "scrape",
            url,
            *([f"{USER}:{PASSWORD}"] if authenticated else []),
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
        cwd=ROOT,
    )


def _summary(
    ratios: dict[str, list[float]],
    latencies: dict[str, list[float]],
    attacks: dict[str, dict[str, float]],
    medians: dict[str, list[float]],
) -> list[dict[str, Any]]:
    """A row per case: the attacked blocks' step ratio (bootstrap 95% interval), the scraper's latencies, the attack."""
    rows = []
    rng = np.random.default_rng(0)
    for case, what, _ in CASES:
        values = np.asarray(ratios[case])
        low, high = median_interval(values, rng)
        seen = np.asarray(latencies[case])
        attack = attacks[case]
        rows.append(
            {
                "case": case,
                "what": what,
                "median": float(np.median(medians[case])) * 1e3,
                "pairs": len(values),
                "ratio": float(np.median(values)),
                "ratio_low": float(low),
                "ratio_high": float(high),
                "scrapes": len(seen),
                "failed": int(np.sum(seen >= 5.0)),
                "p50_ms": float(np.percentile(seen, 50)) * 1e3,
                "p99_ms": float(np.percentile(seen, 99)) * 1e3,
                "max_ms": float(seen.max()) * 1e3,
                "attack": (
                    f"{attack['sent']:.0f} requests, {attack['ok']:.0f} answered as expected, "
                    f"{attack['bad'] + attack['socket_errors']:.0f} other"
                    if attack
                    else ""
                ),
            }
        )
    return rows


def render_hostile(
    rows: list[dict[str, Any]], blocks: int, block_steps: int, passes: int, measured_apart: str = ""
) -> str:
    """The section; `measured_apart` says when and how it was measured if not with the rest of its block."""
    verdicts = "\n".join(
        f"- {r['case']}: scrape p99 {r['p99_ms']:.0f} ms ({'met' if r['p99_ms'] < 1000 else 'missed'}: under 1 s), "
        f"{r['failed']} of {r['scrapes']} scrapes failed; step time x{r['ratio']:.3f} (95% interval "
        f"x{r['ratio_low']:.3f} to x{r['ratio_high']:.3f}; "
        f"{'met' if r['ratio_high'] < 1.05 else 'not demonstrated' if r['ratio'] < 1.05 else 'missed'}: under x1.05)"
        for r in rows
    )
    cases = "\n".join(f"- **{r['case']}**: {r['what']}" + (f" ({r['attack']})" if r["attack"] else "") for r in rows)
    shown = table(
        rows,
        [
            ("case", "attack", ""),
            ("scrapes", "scrapes", "d"),
            ("failed", "failed", "d"),
            ("p50_ms", "scrape p50 ms", ".1f"),
            ("p99_ms", "scrape p99 ms", ".1f"),
            ("max_ms", "max ms", ".0f"),
            ("median", "median ms/step", ".2f"),
            ("pairs", "block pairs", "d"),
            ("ratio", "step time ratio", ".3f"),
            ("ratio_low", "95% low", ".3f"),
            ("ratio_high", "95% high", ".3f"),
        ],
    )
    return f"""### Hostile clients during training
{measured_apart}The same training and block method ({blocks} attacked blocks of {block_steps} steps per training,
{passes} passes, the first {SETTLE_STEPS} steps of each block left out), the default monitor (the password case with one
bcrypt user). The attacker is paused (SIGSTOP) in the unattacked blocks: open connections stay open, so the
slowloris and silent cases measure what their traffic costs. A well-behaved scraper (a new connection every
0.25 s, 5 s timeout; a failure counts as 5 s) runs all along, attacked or not:

{cases}

{shown}

{verdicts}"""


HEADING, NEXT_HEADING = "### Hostile clients during training", "\n\n### Soak"


def replace_section(document: str, section: str) -> str:
    """`document` with its hostile-clients section (up to the soak's heading) replaced by `section`."""
    head, rest = document.split(HEADING, 1)
    return head + section + NEXT_HEADING + rest.split(NEXT_HEADING, 1)[1]
