"""`make reliability`: the endpoint under load during real training, and a soak with every backend on.

Rewrites docs/reliability.md's measured block with the figures, the machine and the command.

    python -m benchmarks.reliability [--quick] [--output docs/reliability.md]
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks.blocks import SETTLE_STEPS, block_ratios, train_in_blocks
from benchmarks.report import machine, table, write_section
from benchmarks.stats import median_interval
from ms_exporter.config import WebConfig
from tests.support.waiting import free_port

BEGIN, END = "<!-- measured:begin -->", "<!-- measured:end -->"

# wrk (Debian's) keeps up the request rate from another process: C and epoll, so the load generator itself
# takes little of the CPU the training needs; a Lua script paces each connection and checks every response.
WRK_SCRIPT = Path(__file__).with_name("wrk_check.lua")
CONNECTIONS = 8
BUDGET = WebConfig().max_requests_per_second  # the default endpoint's request budget


def start_load(url: str, rate: float, keep_alive: bool) -> subprocess.Popen[str]:
    delay_ms = max(1, round(1000 * CONNECTIONS / rate))
    return subprocess.Popen(
        ["wrk", "-t1", f"-c{CONNECTIONS}", "-d600s", "--timeout", "5s", "-s", str(WRK_SCRIPT), url],
        stdout=subprocess.PIPE,
        text=True,
        env={**os.environ, "DELAY_MS": str(delay_ms), "CLOSE": "0" if keep_alive else "1"},
    )


def stop_load(loader: subprocess.Popen[str]) -> dict[str, Any]:
    loader.send_signal(signal.SIGINT)  # wrk stops, then runs done() with what it saw
    out, _ = loader.communicate(timeout=30)
    line = next(line for line in reversed(out.splitlines()) if line.startswith("{"))
    result: dict[str, Any] = json.loads(line)
    return result


class StaticCopy:
    """Debian's nginx serving a copy of the rank's page from another process: the floor of what any server,
    however efficient, costs this machine's training at the same request rate (wrk and the kernel included)."""

    def __init__(self, page: bytes) -> None:
        self._dir = tempfile.TemporaryDirectory(prefix="ms_exporter_nginx_")
        root = Path(self._dir.name)
        (root / "html").mkdir()
        (root / "html" / "metrics").write_bytes(page)
        self.port = free_port()
        (root / "nginx.conf").write_text(
            f"worker_processes 1; daemon off; pid {root}/nginx.pid; error_log {root}/error.log;\n"
            f"events {{ worker_connections 256; }}\n"
            f"http {{ access_log off; default_type text/plain; keepalive_requests 100; client_body_temp_path {root};\n"
            f"  server {{ listen 127.0.0.1:{self.port}; root {root}/html; }} }}\n"
        )
        self._process = subprocess.Popen(["nginx", "-c", str(root / "nginx.conf")], stderr=subprocess.DEVNULL)
        self.url = f"http://127.0.0.1:{self.port}/metrics"
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=1):
                    return
            except OSError:
                time.sleep(0.1)
        raise RuntimeError("nginx did not start")

    def close(self) -> None:
        self._process.terminate()
        self._process.wait(10)
        self._dir.cleanup()


def load(rates: list[float], passes: int, blocks: int, block_steps: int) -> list[dict[str, Any]]:
    """The demo Transformer in GRAPH mode, default monitor. For each case (the rank's endpoint or nginx serving a
    copy of the page, each rate, kept-alive or new connections) one training alternates unloaded and loaded
    blocks of `block_steps` steps; cases take turns, `passes` times over."""
    from ms_exporter import TrainingMonitor

    model = _demo_model()
    # The default monitor (its endpoint serves at most web.max_requests_per_second, 20) and one without that
    # budget, which shows what the endpoint's requests themselves cost.
    monitors = {
        "monitor": TrainingMonitor(port=0),
        "unlimited": TrainingMonitor(port=0, web={"max_requests_per_second": 0}),
    }
    static: StaticCopy | None = None
    cases = [
        (target, rate, keep) for target in ("monitor", "unlimited", "nginx") for rate in rates for keep in (True, False)
    ]
    ratios: dict[tuple[str, float, bool], list[float]] = {case: [] for case in cases}
    responses: dict[tuple[str, float, bool], dict[str, float]] = {case: {} for case in cases}
    loaded_seconds = dict.fromkeys(cases, 0.0)
    medians: dict[tuple[str, float, bool], list[float]] = {case: [] for case in cases}
    try:
        static = _warm_up(model, monitors)
        for pass_index in range(passes):
            for case in cases:
                target, rate, keep_alive = case
                monitor = monitors.get(target, monitors["monitor"])  # nginx's cases train with the default one
                url = static.url if target == "nginx" else monitor.url or ""
                answered, timer = _loaded_training(
                    model, monitor, url, rate, keep_alive, blocks, block_steps, pass_index
                )
                for key, value in answered.items():
                    responses[case][key] = responses[case].get(key, 0) + value
                ratios[case] += block_ratios(timer.steps, settle=SETTLE_STEPS)
                loaded_seconds[case] += timer.loaded_seconds + 1.5  # and the lead-in and tail around training
                medians[case].append(float(np.median([interval for _, _, interval in timer.steps])))
    finally:
        for monitor in monitors.values():
            monitor.close()
        if static is not None:
            static.close()
    return _summary(cases, ratios, responses, loaded_seconds, medians, passes)


def _demo_model() -> Any:
    """The demo Transformer in GRAPH mode with AdamWeightDecay, seeded."""
    import mindspore as ms
    from mindspore import nn
    from mindspore.train import Model

    from ms_exporter.demo import build_network

    ms.set_context(mode=ms.GRAPH_MODE)
    ms.set_seed(0)
    network = build_network()
    return Model(network, optimizer=nn.AdamWeightDecay(network.trainable_params(), 1e-4))


def _warm_up(model: Any, monitors: dict[str, Any]) -> StaticCopy:
    """Compiles, gives each endpoint a full page, and starts nginx serving a copy of the default one's."""
    from ms_exporter.demo import synthetic_dataset

    for monitor in monitors.values():
        model.train(1, synthetic_dataset(size=16 * 5), callbacks=[monitor], dataset_sink_mode=False)
    with urllib.request.urlopen(monitors["monitor"].url or "", timeout=5) as response:
        return StaticCopy(response.read())


def _loaded_training(
    model: Any,
    monitor: Any,
    url: str,
    rate: float,
    keep_alive: bool,
    blocks: int,
    block_steps: int,
    pass_index: int,
) -> tuple[dict[str, Any], Any]:
    """One training whose blocks alternate unloaded and loaded: what wrk saw, and the block timer."""
    loader = start_load(url, rate, keep_alive)
    time.sleep(1.0)  # connected and running at its pace
    timer = train_in_blocks(model, monitor, loader, blocks, block_steps, pass_index)
    loader.send_signal(signal.SIGCONT)
    time.sleep(0.5)  # wrk ignores a SIGINT that arrives right after SIGCONT (seen with Debian's 4.1)
    return stop_load(loader), timer


def _summary(
    cases: list[tuple[str, float, bool]],
    ratios: dict[tuple[str, float, bool], list[float]],
    responses: dict[tuple[str, float, bool], dict[str, float]],
    loaded_seconds: dict[tuple[str, float, bool], float],
    medians: dict[tuple[str, float, bool], list[float]],
    passes: int,
) -> list[dict[str, Any]]:
    """A row per case: the loaded blocks' step ratio (bootstrap 95% interval) and what the load achieved."""
    rows = []
    rng = np.random.default_rng(0)
    for case in cases:
        target, rate, keep_alive = case
        values = np.asarray(ratios[case])
        low, high = median_interval(values, rng)
        answered = responses[case]
        how = "kept-alive connections" if keep_alive else "a new connection per request"
        label = {
            "monitor": f"the rank's /metrics (defaults: a budget of {BUDGET:g} requests/s), {rate:g} requests/s "
            f"wanted, {how}",
            "unlimited": f"the rank's /metrics without the request budget, {rate:g} requests/s wanted, {how}",
            "nginx": f"nginx serving a copy of the page, {rate:g} requests/s wanted, {how} (the floor)",
        }[target]
        rows.append(
            {
                "case": label,
                "target": target,
                "rate": rate,
                "keep_alive": keep_alive,
                "median": float(np.median(medians[case])) * 1e3,
                "pairs": len(values),
                "ratio": float(np.median(values)),
                "ratio_low": float(low),
                "ratio_high": float(high),
                "achieved": answered["sent"] / loaded_seconds[case] if loaded_seconds[case] else 0.0,
                "ok": int(answered.get("ok", 0)),
                "bad": int(answered.get("bad", 0) + answered.get("socket_errors", 0)),
                "p90_ms": answered.get("p90_ms", 0.0) / max(1, passes),
            }
        )
    return rows


_SOAK = """
import json, sys, threading, time, urllib.request
import mindspore as ms, psutil
from mindspore import nn
from mindspore.train import Callback, Model
from ms_exporter import TrainingMonitor
from ms_exporter.demo import build_network, synthetic_dataset
from tests.support.otlp_receiver import GrpcReceiver

steps, save_dir, every = int(sys.argv[1]), sys.argv[2], int(sys.argv[3])
receiver = GrpcReceiver(keep=1)  # keeping every request would measure the receiver's memory, not the monitor's
ms.set_context(mode=ms.GRAPH_MODE)
ms.set_seed(0)
network = build_network()
model = Model(network, optimizer=nn.AdamWeightDecay(network.trainable_params(), 1e-4))
monitor = TrainingMonitor(port=0, backend=["prometheus", "local", "otlp"], save_dir=save_dir, interval=1,
                          otlp={"endpoint": receiver.endpoint, "interval": 1, "timeout": 5},
                          grad_norm={"every_n_steps": 10})
process = psutil.Process()
rss = []
stop = threading.Event()
scrapes = [0]
def scrape():
    while not stop.wait(1.0):
        urllib.request.urlopen(monitor.url, timeout=5).read()
        scrapes[0] += 1
threading.Thread(target=scrape, daemon=True).start()

class Sample(Callback):
    def on_train_step_end(self, run_context):
        step = run_context.original_args().cur_step_num
        if step % every == 0:
            rss.append((step, process.memory_info().rss))

model.train(1, synthetic_dataset(size=16 * steps), callbacks=[monitor, Sample()], dataset_sink_mode=False)
stop.set()
page = urllib.request.urlopen(monitor.url, timeout=5).read().decode()
monitor.close()
dropped = [line for line in page.splitlines() if line.startswith("mindspore_exporter_dropped_samples_total{")]
errors = [line for line in page.splitlines() if line.startswith("mindspore_exporter_errors_total{")]
print(json.dumps({"rss": rss, "scrapes": scrapes[0], "otlp_requests": receiver.count,
                  "dropped": dropped, "errors": errors}))
receiver.stop()
"""


def soak(steps: int, every: int) -> dict[str, Any]:
    """A fresh process trains `steps` steps with prometheus, local and otlp on, scraped at 1/s; RSS per `every`."""
    with tempfile.TemporaryDirectory(prefix="ms_exporter_soak_") as scratch:
        done = subprocess.run(
            [sys.executable, "-c", _SOAK, str(steps), scratch, str(every)],
            capture_output=True,
            text=True,
            check=False,
            cwd=Path(__file__).resolve().parents[1],
        )
        if done.returncode != 0:
            raise RuntimeError(f"soak failed: {done.stderr[-2000:]}")
        result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
        result["jsonl_bytes"] = sum(p.stat().st_size for p in Path(scratch).glob("*.jsonl*"))
    return result


def render(
    command: str,
    rows: list[dict[str, Any]],
    soaked: dict[str, Any],
    blocks: int,
    block_steps: int,
    seconds: float,
    passes: int,
    hostile_block: str,
) -> str:
    return f"""{BEGIN}
Measured on {datetime.date.today().isoformat()} with `{command}` ({seconds / 60:.0f} min) on: {machine()}.

{_load_section(rows, blocks, block_steps, passes)}

{hostile_block}

{_soak_section(soaked)}
{END}"""


def _load_section(rows: list[dict[str, Any]], blocks: int, block_steps: int, passes: int) -> str:
    """The endpoint under load: how it was loaded, the table, and a verdict per loaded case."""
    return f"""### Endpoint under load during training
The demo Transformer (2 layers, d_model 64) in GRAPH mode with the default monitor; a separate process keeps
up the request rate: Debian's `wrk` with {CONNECTIONS} connections paced by `benchmarks/wrk_check.lua`, which
checks every response (status 200, a complete body with the step counter). wrk keeps its connections alive
(HTTP/1.1), as Prometheus does between scrapes; with `Connection: close` every request is a new connection
(the costlier case, shown too). The rank's endpoint is loaded twice: with the default settings, whose
request budget (`web.max_requests_per_second: {BUDGET:g}`) reads and answers {BUDGET:g} requests a second and
bursts of a second's worth (wrk's other requests wait their turn; the budget refills while wrk is stopped,
so a loaded block gets its own share plus what the unloaded block before it saved, about twice the
budget), and with the budget off (every request served, which shows what requests themselves cost).
Within one training per case, wrk is switched off (SIGSTOP) and on (SIGCONT) every {block_steps} steps,
{blocks} loaded blocks per training, cases in turn, {passes} passes; the first {SETTLE_STEPS} steps of each block
are left out (the load starting or draining). The ratio is each loaded block's median step time over each
unloaded neighbour's: the median of those ratios, with a bootstrap 95% interval.
Latency is given at p90: requests in flight when wrk is stopped wait for the next loaded block.

{_load_table(rows)}

{_load_verdicts(rows)}"""


def _load_table(rows: list[dict[str, Any]]) -> str:
    return table(
        rows,
        [
            ("case", "load on /metrics", ""),
            ("achieved", "requests/s achieved (while wrk ran)", ".0f"),
            ("ok", "well-formed responses", "d"),
            ("bad", "bad or failed", "d"),
            ("p90_ms", "response p90 ms (mean of passes)", ".1f"),
            ("median", "median ms/step", ".2f"),
            ("pairs", "block pairs", "d"),
            ("ratio", "step time ratio (median of block pairs)", ".3f"),
            ("ratio_low", "95% low", ".3f"),
            ("ratio_high", "95% high", ".3f"),
        ],
    )


def _load_verdicts(rows: list[dict[str, Any]]) -> str:
    """A line per case on the rank's endpoint, beside nginx's ratio at the same load."""
    ours = [r for r in rows if r["target"] in ("monitor", "unlimited")]
    floor = {(r["rate"], r["keep_alive"]): r["ratio"] for r in rows if r["target"] == "nginx"}
    return "\n".join(
        f"- {r['rate']:g} requests/s, {'kept-alive connections' if r['keep_alive'] else 'a new connection each'}, "
        f"{'default settings' if r['target'] == 'monitor' else 'request budget off'}: step time x{r['ratio']:.3f} "
        f"(95% interval x{r['ratio_low']:.3f} to x{r['ratio_high']:.3f}), x{floor[(r['rate'], r['keep_alive'])]:.3f} "
        f"with nginx serving the same page; target: under x1.05: {_judge(r['ratio'], r['ratio_high'])}"
        for r in ours
    )


def _soak_section(soaked: dict[str, Any]) -> str:
    """The soak: what ran, RSS through the run, and the counters that should have stayed at 0."""
    rss = soaked["rss"]
    mib = [(step, value / 2**20) for step, value in rss]
    quarter = next((v for s, v in mib if s >= mib[-1][0] // 4), mib[0][1])
    growth = mib[-1][1] - quarter
    rss_rows = [{"step": step, "rss": value} for step, value in mib]
    rss_table = table(rss_rows, [("step", "step", "d"), ("rss", "RSS MiB", ".1f")])
    return f"""### Soak: {rss[-1][0]:,} steps with the prometheus, local and otlp backends
One fresh process, `grad_norm.every_n_steps: 10`, scraped once a second ({soaked["scrapes"]} scrapes),
exporting OTLP every second to a gRPC receiver in the same process ({soaked["otlp_requests"]} requests), JSON
Lines flushed every second ({soaked["jsonl_bytes"] / 2**20:.1f} MiB written).

{rss_table}

RSS from a quarter of the run to the end: {growth:+.1f} MiB. Dropped records and absorbed errors at the end:
{_nonzero(soaked["dropped"] + soaked["errors"])}."""


def _judge(ratio: float, high: float) -> str:
    if high < 1.05:
        return "met"
    if ratio < 1.05:
        return f"not demonstrated: the interval reaches x{high:.3f}"
    return f"missed by {ratio - 1.05:.3f}"


def _nonzero(lines: list[str]) -> str:
    shown = [f"`{line}`" for line in lines if not line.endswith(" 0.0")]
    return ", ".join(shown) if shown else "none (every dropped-sample and error counter at 0)"


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    command = "make reliability" if not args.quick else "python -m benchmarks.reliability --quick"
    started = time.monotonic()
    # Blocks of 30 steps (~0.4 s): a stopped wrk's kept-alive connections stay under the endpoint's 1 s idle limit.
    passes, blocks, block_steps = (1, 2, 20) if args.quick else (2, 20, 30)
    if args.hostile_only:
        return _hostile_only(Path(args.output), started, passes, blocks, block_steps)
    print("endpoint under load ...", flush=True)
    rows = load([300, 600], passes, blocks, block_steps)
    attacked = _attacked(passes, blocks, block_steps)
    print("soak ...", flush=True)
    soaked = soak(500 if args.quick else 20_000, 100 if args.quick else 1000)
    block = render(command, rows, soaked, blocks, block_steps, time.monotonic() - started, passes, attacked)
    path = Path(args.output)
    if not path.exists():
        path.write_text("# Reliability\n")
    write_section(block, path, BEGIN, END)
    print(block)
    return 0


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="a smoke run: few rounds, a short soak")
    parser.add_argument("--output", default="docs/reliability.md")
    parser.add_argument(
        "--hostile-only",
        action="store_true",
        help="measure the hostile clients, a tampered save_dir and the adversary cases again; replace only those",
    )
    return parser


def _attacked(passes: int, blocks: int, block_steps: int) -> str:
    """The hostile clients, a tampered save_dir and the adversary cases, rendered one after the other."""
    print("hostile clients ...", flush=True)
    from benchmarks.hostile import hostile, render_hostile  # the same block method (benchmarks/blocks.py)

    attacked = render_hostile(hostile(passes, blocks, block_steps), blocks, block_steps, passes)
    print("a tampered save_dir ...", flush=True)
    from benchmarks.tampered import render_tampered, tampered

    attacked += "\n" + render_tampered(tampered())
    print("adversary cases ...", flush=True)
    from benchmarks.adversary import adversary, render_adversary

    attacked += "\n" + render_adversary(adversary())
    return attacked


def _hostile_only(path: Path, started: float, passes: int, blocks: int, block_steps: int) -> int:
    """`--hostile-only`: measures the hostile clients, a tampered save_dir and the adversary cases again, and
    replaces only their section of the page."""
    from benchmarks.adversary import adversary, render_adversary
    from benchmarks.hostile import hostile, render_hostile, replace_section
    from benchmarks.tampered import render_tampered, tampered

    rows_attacked = hostile(passes, blocks, block_steps)
    tampered_section = render_tampered(tampered()) + "\n" + render_adversary(adversary())
    note = (
        f"Measured on {datetime.date.today().isoformat()} with `python -m benchmarks.reliability "
        f"--hostile-only` ({(time.monotonic() - started) / 60:.0f} min), apart from the rest of this block, "
        f"on: {machine()}.\n"
    )
    section = render_hostile(rows_attacked, blocks, block_steps, passes, note) + "\n" + tampered_section
    path.write_text(replace_section(path.read_text(), section))
    print(section)
    return 0


if __name__ == "__main__":
    sys.exit(main())
