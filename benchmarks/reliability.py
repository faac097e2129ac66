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

from benchmarks.run import machine, table
from benchmarks.stats import summary
from tests.waiting import free_port

BEGIN, END = "<!-- measured:begin -->", "<!-- measured:end -->"

# wrk (Debian's) keeps up the request rate from another process: C and epoll, so the load generator itself
# takes little of the CPU the training needs; a Lua script paces each connection and checks every response.
WRK_SCRIPT = Path(__file__).with_name("wrk_check.lua")
CONNECTIONS = 8


def start_load(url: str, rate: float, keep_alive: bool) -> subprocess.Popen[str]:
    delay_ms = max(1, round(1000 * CONNECTIONS / rate))
    return subprocess.Popen(["wrk", "-t1", f"-c{CONNECTIONS}", "-d600s", "--timeout", "5s", "-s", str(WRK_SCRIPT),
                             url], stdout=subprocess.PIPE, text=True,
                            env={**os.environ, "DELAY_MS": str(delay_ms), "CLOSE": "0" if keep_alive else "1"})


def stop_load(loader: subprocess.Popen[str]) -> dict[str, Any]:
    loader.send_signal(signal.SIGINT)  # wrk stops, then runs done() with what it saw
    out, _ = loader.communicate(timeout=30)
    line = next(line for line in reversed(out.splitlines()) if line.startswith("{"))
    return json.loads(line)


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
            f"  server {{ listen 127.0.0.1:{self.port}; root {root}/html; }} }}\n")
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


def load(rates: list[float], rounds: int, steps: int) -> list[dict[str, Any]]:
    """The demo Transformer in GRAPH mode, default monitor; rounds alternate the cases (A B C A B C): no load,
    the rank's endpoint at each rate, and nginx serving a copy of the page at each rate (the machine's floor)."""
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
    monitor = TrainingMonitor(port=0)
    static: StaticCopy | None = None
    loaded = [rate for rate in rates if rate]
    # (target, rate, keep-alive): wrk reuses connections by default, as Prometheus does; "Connection: close"
    # makes every request a new connection, the costlier case.
    cases = [("none", 0.0, True)] + [(target, rate, keep) for target in ("monitor", "nginx") for rate in loaded
                                     for keep in (True, False)]
    timers = {case: StepTimer() for case in cases}
    ratios: dict[tuple[str, float, bool], list[float]] = {case: [] for case in cases}
    responses: dict[tuple[str, float, bool], dict[str, float]] = {case: {} for case in cases}
    try:
        model.train(1, synthetic_dataset(size=16 * 5), callbacks=[monitor], dataset_sink_mode=False)  # compile
        with urllib.request.urlopen(monitor.url or "", timeout=5) as response:
            static = StaticCopy(response.read())
        for round_index in range(rounds):
            medians = {}
            for case in cases:
                target, rate, keep_alive = case
                timer = timers[case]
                timer.last = None
                before = len(timer.times)
                url = static.url if target == "nginx" else monitor.url or ""
                loader = start_load(url, rate, keep_alive) if rate > 0 else None
                if loader is not None:
                    time.sleep(1.0)  # the load is running at full rate before the round's first step
                model.train(1, synthetic_dataset(size=16 * steps, seed=round_index),
                            callbacks=[monitor, timer.callback], dataset_sink_mode=False)
                del timer.times[before:before + 2]
                medians[case] = summary(timer.times[before:])["median"]
                if loader is not None:
                    for key, value in stop_load(loader).items():
                        responses[case][key] = responses[case].get(key, 0) + value
            for case in cases:
                ratios[case].append(medians[case] / medians[cases[0]])
    finally:
        monitor.close()
        if static is not None:
            static.close()
    rows = []
    for case in cases:
        target, rate, keep_alive = case
        stats = summary(timers[case].times)
        per_round = sorted(ratios[case])
        answered = responses[case]
        how = "kept-alive connections" if keep_alive else "a new connection per request"
        label = {"none": "no requests", "monitor": f"the rank's /metrics, {rate:g} requests/s wanted, {how}",
                 "nginx": f"nginx serving a copy of the page, {rate:g} requests/s wanted, {how} (the floor)"}[target]
        rows.append({"case": label, "target": target, "rate": rate, "keep_alive": keep_alive, **stats,
                     "ratio": per_round[len(per_round) // 2], "ratio_low": per_round[0], "ratio_high": per_round[-1],
                     "achieved": answered["sent"] / answered["seconds"] if answered else 0.0,
                     "ok": int(answered.get("ok", 0)), "bad": int(answered.get("bad", 0)
                                                                  + answered.get("socket_errors", 0)),
                     "p99_ms": answered.get("p99_ms", 0.0) / max(1, rounds)})
    return rows


_SOAK = """
import json, sys, threading, time, urllib.request
import mindspore as ms, psutil
from mindspore import nn
from mindspore.train import Callback, Model
from ms_exporter import TrainingMonitor
from ms_exporter.demo import build_network, synthetic_dataset
from tests.otlp_receiver import GrpcReceiver

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
        done = subprocess.run([sys.executable, "-c", _SOAK, str(steps), scratch, str(every)], capture_output=True,
                              text=True, check=False, cwd=Path(__file__).resolve().parents[1])
        if done.returncode != 0:
            raise RuntimeError(f"soak failed: {done.stderr[-2000:]}")
        result = json.loads(done.stdout.strip().splitlines()[-1])
        result["jsonl_bytes"] = sum(p.stat().st_size for p in Path(scratch).glob("*.jsonl*"))
    return result


def render(command: str, rows: list[dict[str, Any]], soaked: dict[str, Any], rounds: int, steps: int,
           seconds: float) -> str:
    rss = soaked["rss"]
    mib = [(step, value / 2**20) for step, value in rss]
    quarter = next((v for s, v in mib if s >= mib[-1][0] // 4), mib[0][1])
    growth = mib[-1][1] - quarter
    ours = [r for r in rows if r["target"] == "monitor"]
    floor = {(r["rate"], r["keep_alive"]): r["ratio"] for r in rows if r["target"] == "nginx"}
    verdicts = "\n".join(
        f"- {r['rate']:g} requests/s, {'kept-alive connections' if r['keep_alive'] else 'a new connection each'}: "
        f"step time x{r['ratio']:.3f} with the rank's endpoint, x{floor[(r['rate'], r['keep_alive'])]:.3f} "
        f"with nginx serving the same page (target: under x1.05; "
        f"{'met' if r['ratio'] < 1.05 else 'missed by ' + format(r['ratio'] - 1.05, '.3f')})"
        for r in ours)
    load_table = table(rows, [("case", "load on /metrics", ""), ("achieved", "requests/s achieved", ".0f"),
                              ("ok", "well-formed responses", "d"), ("bad", "bad or failed", "d"),
                              ("p99_ms", "response p99 ms (mean of rounds)", ".1f"),
                              ("median", "median ms/step", ".2f"), ("p90", "p90 ms", ".2f"),
                              ("ratio", "step time ratio (median of rounds)", ".3f"),
                              ("ratio_low", "lowest round", ".3f"), ("ratio_high", "highest round", ".3f")])
    rss_rows = [{"step": step, "rss": value} for step, value in mib]
    rss_table = table(rss_rows, [("step", "step", "d"), ("rss", "RSS MiB", ".1f")])
    return f"""{BEGIN}
Measured on {datetime.date.today().isoformat()} with `{command}` ({seconds / 60:.0f} min) on: {machine()}.

### Endpoint under load during training
The demo Transformer (2 layers, d_model 64) in GRAPH mode with the default monitor; a separate process keeps
up the request rate: Debian's `wrk` with {CONNECTIONS} connections paced by `benchmarks/wrk_check.lua`, which
checks every response (status 200, a complete body with the step counter). wrk keeps its connections alive
(HTTP/1.1), as Prometheus does between scrapes; with `Connection: close` every request is a new connection
(the costlier case, shown too). {rounds} rounds of {steps} steps per case, cases interleaved; the ratio is
each round's median step time over the same round's unloaded median.

{load_table}

{verdicts}

### Soak: {rss[-1][0]:,} steps with the prometheus, local and otlp backends
One fresh process, `grad_norm.every_n_steps: 10`, scraped once a second ({soaked['scrapes']} scrapes),
exporting OTLP every second to a gRPC receiver in the same process ({soaked['otlp_requests']} requests), JSON
Lines flushed every second ({soaked['jsonl_bytes'] / 2**20:.1f} MiB written).

{rss_table}

RSS from a quarter of the run to the end: {growth:+.1f} MiB. Dropped records and absorbed errors at the end:
{_nonzero(soaked['dropped'] + soaked['errors'])}.
{END}"""


def _nonzero(lines: list[str]) -> str:
    shown = [f"`{line}`" for line in lines if not line.endswith(" 0.0")]
    return ", ".join(shown) if shown else "none (every dropped-sample and error counter at 0)"


def replace_block(document: str, block: str) -> str:
    if BEGIN in document and END in document:
        head, rest = document.split(BEGIN, 1)
        return head + block + rest.split(END, 1)[1]
    return document.rstrip("\n") + "\n\n" + block + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="a smoke run: few rounds, a short soak")
    parser.add_argument("--output", default="docs/reliability.md")
    args = parser.parse_args(argv)
    command = "make reliability" if not args.quick else "python -m benchmarks.reliability --quick"
    started = time.monotonic()
    rounds, steps = (1, 40) if args.quick else (6, 300)
    print("endpoint under load ...", flush=True)
    rows = load([0, 300, 600], rounds, steps)
    print("soak ...", flush=True)
    soaked = soak(500 if args.quick else 20_000, 100 if args.quick else 1000)
    block = render(command, rows, soaked, rounds, steps, time.monotonic() - started)
    path = Path(args.output)
    path.write_text(replace_block(path.read_text() if path.exists() else "# Reliability\n", block))
    print(block)
    return 0


if __name__ == "__main__":
    sys.exit(main())

