"""Scale on paper: what one rank exposes, measured, and what 1,000 and 10,000 ranks cost Prometheus, computed.

    python -m benchmarks.scaling [--steps 300] [--output docs/scaling.md] [--load-ranks 1000] [--no-prometheus]
                                 [--job-ranks 1000,10000] [--no-victoriametrics]

Trains the demo Transformer for real with a default TrainingMonitor, counts what its /metrics serves (series,
families, histogram buckets, bytes plain and gzip-compressed), repeats with the configuration that reaches the
in-process bound on layer series, has a real Prometheus scrape the endpoint, and has a real Prometheus scrape
`--load-ranks` replayed copies of the exposition (each with its own rank) to check the memory rule of thumb.
Then `series_profile: large_job` (docs/scaling.md, "Very large jobs"): one training whose rank is a non-detail
rank, its page counted, then the same rank's page as a detail rank; and jobs of `--job-ranks` replayed ranks (rank 0
the detail page, every other the non-detail page) through a real Prometheus and through vmagent -> VictoriaMetrics.
The figures replace the block between the measured markers of docs/scaling.md.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import datetime
import gzip
import http.server
import json
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import urllib.parse
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from benchmarks.report import machine, table
from ms_exporter.config import LayerNormConfig
from ms_exporter.generate import marked_block
from tests.support.servers import PROMETHEUS, PrometheusServer
from tests.support.waiting import wait_until

BEGIN, END = "<!-- measured:begin -->", "<!-- measured:end -->"
# What a query may raise while Prometheus has not scraped or evaluated yet: asked again.
NOT_YET = (OSError, ValueError, KeyError, IndexError)
# What Prometheus 2.42 sends by default: it prefers OpenMetrics, and asks for gzip.
PROMETHEUS_ACCEPT = (
    "application/openmetrics-text;version=1.0.0,application/openmetrics-text;version=0.0.1;q=0.75,"
    "text/plain;version=0.0.4;q=0.5,*/*;q=0.1"
)
# Prometheus adds these to every target: https://prometheus.io/docs/concepts/jobs_instances/
SYNTHETIC = (
    "up",
    "scrape_duration_seconds",
    "scrape_samples_scraped",
    "scrape_samples_post_metric_relabeling",
    "scrape_series_added",
)
TARGET_LABELS = ("job", "instance")  # what a plain static or file_sd scrape config adds to every series
INTERVALS = (15.0, 30.0)  # deploy/kubernetes scrapes every 15 s; 30 s is a common global setting
RANKS = (1_000, 10_000)

# The memory rule of thumb. Brian Brazil, "How much RAM does Prometheus 2.x need for cardinality and ingestion?"
# (Robust Perception, 2019, profiled on Prometheus 2.9): per series about 732 B, plus 32 B per label pair, plus the
# metric name twice; 120 B per unique label value; all of it doubled for Go's garbage collector.
RULE_PER_SERIES, RULE_PER_LABEL_PAIR, RULE_PER_UNIQUE_VALUE, RULE_GC = 732, 32, 120, 2
RULE_SOURCE = "https://www.robustperception.io/how-much-ram-does-prometheus-2-x-need-for-cardinality-and-ingestion/"

# Layers of the demo model (per encoder layer: self_attn, self_attn.out_proj, dense1, dense2, norm1, norm2; plus
# position, embed, head). These regexes watch 3 per encoder layer and the 3 outer ones: with 4 encoder layers that
# is 15 = max_series - top_k, and top_k adds the 5 largest of the other 12, so the cap of 20 is reached.
UPPER_BOUND: dict[str, Any] = {
    "weight_norm": True,
    "grad_norm": {
        "layers": [r"encoder\.layers\.\d+\.(self_attn|dense1|dense2)$", "head$", "embed$", "position$"],
        "top_k": 5,
        "max_series": 20,
    },
}
# series_profile: large_job with the benchmark's own rank (0) outside detail_ranks: the non-detail page. The
# endpoint's page cache is off so that the same rank, made a detail rank afterwards, is scraped anew.
LARGE_JOB = {"series_profile": "large_job", "detail_ranks": [1], "web": {"cache_seconds": 0}}
LARGE_JOB_LEAN = "large_job, a non-detail rank"
LARGE_JOB_DETAIL = "large_job, a detail rank"
# Replayed large jobs: (ranks, scrape interval). 10,000 targets on a small machine are scraped every 30 s.
JOB_RANKS = ((1_000, 15.0), (10_000, 30.0))
JOB_SCRAPES = 2  # scrapes of every target measured after each was scraped once
SERIES_GOAL = 150_000  # Grafana Mimir's default per-tenant limit of in-memory series (max_global_series_per_user)
VICTORIA_METRICS = shutil.which("victoria-metrics") or "/usr/bin/victoria-metrics"
VMAGENT = shutil.which("vmagent") or "/usr/bin/vmagent"

# Memory is sampled every `interval` seconds and its growth series appear at the first sample after warm-up: at
# the default 30 s a run of a few hundred steps would end before they exist. `interval` changes no series.
MEASURE_INTERVAL = {"interval": 1.0}


@dataclass(frozen=True)
class Case:
    label: str
    encoder_layers: int
    options: dict[str, Any]


CASES = (
    Case("defaults", 2, {}),
    Case("20 layer series + weight_norm", 4, UPPER_BOUND),
    Case("20 layer series + weight_norm, on the 2-layer demo model", 2, UPPER_BOUND),
)


@dataclass
class RankFigures:
    """What one rank's /metrics served after training."""

    case: str
    encoder_layers: int
    steps: int
    series: int  # sample lines of the text format: every one is a time series in Prometheus
    families: int  # metric families with at least one series
    declared_families: int  # with HELP/TYPE, some possibly without series yet
    bucket_series: int  # `_bucket` series of histograms
    histogram_series: int  # buckets + _sum + _count
    layer_grad_norm_series: int
    weight_norm_series: int
    layernorm_series: int
    layernorms_in_model: int
    bytes_openmetrics: int  # the body Prometheus gets, uncompressed
    bytes_gzip: int  # the same body as it crosses the wire (Prometheus sends Accept-Encoding: gzip)
    bytes_text: int  # the classic text format (what curl gets)
    mean_label_pairs: float  # per series, the name included, before Prometheus adds target labels
    mean_name_length: float
    per_family: dict[str, tuple[str, int]] = field(default_factory=dict)  # family -> (type, series)
    label_values: dict[str, int] = field(default_factory=dict)  # label name -> distinct values
    exposition: str = ""  # the classic text, for the replayed load run
    prometheus: dict[str, Any] = field(default_factory=dict)


# -- one rank, measured ---------------------------------------------------------------------------------------------


def _get(url: str, headers: dict[str, str]) -> tuple[bytes, dict[str, str]]:
    request = urllib.request.Request(url, headers=headers)
    with urllib.request.urlopen(request, timeout=10) as response:
        return response.read(), {k.lower(): v for k, v in response.headers.items()}


def count_exposition(url: str) -> dict[str, Any]:
    """Counts of one scrape of `url`, parsed with prometheus_client's own parser."""
    from prometheus_client.parser import text_string_to_metric_families

    text_body, _ = _get(url, {})
    text = text_body.decode("utf-8")
    openmetrics, headers = _get(url, {"Accept": PROMETHEUS_ACCEPT})
    if "openmetrics" not in headers.get("content-type", ""):
        raise RuntimeError(f"{url} did not answer Prometheus' Accept header with OpenMetrics: {headers}")
    compressed, headers = _get(url, {"Accept": PROMETHEUS_ACCEPT, "Accept-Encoding": "gzip"})
    if headers.get("content-encoding") != "gzip":
        raise RuntimeError(f"{url} ignored Accept-Encoding: gzip")
    if gzip.decompress(compressed).count(b"\n") != openmetrics.count(b"\n"):
        raise RuntimeError("the gzip body is not the same exposition as the plain one")

    per_family: dict[str, tuple[str, int]] = {}
    label_values: dict[str, set[str]] = {}
    series = buckets = histogram = pairs = name_length = 0
    for family in text_string_to_metric_families(text):
        per_family[family.name] = (family.type, len(family.samples))
        for sample in family.samples:
            series += 1
            pairs += 1 + len(sample.labels)
            name_length += len(sample.name)
            if family.type == "histogram":
                histogram += 1
                buckets += sample.name.endswith("_bucket")
            for name, value in sample.labels.items():
                label_values.setdefault(name, set()).add(value)
    declared = len(re.findall(r"^# TYPE ", text, flags=re.MULTILINE))
    if series != sum(1 for line in text.splitlines() if line and not line.startswith("#")):
        raise RuntimeError("the parser and the sample lines disagree on the number of series")
    return {
        "series": series,
        "families": sum(1 for _, n in per_family.values() if n),
        "declared_families": declared,
        "bucket_series": buckets,
        "histogram_series": histogram,
        "bytes_openmetrics": len(openmetrics),
        "bytes_gzip": len(compressed),
        "bytes_text": len(text_body),
        "mean_label_pairs": pairs / max(series, 1),
        "mean_name_length": name_length / max(series, 1),
        "per_family": per_family,
        "label_values": {k: len(v) for k, v in sorted(label_values.items())},
        "exposition": text,
    }


@contextlib.contextmanager
def trained_monitor(case: Case, steps: int) -> Iterator[tuple[Any, Any]]:
    """A real GRAPH-mode training of the demo model; yields (monitor, network) while the endpoint still serves
    the final values."""
    import mindspore as ms

    from ms_exporter import TrainingMonitor
    from ms_exporter.demo import build_model, synthetic_dataset

    ms.set_context(mode=ms.GRAPH_MODE)
    ms.set_seed(0)
    model = build_model(layers=case.encoder_layers, decay_steps=max(steps, 100))
    monitor = TrainingMonitor({**case.options, **MEASURE_INTERVAL}, port=0)
    try:
        model.train(1, synthetic_dataset(size=16 * steps), callbacks=[monitor], dataset_sink_mode=False)
        yield monitor, model.train_network
    finally:
        monitor.close()


def measure(case: Case, steps: int, prometheus_seconds: float = 0.0) -> RankFigures:
    """Train, scrape, count; with prometheus_seconds > 0 a real Prometheus scrapes the endpoint too."""
    from ms_exporter.probes.layernorm import find_layernorm_scales

    with trained_monitor(case, steps) as (monitor, network):
        url = monitor.url
        if url is None:
            raise RuntimeError("the monitor serves no /metrics")
        counts = count_exposition(url)
        seen = prometheus_check(url, prometheus_seconds) if prometheus_seconds > 0 else {}
        layernorms = len(find_layernorm_scales(network))
    return _figures(case.label, case.encoder_layers, steps, counts, layernorms, seen)


def measure_large_job(steps: int) -> tuple[RankFigures, RankFigures]:
    """series_profile: large_job, one real training: (the non-detail page, the same rank's page as a detail rank)."""
    from ms_exporter.probes.layernorm import find_layernorm_scales
    from ms_exporter.sinks.shared import series_budget

    case = Case(LARGE_JOB_LEAN, 2, LARGE_JOB)
    with trained_monitor(case, steps) as (monitor, network):
        url = monitor.url
        if url is None:
            raise RuntimeError("the monitor serves no /metrics")
        lean = count_exposition(url)
        # The same trained rank with itself in detail_ranks: what the monitor attaches at construction for rank 0.
        series_budget.attach(monitor.store, "large_job", [0], 0)
        detail = count_exposition(url)
        layernorms = len(find_layernorm_scales(network))
    return (
        _figures(LARGE_JOB_LEAN, 2, steps, lean, layernorms, {}),
        _figures(LARGE_JOB_DETAIL, 2, steps, detail, layernorms, {}),
    )


def _figures(
    label: str, layers: int, steps: int, counts: dict[str, Any], layernorms: int, seen: dict[str, Any]
) -> RankFigures:
    per_family = counts["per_family"]

    def series_of(*names: str) -> int:
        return sum(per_family.get(name, ("", 0))[1] for name in names)

    return RankFigures(
        case=label,
        encoder_layers=layers,
        steps=steps,
        series=counts["series"],
        families=counts["families"],
        declared_families=counts["declared_families"],
        bucket_series=counts["bucket_series"],
        histogram_series=counts["histogram_series"],
        layer_grad_norm_series=series_of("mindspore_train_layer_grad_norm"),
        weight_norm_series=series_of("mindspore_train_weight_norm"),
        layernorm_series=series_of(
            "mindspore_train_layernorm_scale_mean",
            "mindspore_train_layernorm_scale_std",
            "mindspore_train_layernorm_scale_drift_ratio",
        ),
        layernorms_in_model=layernorms,
        bytes_openmetrics=counts["bytes_openmetrics"],
        bytes_gzip=counts["bytes_gzip"],
        bytes_text=counts["bytes_text"],
        mean_label_pairs=counts["mean_label_pairs"],
        mean_name_length=counts["mean_name_length"],
        per_family=per_family,
        label_values=counts["label_values"],
        exposition=counts["exposition"],
        prometheus=seen,
    )


# -- a real Prometheus ------------------------------------------------------------------------------------------------


def prometheus_version() -> str:
    try:
        out = subprocess.run([PROMETHEUS, "--version"], capture_output=True, text=True, timeout=30, check=False)
    except OSError:
        return "not installed"
    match = re.search(r"version (\S+)", out.stdout + out.stderr)
    return match.group(1) if match else "unknown"


def prometheus_check(url: str, seconds: float) -> dict[str, Any]:
    """A real Prometheus scrapes the rank every second for `seconds` from its first scrape: the counts as
    Prometheus sees them."""
    address = urllib.parse.urlparse(url).netloc
    config = {
        "global": {"scrape_interval": "1s", "scrape_timeout": "1s"},
        "scrape_configs": [{"job_name": "mindspore", "static_configs": [{"targets": [address]}]}],
    }
    with tempfile.TemporaryDirectory(prefix="ms_exporter_scaling_") as scratch:
        server = PrometheusServer(config, scratch)
        try:
            # Prometheus starts scraping a few seconds after it is ready (target updates are batched).
            wait_until(
                lambda: server.query('up{job="mindspore"} == 1'), 60, "Prometheus scraping the rank", 0.5, NOT_YET
            )
            time.sleep(seconds)
            window = f"[{int(seconds) + 60}s]"
            seen = {
                "scrapes": server.scalar(f'count_over_time(up{{job="mindspore"}}{window})'),
                "samples_scraped": server.scalar('scrape_samples_scraped{job="mindspore"}'),
                "series_added_first_scrape": server.scalar(
                    f'max_over_time(scrape_series_added{{job="mindspore"}}{window})'
                ),
                "series_in_head": server.scalar('count({job="mindspore"})'),
                "synthetic_in_head": server.scalar('count({job="mindspore", __name__=~"up|scrape_.+"})'),
                "head_series_total": server.own("prometheus_tsdb_head_series"),
            }
            return seen
        finally:
            server.close()


# -- many ranks, replayed -----------------------------------------------------------------------------------------


class ReplayServer:
    """Serves /metrics/<r>: one rank's real exposition with rank="<r>", gzip-compressed like the real endpoint."""

    def __init__(self, exposition: str, ranks: int) -> None:
        label = re.compile(r'([{,])rank="0"')  # the rank label itself, not local_rank
        if not label.search(exposition):
            raise ValueError('the exposition has no rank="0" label to replace')
        self.bodies = [gzip.compress(label.sub(rf'\1rank="{r}"', exposition).encode()) for r in range(ranks)]
        bodies = self.bodies

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # http.server's name
                try:
                    body = bodies[int(self.path.rsplit("/", 1)[1])]
                except (ValueError, IndexError):
                    self.send_error(404)
                    return
                self.send_response(200)
                self.send_header("Content-Type", "text/plain; version=0.0.4; charset=utf-8")
                self.send_header("Content-Encoding", "gzip")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args: Any) -> None:
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.port = int(self.server.server_address[1])
        self.thread = threading.Thread(target=self.server.serve_forever, name="replay", daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def prometheus_load(
    exposition: str,
    ranks: int,
    interval: float,
    scrapes: int,
    relabel: list[dict[str, Any]] | None = None,
    baseline: bool = True,
) -> dict[str, Any]:
    """One real Prometheus scraping `ranks` replayed ranks every `interval` s until each target was scraped
    `scrapes` times; its head series and memory then, and (with `baseline`) those of the same Prometheus with no
    targets."""
    replay = ReplayServer(exposition, ranks)
    job = _replay_job(replay.port, ranks, relabel)
    every = f"{interval:g}s"
    empty_rss = 0.0
    try:
        if baseline:
            empty_rss = _empty_rss(every)
        with tempfile.TemporaryDirectory(prefix="ms_exporter_scaling_") as scratch:
            server = PrometheusServer(
                {"global": {"scrape_interval": every, "scrape_timeout": every}, "scrape_configs": [job]}, scratch
            )
            try:
                result = _after_scrapes(server, ranks, interval, scrapes, empty_rss)
            finally:
                server.close()
    finally:
        replay.close()
    return result


def _replay_job(port: int, ranks: int, relabel: list[dict[str, Any]] | None) -> dict[str, Any]:
    """The scrape job of the replayed ranks: a target per rank, each with its own path and instance."""
    targets = [
        {
            "targets": [f"127.0.0.1:{port}"],
            "labels": {"__metrics_path__": f"/metrics/{r}", "instance": f"node{r // 8}:{19420 + r % 8}"},
        }
        for r in range(ranks)
    ]
    job: dict[str, Any] = {"job_name": "mindspore", "static_configs": targets}
    if relabel:
        job["metric_relabel_configs"] = relabel
    return job


def _empty_rss(every: str) -> float:
    """The RSS of the same Prometheus with no targets."""
    with tempfile.TemporaryDirectory(prefix="ms_exporter_scaling_") as scratch:
        empty = PrometheusServer({"global": {"scrape_interval": every}, "scrape_configs": []}, scratch)
        try:
            time.sleep(3)
            return empty.rss()
        finally:
            empty.close()


def _after_scrapes(
    server: PrometheusServer, ranks: int, interval: float, scrapes: int, empty_rss: float
) -> dict[str, Any]:
    """Waits until every replayed rank was scraped `scrapes` times, then reads what Prometheus holds and costs
    (beside `empty_rss`, the same Prometheus's with no targets)."""
    began = time.monotonic()
    wait_until(
        lambda: server.scalar('count(up{job="mindspore"} == 1)') == ranks,
        interval * 4 + 60,
        "every replayed rank scraped once",
        every=1.0,
        tolerate=NOT_YET,
    )
    deadline = began + interval * (scrapes + 0.5)
    time.sleep(max(0.0, deadline - time.monotonic()))
    window = f"[{int(interval * (scrapes + 2))}s]"
    return {
        "ranks": ranks,
        "interval": interval,
        "scrapes_per_target": server.scalar(f'min(count_over_time(up{{job="mindspore"}}{window}))'),
        "failed_scrapes": server.scalar(
            f'sum(count_over_time(up{{job="mindspore"}}{window})) - sum(sum_over_time(up{{job="mindspore"}}{window}))'
        ),
        "samples_scraped": server.scalar('sum(scrape_samples_scraped{job="mindspore"})'),
        "samples_kept": server.scalar('sum(scrape_samples_post_metric_relabeling{job="mindspore"})'),
        "head_series": server.own("prometheus_tsdb_head_series"),
        "rss": server.rss(),
        "empty_rss": empty_rss,
        "heap_inuse": server.own("go_memstats_heap_inuse_bytes"),
        "seconds": time.monotonic() - began,
    }


# -- a large job, replayed: series_profile: large_job -----------------------------------------------------------------


def with_rank(exposition: str, rank: int) -> str:
    """`exposition` (rank 0's) as rank `rank` serves it: the rank label replaced, local_rank left alone."""
    label = re.compile(r'([{,])rank="0"')
    if not label.search(exposition):
        raise ValueError('the exposition has no rank="0" label to replace')
    return label.sub(rf'\1rank="{rank}"', exposition)


# What a healthy step moves: the steps, time and work counters and every summary's or histogram's sum and count.
# Not the counters of trouble (non-finite losses, the monitor's errors, breaches): those would page.
_COUNTED = re.compile(
    r"^((?:\w+(?:_sum|_count)|mindspore_train_(?:steps|run_time_seconds|samples|tokens)_total)(?:\{[^}]*\})? )"
    r"(\S+)$",
    flags=re.MULTILINE,
)


def advanced(exposition: str) -> str:
    """`exposition` one healthy step later: the steps, time and work counters and every `_sum` and `_count` one
    higher, so that rate() over two scrapes is a number (a rule's 0/0 is NaN, and VictoriaMetrics stores no NaN
    sample: its `rank:` results would be lost)."""
    return _COUNTED.sub(lambda match: f"{match.group(1)}{float(match.group(2)) + 1:g}", exposition)


class JobReplay:
    """A replayed job on one asyncio HTTP/1.1 server with keep-alive (10,000 targets on two cores): /metrics/<r>
    serves rank 0 the detail page and every other rank the non-detail page, each with its own rank label, gzip-
    compressed when asked (Prometheus and vmagent ask), the page one step later (`advanced`) from a rank's second
    scrape on. Precomputed bytes; counts the requests and bytes served."""

    _HEAD = "HTTP/1.1 200 OK\r\nContent-Type: text/plain; version=0.0.4; charset=utf-8\r\n{}Content-Length: {}\r\n\r\n"

    def __init__(self, detail: str, lean: str, ranks: int) -> None:
        self.ranks = ranks
        pages = [with_rank(detail if r == 0 else lean, r) for r in range(ranks)]
        # (first scrape, later scrapes) of each rank
        self.plain = [[page.encode() for page in pages], [advanced(page).encode() for page in pages]]
        self.gzipped = [[gzip.compress(body, compresslevel=6) for body in bodies] for bodies in self.plain]
        self.scraped = bytearray(ranks)  # 1 once a rank was served
        self.requests = 0
        self.bytes_served = 0
        self.loop = asyncio.new_event_loop()
        started = threading.Event()
        self.port = 0

        async def serve() -> None:
            server = await asyncio.start_server(self._answer, "127.0.0.1", 0, backlog=4096)
            self.port = int(server.sockets[0].getsockname()[1])
            started.set()
            async with server:
                with contextlib.suppress(asyncio.CancelledError):
                    await server.serve_forever()

        self.thread = threading.Thread(target=self.loop.run_until_complete, args=(serve(),), name="replay", daemon=True)
        self.thread.start()
        if not started.wait(30):
            raise RuntimeError("the replay server did not start")

    async def _answer(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                path = head.split(b" ", 2)[1].decode("latin-1")
                try:
                    rank = int(path.rsplit("/", 1)[1])
                    gzipped = b"gzip" in head.lower()
                    body = (self.gzipped if gzipped else self.plain)[self.scraped[rank]][rank]
                    self.scraped[rank] = 1
                except (ValueError, IndexError):
                    writer.write(b"HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\n\r\n")
                    continue
                encoding = "Content-Encoding: gzip\r\n" if gzipped else ""
                self.requests += 1  # before the write: the client may read the answer before this line runs
                self.bytes_served += len(body)
                writer.write(self._HEAD.format(encoding, len(body)).encode() + body)
                await writer.drain()
        except (asyncio.IncompleteReadError, asyncio.LimitOverrunError, ConnectionError, asyncio.CancelledError):
            pass  # the scraper hung up, or close() ends the connection
        finally:
            writer.close()

    def targets(self) -> list[dict[str, Any]]:
        """One target group per rank (Prometheus' static_configs and file_sd's shape), 8 ranks a node."""
        return [
            {
                "targets": [f"127.0.0.1:{self.port}"],
                "labels": {"__metrics_path__": f"/metrics/{r}", "instance": f"node{r // 8}:{19420 + r % 8}"},
            }
            for r in range(self.ranks)
        ]

    def rewind(self) -> None:
        """Every rank's next scrape is its first again (each store's run begins with the first page)."""
        self.scraped = bytearray(self.ranks)

    def counters(self) -> tuple[float, int, int]:
        return time.monotonic(), self.requests, self.bytes_served

    def close(self) -> None:
        for task in asyncio.all_tasks(self.loop):
            self.loop.call_soon_threadsafe(task.cancel)
        self.thread.join(10)


def _own_metric(url: str, name: str) -> float:
    """The sum of `name`'s samples in a server's own /metrics (VictoriaMetrics' histograms use vmrange, which
    prometheus_client's parser does not take, so the lines are read as text)."""
    with urllib.request.urlopen(url, timeout=120) as response:  # a loaded 2-core machine answers slowly
        text = response.read().decode()
    values = re.findall(rf"^{re.escape(name)}(?:\{{[^}}]*\}})? (\S+)$", text, flags=re.MULTILINE)
    if not values:
        raise KeyError(name)
    return sum(float(value) for value in values)


def _rate(before: tuple[float, int, int], after: tuple[float, int, int]) -> tuple[float, float]:
    """Scrapes per second and bytes per second the replay server served between two readings."""
    seconds = after[0] - before[0]
    return (after[1] - before[1]) / seconds, (after[2] - before[2]) / seconds


def _all_scraped(scalar: Any, replay: JobReplay, interval: float, what: str) -> None:
    """Wait until `scalar` (a store's instant query) counts every replayed rank up."""
    wait_until(
        lambda: scalar('count(up{job="mindspore"} == 1)') == replay.ranks,
        interval * 4 + 120,
        what,
        every=2.0,
        tolerate=NOT_YET,
    )


def _over_scrapes(replay: JobReplay, interval: float, scrapes: int, metrics_url: str, counter: str) -> dict[str, float]:
    """Over `scrapes` intervals: the store's own `counter` (samples appended, rows inserted) per second, and the
    scrapes and bytes per second the replay server served."""
    before, start = replay.counters(), _own_metric(metrics_url, counter)
    time.sleep(interval * scrapes)
    after, end = replay.counters(), _own_metric(metrics_url, counter)
    scrapes_per_second, bytes_per_second = _rate(before, after)
    return {
        "samples_per_second": (end - start) / (after[0] - before[0]),
        "bytes_per_second": bytes_per_second,
        "scrapes_per_second": scrapes_per_second,
    }


def _failed_scrapes(scalar: Any, interval: float, scrapes: int) -> float:
    """Scrapes of the last `scrapes` intervals that failed (up == 0), by a store's instant query `scalar`."""
    window = f"[{int(interval * scrapes)}s]"
    return float(
        scalar(
            f'sum(count_over_time(up{{job="mindspore"}}{window})) - sum(sum_over_time(up{{job="mindspore"}}{window}))'
        )
    )


def job_prometheus(replay: JobReplay, interval: float, scrapes: int) -> dict[str, Any]:
    """A real Prometheus scraping the replayed job: its head series once every target was scraped, the samples it
    appended per second and the bytes it was served per second over `scrapes` intervals, its RSS."""
    every = f"{interval:g}s"
    job = {"job_name": "mindspore", "scrape_timeout": f"{min(interval, 10.0):g}s", "static_configs": replay.targets()}
    with tempfile.TemporaryDirectory(prefix="ms_exporter_scaling_") as scratch:
        server = PrometheusServer({"global": {"scrape_interval": every}, "scrape_configs": [job]}, scratch)
        try:
            began = time.monotonic()
            _all_scraped(server.scalar, replay, interval, "every replayed rank scraped once")
            own = f"{server.base}/metrics"
            measured = _over_scrapes(replay, interval, scrapes, own, "prometheus_tsdb_head_samples_appended_total")
            return {
                "store": f"Prometheus {prometheus_version()}",
                "ranks": replay.ranks,
                "interval": interval,
                "series": _own_metric(own, "prometheus_tsdb_head_series"),
                **measured,
                "failed_scrapes": _failed_scrapes(server.scalar, interval, scrapes),
                "rss": server.rss(),
                "agent_rss": None,
                "synthetic": len(SYNTHETIC),
                "seconds": time.monotonic() - began,
            }
        finally:
            server.close()


def victoria_metrics_version() -> str:
    """The Debian package's version (Debian's build prints an empty `-version`)."""
    try:
        out = subprocess.run(
            ["dpkg-query", "-W", "-f=${Version}", "victoria-metrics"], capture_output=True, text=True, timeout=30
        )
    except OSError:
        return "unknown"
    return out.stdout.strip() or "unknown"


def job_victoria_metrics(replay: JobReplay, interval: float, scrapes: int) -> dict[str, Any]:
    """vmagent (the shipped flags and scrape config, file_sd pointed at the replayed job) remote-writing to
    victoria-metrics (the shipped flags): the store's series once every target was scraped, the rows it inserted
    per second and the bytes vmagent was served per second over `scrapes` intervals, the RSS of both."""
    import psutil

    from tests.support.victoriametrics import VictoriaMetrics

    with tempfile.TemporaryDirectory(prefix="ms_exporter_scaling_") as scratch:
        targets = Path(scratch) / "targets"
        targets.mkdir()
        (targets / "ms-exporter-job.json").write_text(json.dumps(replay.targets()))
        vm = VictoriaMetrics(Path(scratch))
        try:
            vm.store()
            vm.vmagent(targets, scrape_interval=f"{interval:g}s")
            began = time.monotonic()

            def count(expr: str) -> float:
                result = vm.query(expr)
                return float(result[0]["value"][1]) if result else 0.0

            _all_scraped(count, replay, interval, "vmagent writing every replayed rank")
            measured = _over_scrapes(replay, interval, scrapes, f"{vm.store_url}/metrics", "vm_rows_inserted_total")
            rss = {p.name(): float(p.memory_info().rss) for p in psutil.Process().children()}
            return {
                "store": f"vmagent + VictoriaMetrics {victoria_metrics_version()}",
                "ranks": replay.ranks,
                "interval": interval,
                # the store's series count (a query over every series would pass -search.maxUniqueTimeseries)
                "series": _series_count(vm.store_url),
                **measured,
                "failed_scrapes": _failed_scrapes(count, interval, scrapes),
                "rss": rss.get("victoria-metrics", 0.0),
                "agent_rss": rss.get("vmagent", 0.0),
                "synthetic": len(SYNTHETIC) + 1,  # vmagent also writes scrape_timeout_seconds
                "seconds": time.monotonic() - began,
            }
        finally:
            vm.stop()


JOB_PROMETHEUS = Path(__file__).resolve().parents[1] / "deploy/prometheus/prometheus-job.yml"
# What the shared store holds of a forwarded job, by kind (every series there is one of these).
FORWARDED_KINDS = {
    "project": '{__name__=~"project:.+"}',
    "rank": '{__name__=~"rank:.+"}',
    "rank0": '{rank="0", __name__!~".+:.+|ALERTS"}',
    "alerts": '{__name__="ALERTS"}',
}


def forwarding_config(replay: JobReplay, interval: float, store_url: str) -> dict[str, Any]:
    """deploy/prometheus/prometheus-job.yml for the replayed job: its rules file and remote_write (pointed at
    `store_url`), the replayed targets instead of file_sd, no Alertmanager (nothing listens here)."""
    shipped = yaml.safe_load(JOB_PROMETHEUS.read_text(encoding="utf-8"))
    job = {"job_name": "mindspore", "scrape_timeout": f"{min(interval, 10.0):g}s", "static_configs": replay.targets()}
    return {
        "global": {
            "scrape_interval": f"{interval:g}s",
            "evaluation_interval": shipped["global"]["evaluation_interval"],
        },
        "rule_files": [str(RULES_FILE)],
        "scrape_configs": [job],
        "remote_write": [{**write, "url": f"{store_url}/api/v1/write"} for write in shipped["remote_write"]],
    }


def job_forwarded(replay: JobReplay, interval: float, scrapes: int) -> dict[str, Any]:
    """The job's own Prometheus (deploy/prometheus/prometheus-job.yml: the shipped rules evaluated over every rank)
    forwarding to VictoriaMetrics, the shared store: the store's series once they stopped growing, by kind, and
    the rows it inserted per second over `scrapes` intervals; the job's Prometheus's head series and RSS."""
    import psutil

    from tests.support.victoriametrics import VictoriaMetrics

    with tempfile.TemporaryDirectory(prefix="ms_exporter_scaling_") as scratch:
        vm = VictoriaMetrics(Path(scratch))
        server = None
        try:
            vm.store()
            server = PrometheusServer(forwarding_config(replay, interval, vm.store_url), scratch)
            began = time.monotonic()
            _all_scraped(server.scalar, replay, interval, "every replayed rank scraped once")
            measured = _over_scrapes(replay, interval, scrapes, f"{vm.store_url}/metrics", "vm_rows_inserted_total")
            series = _settled_series(vm.store_url, interval)
            rss = {p.name(): float(p.memory_info().rss) for p in psutil.Process().children()}

            def count(expr: str) -> float:
                result = vm.query(f"count({expr})")
                return float(result[0]["value"][1]) if result else 0.0

            return {
                "store": f"the job's Prometheus {prometheus_version()} -> VictoriaMetrics {victoria_metrics_version()}",
                "ranks": replay.ranks,
                "interval": interval,
                "series": series,
                "kinds": {kind: count(expr) for kind, expr in FORWARDED_KINDS.items()},
                "job_series": _own_metric(f"{server.base}/metrics", "prometheus_tsdb_head_series"),
                **measured,
                "failed_scrapes": _failed_scrapes(server.scalar, interval, scrapes),
                "rss": rss.get("victoria-metrics", 0.0),
                "agent_rss": server.rss(),
                "synthetic": 0,
                "seconds": time.monotonic() - began,
            }
        finally:
            if server is not None:
                server.close()
            vm.stop()


def _settled_series(store_url: str, interval: float) -> float:
    """The shared store's series once they stopped growing."""
    # The rank: rules need two scrapes of a rank (rate()); each evaluation forwards its results.
    counts: list[float] = []

    def settled() -> bool:
        counts.append(_series_count(store_url))
        return len(counts) > 1 and counts[-1] == counts[-2] > 0

    # Compared one scrape and one rule evaluation apart: the rules file's groups evaluate every 10 s.
    groups = yaml.safe_load(RULES_FILE.read_text())["groups"]
    evaluation = max(float(group["interval"].removesuffix("s")) for group in groups)
    every = max(interval, evaluation) + 1.0
    wait_until(settled, every * 6 + 120, "the shared store's series to stop growing", every=every, tolerate=NOT_YET)
    return counts[-1]


def _series_count(store_url: str) -> float:
    """VictoriaMetrics' /api/v1/series/count: every series in the store (a scratch store holds this job alone)."""
    with urllib.request.urlopen(f"{store_url}/api/v1/series/count", timeout=60) as response:
        return float(json.loads(response.read())["data"][0])


def _attempt(run: Any, replay: JobReplay, interval: float, store: str) -> dict[str, Any]:
    """One store's run of a replayed job; a run that fails is a row that says so (the others are still written)."""
    replay.rewind()  # a store that saw only the later page would compute no rate from it
    try:
        result: dict[str, Any] = run(replay, interval, JOB_SCRAPES)
        return result
    except Exception as exc:
        print(f"    failed: {type(exc).__name__}: {exc}", flush=True)
        return {"store": store, "ranks": replay.ranks, "interval": interval, "error": f"{type(exc).__name__}: {exc}"}


def job_series(detail: RankFigures, lean: RankFigures, ranks: int, synthetic: int = len(SYNTHETIC)) -> int:
    """Series of a large_job job of `ranks` ranks, computed: one detail rank, the rest non-detail, each with the
    scraper's `synthetic` series per target (up, scrape_*)."""
    return detail.series + (ranks - 1) * lean.series + ranks * synthetic


# -- the doc's own configuration snippets ------------------------------------------------------------------------


def yaml_blocks(markdown: str) -> list[str]:
    """The ```yaml fenced blocks of a Markdown text, in order."""
    return re.findall(r"^```yaml\n(.*?)^```", markdown, flags=re.MULTILINE | re.DOTALL)


def prometheus_configs(markdown: str) -> list[str]:
    """The yaml blocks that are Prometheus configuration files (they have scrape_configs at the top)."""
    configs = []
    for block in yaml_blocks(markdown):
        with contextlib.suppress(yaml.YAMLError):
            parsed = yaml.safe_load(block)
            if isinstance(parsed, dict) and "scrape_configs" in parsed:
                configs.append(block)
    return configs


def doc_relabeling(markdown: str) -> list[dict[str, Any]] | None:
    """metric_relabel_configs of the first scrape config in the doc that has some: the ones the load run applies."""
    for block in prometheus_configs(markdown):
        for job in yaml.safe_load(block)["scrape_configs"]:
            if job.get("metric_relabel_configs"):
                return list(job["metric_relabel_configs"])
    return None


def promtool_check(block: str) -> str:
    """`promtool check config` on a configuration snippet; returns promtool's output, raises if it rejects it."""
    promtool = shutil.which("promtool") or "/usr/bin/promtool"
    with tempfile.TemporaryDirectory(prefix="ms_exporter_scaling_") as scratch:
        path = Path(scratch) / "prometheus.yml"
        path.write_text(block)
        # Snippets name the rule file that deploy/ ships; promtool resolves it next to the config.
        rules = Path(__file__).resolve().parents[1] / "deploy/prometheus/rules"
        (Path(scratch) / "rules").symlink_to(rules)
        run = subprocess.run(
            [promtool, "check", "config", str(path)], capture_output=True, text=True, timeout=60, check=False
        )
    if run.returncode != 0:
        raise ValueError(f"promtool rejected the snippet:\n{block}\n{run.stdout}{run.stderr}")
    return run.stdout


# -- computing the rest ---------------------------------------------------------------------------------------------


def series_in_prometheus(rank: RankFigures) -> int:
    """Active series one rank costs Prometheus: what it exposes plus the synthetic up/scrape_* series."""
    synthetic = rank.prometheus.get("synthetic_in_head", len(SYNTHETIC))
    return rank.series + int(synthetic)


def rule_bytes(rank: RankFigures, ranks: int) -> float:
    """Head memory for `ranks` such ranks by the rule of thumb (see RULE_SOURCE)."""
    series = series_in_prometheus(rank) * ranks
    pairs = rank.mean_label_pairs + len(TARGET_LABELS)
    per_series = RULE_PER_SERIES + RULE_PER_LABEL_PAIR * pairs + 2 * rank.mean_name_length
    unique_values = 2 * ranks  # a rank and an instance value per rank; every other value is shared between ranks
    return RULE_GC * (series * per_series + RULE_PER_UNIQUE_VALUE * unique_values)


def scale_rows(rank: RankFigures, load: dict[str, Any] | None) -> list[dict[str, Any]]:
    rows = []
    measured_per_series = None
    if load and load["head_series"]:
        measured_per_series = (load["rss"] - load["empty_rss"]) / load["head_series"]
    for ranks in (1, *RANKS):
        series = series_in_prometheus(rank) * ranks
        row: dict[str, Any] = {"ranks": f"{ranks:,}", "series": f"{series:,}"}
        for interval in INTERVALS:
            row[f"samples_{interval:g}"] = f"{series / interval:,.0f}"
        row["wire"] = _bytes_rate(rank.bytes_gzip * ranks / INTERVALS[0])
        row["parsed"] = _bytes_rate(rank.bytes_openmetrics * ranks / INTERVALS[0])
        row["rule"] = _bytes(rule_bytes(rank, ranks))
        row["extrapolated"] = _bytes(measured_per_series * series) if measured_per_series else "-"
        rows.append(row)
    return rows


def _bytes(value: float) -> str:
    for unit, size in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if value >= size:
            return f"{value / size:,.1f} {unit}"
    return f"{value:,.0f} B"


def _bytes_rate(value: float) -> str:
    return _bytes(value) + "/s"


# -- the document ---------------------------------------------------------------------------------------------------


def machine_line() -> str:
    from importlib.metadata import version

    return f"{machine()}; prometheus-client {version('prometheus-client')}; Prometheus {prometheus_version()}"


def per_rank_table(figures: list[RankFigures]) -> str:
    rows = [
        {
            "case": f.case,
            "model": f"{f.encoder_layers} encoder layers, {f.layernorms_in_model} LayerNorms",
            "series": f.series,
            "families": f"{f.families} (of {f.declared_families} declared)",
            "buckets": f"{f.bucket_series} ({f.bucket_series / f.series:.0%})",
            "histogram": f"{f.histogram_series} ({f.histogram_series / f.series:.0%})",
            "layers": f.layer_grad_norm_series,
            "weights": f.weight_norm_series,
            "layernorm": f.layernorm_series,
            "om": f"{f.bytes_openmetrics:,}",
            "gzip": f"{f.bytes_gzip:,}",
            "text": f"{f.bytes_text:,}",
        }
        for f in figures
    ]
    return table(
        rows,
        [
            ("case", "configuration"),
            ("model", "model"),
            ("series", "series"),
            ("families", "families with series"),
            ("buckets", "histogram bucket series"),
            ("histogram", "all histogram series"),
            ("layers", "layer grad-norm series"),
            ("weights", "weight-norm series"),
            ("layernorm", "LayerNorm series"),
            ("om", "bytes per scrape (OpenMetrics, as Prometheus asks)"),
            ("gzip", "gzip bytes"),
            ("text", "bytes (classic text)"),
        ],
    )


def family_table(default: RankFigures, upper: RankFigures) -> str:
    names = sorted(
        set(default.per_family) | set(upper.per_family), key=lambda n: (-upper.per_family.get(n, ("", 0))[1], n)
    )
    rows = []
    for name in names:
        kind = (upper.per_family.get(name) or default.per_family[name])[0]
        shown = f"{name}_total" if kind == "counter" else name  # the parser names counter families without it
        rows.append(
            {
                "name": f"`{shown}`",
                "type": kind,
                "default": default.per_family.get(name, ("", 0))[1],
                "upper": upper.per_family.get(name, ("", 0))[1],
            }
        )
    return table(rows, [("name", "family"), ("type", "type"), ("default", default.case), ("upper", upper.case)])


def render(
    figures: list[RankFigures],
    load: dict[str, Any] | None,
    relabeled_load: dict[str, Any] | None,
    checked: list[str],
    command: str,
    seconds: float,
    large: tuple[RankFigures, RankFigures] | None = None,
    jobs: list[dict[str, Any]] | None = None,
) -> str:
    out = [
        BEGIN,
        "<!-- Written by `python -m benchmarks.scaling`: everything up to the end marker is replaced on each run. -->",
        "",
        f"Measured by `{command}` on {datetime.date.today().isoformat()} in {seconds:.0f} s.",
        f"Machine: {machine_line()}.",
        "",
        *one_rank_section(figures),
        *prometheus_seen_section(figures),
        *computed_section(figures, load),
    ]
    if load:
        out += replayed_ranks_section(figures[0], load, relabeled_load)
    if large:
        out += render_large_job(large[1], large[0], jobs or [])
    if checked:
        out += [
            f"`promtool check config` ({prometheus_version()}) accepted the {len(checked)} Prometheus "
            "configuration snippets on this page.",
            "",
        ]
    out.append(END)
    return "\n".join(out)


def one_rank_section(figures: list[RankFigures]) -> list[str]:
    """One rank's series and bytes in each configuration, its families and label values."""
    default, upper = figures[0], figures[1]
    out = [
        "### One rank, measured",
        "",
        f"Real GRAPH-mode training of the demo Transformer (`ms_exporter.demo.build_model`, "
        f"{default.steps} steps, "
        "batch 16, `dataset_sink_mode=False`), `TrainingMonitor(port=0)` with `interval: 1` (memory is sampled "
        "every `interval` seconds and its growth series appear at the first sample after warm-up; the setting "
        "changes no series, only how soon they exist). Then one scrape of the rank's `/metrics`, parsed with "
        "`prometheus_client.parser`.",
        "",
        per_rank_table(figures),
        "",
    ]
    out += _layer_series_lines(figures)
    out.append(
        f"Per series (the name included) a rank's series carry {upper.mean_label_pairs:.1f} label pairs on "
        f"average and names of {upper.mean_name_length:.0f} characters; Prometheus adds "
        f"{', '.join(TARGET_LABELS)} (and whatever the scrape config's relabeling adds)."
    )
    out += _layernorm_lines(upper)
    out += [
        "",
        "Series per family:",
        "",
        family_table(default, upper),
        "",
        "Distinct values per label in the upper-bound configuration (one rank):",
        "",
        ", ".join(f"`{name}` {count}" for name, count in upper.label_values.items()) + ".",
        "",
    ]

    return out


def _layer_series_lines(figures: list[RankFigures]) -> list[str]:
    """Whether the upper-bound configuration reached the cap on layer series, and what it gives on the other
    models."""
    upper = figures[1]
    if upper.layer_grad_norm_series == UPPER_BOUND["grad_norm"]["max_series"]:
        out = [
            f"The second configuration reached the cap: {upper.layer_grad_norm_series} "
            "`mindspore_train_layer_grad_norm` series (`grad_norm.max_series`)."
        ]
    else:
        out = [
            f"**The second configuration did not reach the cap**: {upper.layer_grad_norm_series} "
            f"`mindspore_train_layer_grad_norm` series, not {UPPER_BOUND['grad_norm']['max_series']}."
        ]
    for f in figures[2:]:
        out.append(
            f"On the {f.encoder_layers}-layer model the same configuration gives "
            f"{f.layer_grad_norm_series} layer series: the regexes watch fewer layers there and "
            f"top_k adds {UPPER_BOUND['grad_norm']['top_k']} of what is left."
        )
    return out


def _layernorm_lines(upper: RankFigures) -> list[str]:
    """How LayerNorm statistics grow with depth, where the model has LayerNorms."""
    if not upper.layernorms_in_model:
        return []
    per_norm = upper.layernorm_series / upper.layernorms_in_model
    cap = LayerNormConfig().max_layers
    deep = [(blocks, blocks * 2 + 1) for blocks in (8, 32, 80)]
    return [
        f"LayerNorm statistics are {per_norm:g} series per watched LayerNorm, outside "
        f"`grad_norm.max_series`: they grow with depth up to `layernorm.max_layers` ({cap} by default). "
        "A model with two norms per block and a final one has, per rank, "
        + ", ".join(
            f"{min(norms, cap) * per_norm:,.0f} such series at {blocks} blocks ({norms} norms)"
            for blocks, norms in deep
        )
        + "."
    ]


def prometheus_seen_section(figures: list[RankFigures]) -> list[str]:
    """What a real Prometheus counted of the first two configurations, where it scraped them."""
    seen = [f for f in figures[:2] if f.prometheus]
    if not seen:
        return []
    out = [
        "### As Prometheus saw it",
        "",
        "Prometheus scraped the rank every second (`scrape_interval: 1s`); the values are read through its HTTP API.",
        "",
    ]
    out += [_prometheus_seen_table(seen), ""]
    agree = all(
        f.prometheus["samples_scraped"] == f.series
        and f.prometheus["series_in_head"] == f.series + f.prometheus["synthetic_in_head"]
        for f in seen
    )
    out += [
        (
            "Prometheus counted exactly the series the parser counted, plus its synthetic series per target."
            if agree
            else "**Prometheus's counts differ from the parser's**; see the table."
        ),
        "",
    ]

    return out


def _prometheus_seen_table(seen: list[RankFigures]) -> str:
    """A row per configuration Prometheus scraped: its scrapes, samples and series."""
    rows = []
    for f in seen:
        p = f.prometheus
        rows.append(
            {
                "case": f.case,
                "scrapes": f"{p['scrapes']:.0f}",
                "scraped": f"{p['samples_scraped']:.0f}",
                "added": f"{p['series_added_first_scrape']:.0f}",
                "head": f"{p['series_in_head']:.0f}",
                "synthetic": f"{p['synthetic_in_head']:.0f}",
            }
        )
    return table(
        rows,
        [
            ("case", "configuration"),
            ("scrapes", "scrapes"),
            ("scraped", "`scrape_samples_scraped`"),
            ("added", "`scrape_series_added` (first scrape)"),
            ("head", "series of the target in the head"),
            ("synthetic", "of which `up`/`scrape_*`"),
        ],
    )


def computed_section(figures: list[RankFigures], load: dict[str, Any] | None) -> list[str]:
    """1,000 and 10,000 ranks computed from one rank's figures (and the replayed load's memory per series)."""
    out = [
        "### 1,000 and 10,000 ranks, computed",
        "",
        "Computed from the per-rank figures above: active series = ranks × (series per rank + the synthetic "
        f"`up`/`scrape_*` series); samples/s = active series / scrape interval, for {INTERVALS[0]:g} s (the "
        "ServiceMonitor and PodMonitor in deploy/kubernetes) and "
        f"{INTERVALS[1]:g} s (deploy/prometheus/prometheus.yml scrapes every 5 s, which is three times the "
        f"{INTERVALS[0]:g} s figures; Prometheus's own default is 1 m); ingest = bytes per scrape × ranks / "
        f"{INTERVALS[0]:g} s, gzip-compressed on the wire and uncompressed as parsed.",
        "",
        "Memory is an **estimate**. The rule of thumb is Brian Brazil's for Prometheus 2.x "
        f"([Robust Perception, 2019]({RULE_SOURCE}), profiled on Prometheus 2.9): per series about "
        f"{RULE_PER_SERIES} B + {RULE_PER_LABEL_PAIR} B per label pair + the name twice, "
        f"{RULE_PER_UNIQUE_VALUE} B per unique label value, all doubled for Go's garbage collector; here with "
        "the measured label pairs and name lengths plus the two target labels, and a unique `rank` and "
        "`instance` value per rank. It counts the series, not the samples held in memory; the "
        '"extrapolated" column instead scales linearly what a real Prometheus 2.42 used per head series in '
        "the replayed run below (without relabeling). Neither includes the samples a head block accumulates over "
        "its 2-3 hours, queries, or rule evaluation: size a server well above both.",
        "",
    ]
    columns = [("ranks", "ranks"), ("series", "active series")]
    columns += [(f"samples_{i:g}", f"samples/s at {i:g} s") for i in INTERVALS]
    columns += [
        ("wire", f"on the wire at {INTERVALS[0]:g} s (gzip)"),
        ("parsed", "parsed (uncompressed)"),
        ("rule", "head memory, rule of thumb"),
        ("extrapolated", "head memory, extrapolated"),
    ]
    for f in figures[:2]:
        out += [f"**{f.case}** ({f.encoder_layers} encoder layers):", "", table(scale_rows(f, load), columns), ""]

    return out


def replayed_ranks_section(
    default: RankFigures, load: dict[str, Any], relabeled_load: dict[str, Any] | None
) -> list[str]:
    """A real Prometheus scraping replayed ranks, with and without the page's relabeling."""
    out = ["### A real Prometheus with replayed ranks", ""]
    out += [
        f"One Prometheus scraped {load['ranks']:,} targets every {load['interval']:g} s, each serving the "
        "default configuration's exposition above with its own `rank` label (and its own `instance`), "
        "gzip-compressed, from one local HTTP server; memory was read after every target had been scraped "
        f"at least {load['scrapes_per_target']:.0f} times. RSS is the process's resident set; the same "
        "Prometheus with no targets is subtracted. A few minutes of samples is far from the 2-3 hours a "
        "head block holds, so this is the series cost, not the steady state.",
        "",
    ]
    rows = [
        _replayed_row(default, label, run)
        for label, run in (("none", load), ("the relabeling below", relabeled_load))
        if run
    ]
    out += [
        table(
            rows,
            [
                ("relabel", "metric relabeling"),
                ("targets", "targets"),
                ("failed", "failed scrapes"),
                ("scraped", "samples in the last scrape of every target"),
                ("kept", "kept after relabeling"),
                ("head", "head series"),
                ("rss", "RSS"),
                ("added", "RSS − empty Prometheus"),
                ("per", "per head series"),
                ("heap", "Go heap in use"),
                ("rule", "rule of thumb for these series"),
            ],
        ),
        "",
    ]
    return out


def _replayed_row(default: RankFigures, label: str, run: dict[str, Any]) -> dict[str, str]:
    """One replayed run's figures, beside what the rule of thumb gives for its head series."""
    added = run["rss"] - run["empty_rss"]
    return {
        "relabel": label,
        "targets": f"{run['ranks']:,}",
        "failed": f"{run['failed_scrapes']:.0f}",
        "scraped": f"{run['samples_scraped']:,.0f}",
        "kept": f"{run['samples_kept']:,.0f}",
        "head": f"{run['head_series']:,.0f}",
        "rss": _bytes(run["rss"]),
        "added": _bytes(added),
        "per": f"{added / run['head_series']:,.0f} B",
        "heap": _bytes(run["heap_inuse"]),
        "rule": _bytes(
            rule_bytes(default, run["ranks"]) * run["head_series"] / (series_in_prometheus(default) * run["ranks"])
        ),
    }


RULES_FILE = Path(__file__).resolve().parents[1] / "deploy/prometheus/rules/mindspore-training.rules.yml"
_SERIES_NAME = re.compile(r"(?<![:\w])(mindspore_[a-z0-9_]+)(?![\w:])")
_RECORDED = re.compile(r"(?<![\w:])([a-z_]+:mindspore_[a-z0-9_]+:[a-z0-9_]+)")


def alert_families() -> dict[str, set[str]]:
    """Each alert of the shipped rules file with the families it reads, through the recording rules it reads."""
    from ms_exporter.core import catalogue

    known = {family.name for family in catalogue.FAMILIES}

    def families(expr: str) -> set[str]:
        found = set()
        for name in _SERIES_NAME.findall(expr):
            found.add(
                next(
                    (name.removesuffix(s) for s in ("_sum", "_count", "_bucket") if name.removesuffix(s) in known), name
                )
            )
        return found

    rules = [rule for group in yaml.safe_load(RULES_FILE.read_text())["groups"] for rule in group["rules"]]
    recorded: dict[str, set[str]] = {}
    for rule in rules:  # recording rules read only earlier ones: one pass in file order
        if "record" in rule:
            recorded[rule["record"]] = families(rule["expr"]).union(
                *(recorded.get(name, set()) for name in _RECORDED.findall(rule["expr"]))
            )
    return {
        rule["alert"]: families(rule["expr"]).union(*(recorded.get(n, set()) for n in _RECORDED.findall(rule["expr"])))
        for rule in rules
        if "alert" in rule
    }


def _has(figures: RankFigures, family: str) -> bool:
    # prometheus_client's parser names a counter family without _total
    return figures.per_family.get(family.removesuffix("_total"), ("", 0))[1] > 0


def alert_rows(lean: RankFigures, detail: RankFigures) -> list[dict[str, Any]]:
    """Where each alert can fire under large_job, from what the measured pages hold: on every rank when a non-detail
    rank has every family it reads that a detail rank has; on detail ranks only when not; not in this run when the
    measured rank has none of them (a feature the demo training does not switch on)."""
    rows = []
    for alert, families in alert_families().items():
        measured = sorted(f for f in families if _has(detail, f))
        missing = [f for f in measured if not _has(lean, f)]
        if not measured:
            where = "not in this run (its series come with a feature the demo does not use)"
        elif missing:
            where = "detail ranks only (" + ", ".join(f"`{f}`" for f in missing) + ")"
        else:
            where = "every rank"
        rows.append({"alert": f"`{alert}`", "where": where})
    return rows


def job_rows(jobs: list[dict[str, Any]], detail: RankFigures, lean: RankFigures) -> list[dict[str, Any]]:
    rows = []
    for job in jobs:
        ranks = job["ranks"]
        if "error" in job:
            failed = f"**the run failed** ({job['error']})"
            rows.append(
                {"store": job["store"], "ranks": f"{ranks:,}", "interval": f"{job['interval']:g} s"}
                | dict.fromkeys(("series", "per_rank", "computed", "goal", "samples", "bytes", "rss", "agent"), "-")
                | {"failed": failed}
            )
            continue
        rows.append(
            {
                "store": job["store"],
                "ranks": f"{ranks:,}",
                "interval": f"{job['interval']:g} s",
                "series": f"{job['series']:,.0f}",
                "per_rank": f"{job['series'] / ranks:.1f}",
                # a forwarded job's store holds aggregates, not pages: its breakdown follows the table
                "computed": "-" if "kinds" in job else f"{job_series(detail, lean, ranks, job['synthetic']):,}",
                "goal": "under" if job["series"] < SERIES_GOAL * ranks / 10_000 else "**over**",
                "samples": f"{job['samples_per_second']:,.0f}",
                "bytes": _bytes_rate(job["bytes_per_second"]),
                "failed": f"{job['failed_scrapes']:.0f}",
                "rss": _bytes(job["rss"]),
                "agent": _bytes(job["agent_rss"]) if job["agent_rss"] else "-",
            }
        )
    return rows


def render_large_job(detail: RankFigures, lean: RankFigures, jobs: list[dict[str, Any]]) -> list[str]:
    out = [
        "### Very large jobs: `series_profile: large_job`, measured",
        "",
        f"The same real training ({lean.steps} steps of the 2-layer demo model) with `series_profile: large_job` "
        "and the rank outside `detail_ranks`: its page is a non-detail rank's. Then the same trained rank with "
        "itself in `detail_ranks`, scraped again: a detail rank's page (rank 0 by default).",
        "",
        per_rank_table([lean, detail]),
        "",
        "Series per family on a non-detail rank (histograms among them are `_sum` and `_count` only):",
        "",
        _non_detail_family_table(lean),
        "",
        f"Where each alert of `{RULES_FILE.relative_to(RULES_FILE.parents[3])}` can fire under `large_job`, "
        "from the families it reads (through the recording rules it reads) and the two pages above:",
        "",
        table(alert_rows(lean, detail), [("alert", "alert"), ("where", "fires from")]),
        "",
    ]
    if jobs:
        out += _replayed_jobs_section(jobs, detail, lean)
    return out


def _non_detail_family_table(lean: RankFigures) -> str:
    """The families a non-detail rank serves, most series first."""
    return table(
        [
            {"name": f"`{name}`", "type": kind, "series": count}
            for name, (kind, count) in sorted(lean.per_family.items(), key=lambda item: (-item[1][1], item[0]))
            if count
        ],
        [("name", "family"), ("type", "type"), ("series", "series")],
    )


def _replayed_jobs_section(jobs: list[dict[str, Any]], detail: RankFigures, lean: RankFigures) -> list[str]:
    """The replayed large_job jobs: how they were run, a row per scraper and store, and what was forwarded."""
    out = [
        "A replayed job: one HTTP server serves each rank's page (rank 0 the detail page, every other rank the "
        "non-detail page, each with its own `rank` and `instance`), gzip-compressed, to a real Prometheus and "
        "to vmagent writing to VictoriaMetrics (the shipped `deploy/victoriametrics` flags and scrape config). "
        "Series per job are the store's (Prometheus's head series; VictoriaMetrics' series of the job), read "
        f"once every target had been scraped; samples/s and bytes/s are measured over the next {JOB_SCRAPES} "
        "scrape intervals (samples appended by Prometheus, rows inserted by VictoriaMetrics; bytes the replay "
        'server sent); RSS is the server process\'s. "Computed" is one detail rank plus the non-detail ranks '
        f"plus the scraper's synthetic series per target: Prometheus's {len(SYNTHETIC)} (`up`, `scrape_*`), "
        "vmagent's one more (`scrape_timeout_seconds`). The third run of each size is the job's own "
        "Prometheus (`deploy/prometheus/prometheus-job.yml`: the shipped rules over all ranks) forwarding to "
        "VictoriaMetrics only the rules' `project:` and `rank:` results, `ALERTS` and rank 0's page: its series "
        "per job are the shared store's. The goal is "
        f"under {SERIES_GOAL:,} series per 10,000 ranks (Grafana Mimir's default per-tenant limit).",
        "",
        table(
            job_rows(jobs, detail, lean),
            [
                ("store", "scraper and store"),
                ("ranks", "ranks"),
                ("interval", "scrape interval"),
                ("series", "series per job"),
                ("per_rank", "per rank"),
                ("computed", "computed"),
                ("goal", f"vs {SERIES_GOAL:,} per 10,000"),
                ("samples", "samples/s"),
                ("bytes", "bytes/s (gzip)"),
                ("failed", "failed scrapes"),
                ("rss", "store RSS"),
                ("agent", "scraper RSS (vmagent, the job's Prometheus)"),
            ],
        ),
        "",
    ]
    return out + forwarded_lines(jobs)


def forwarded_lines(jobs: list[dict[str, Any]]) -> list[str]:
    """What the shared store holds of each forwarded job, by kind, against the job's own Prometheus."""
    out = []
    for job in jobs:
        if "kinds" not in job:
            continue
        kinds = job["kinds"]
        rest = job["series"] - sum(kinds.values())
        out += [
            f"Forwarded, {job['ranks']:,} ranks: of the shared store's {job['series']:,.0f} series, "
            f"{kinds['project']:,.0f} are `project:` results, {kinds['rank']:,.0f} `rank:` results "
            f"({kinds['rank'] / job['ranks']:.1f} per rank), {kinds['rank0']:,.0f} rank 0's page and "
            f"{kinds['alerts']:,.0f} `ALERTS`"
            + (f", {rest:,.0f} other" if rest else "")
            + f"; the job's own Prometheus held {job['job_series']:,.0f} head series and evaluated every alert "
            "over all ranks.",
            "",
        ]
    return out


def replace_block(document: str, block: str) -> str:
    if document.count(BEGIN) != 1 or document.count(END) != 1 or document.index(BEGIN) > document.index(END):
        raise ValueError(f"the document needs exactly one {BEGIN} ... {END} block")
    return str(marked_block.replace_block(document, block, BEGIN, END))


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    started = time.monotonic()
    output = Path(args.output)
    document = output.read_text()
    relabel = doc_relabeling(document)
    checked = [promtool_check(block) for block in prometheus_configs(document)] if not args.no_prometheus else []
    seconds = 0.0 if args.no_prometheus else args.prometheus_seconds
    figures = []
    for index, case in enumerate(CASES):
        print(f"training: {case.label} ({case.encoder_layers} encoder layers, {args.steps} steps) ...", flush=True)
        figures.append(measure(case, args.steps, seconds if index < 2 else 0.0))
    load = relabeled = None
    if args.load_ranks and not args.no_prometheus:
        print(f"Prometheus scraping {args.load_ranks} replayed ranks ...", flush=True)
        load = prometheus_load(figures[0].exposition, args.load_ranks, args.load_interval, 3)
        if relabel:
            print("... and again through the page's relabeling ...", flush=True)
            relabeled = prometheus_load(figures[0].exposition, args.load_ranks, args.load_interval, 3, relabel)
    print(f"training: {LARGE_JOB_LEAN} ({args.steps} steps) ...", flush=True)
    large = measure_large_job(args.steps)
    jobs = _large_jobs(args, large)
    command = "python -m benchmarks.scaling" + ("" if argv is None or not argv else " " + " ".join(argv))
    if argv is None and len(sys.argv) > 1:
        command = "python -m benchmarks.scaling " + " ".join(sys.argv[1:])
    block = render(figures, load, relabeled, checked, command, time.monotonic() - started, large, jobs)
    output.write_text(replace_block(output.read_text(), block))  # read again: the prose may have changed meanwhile
    print(per_rank_table(figures))
    print(f"wrote the measured block of {output} in {time.monotonic() - started:.0f} s")
    return 0


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description="per-rank series and bytes, and what many ranks cost Prometheus")
    parser.add_argument("--steps", type=int, default=300, help="training steps per configuration")
    parser.add_argument("--output", default="docs/scaling.md", help="the page whose measured block is rewritten")
    parser.add_argument(
        "--prometheus-seconds", type=float, default=15.0, help="how long a real Prometheus scrapes each rank (0: skip)"
    )
    parser.add_argument("--load-ranks", type=int, default=1000, help="replayed ranks for the memory check (0: skip)")
    parser.add_argument("--load-interval", type=float, default=15.0)
    parser.add_argument("--no-prometheus", action="store_true", help="no Prometheus at all")
    parser.add_argument(
        "--job-ranks",
        default=",".join(str(ranks) for ranks, _ in JOB_RANKS),
        help="replayed large_job jobs, comma-separated rank counts (empty: none)",
    )
    parser.add_argument("--no-victoriametrics", action="store_true", help="replay the large jobs to Prometheus only")
    return parser


def _large_jobs(args: argparse.Namespace, large: tuple[RankFigures, RankFigures]) -> list[dict[str, Any]]:
    """Each `--job-ranks` job replayed from the large_job pages: to Prometheus, and (unless told not to) to vmagent
    -> VictoriaMetrics and through the job's own Prometheus forwarding to VictoriaMetrics."""
    jobs: list[dict[str, Any]] = []
    intervals = dict(JOB_RANKS)
    for ranks in (int(word) for word in args.job_ranks.split(",") if word.strip()):
        if args.no_prometheus:
            break
        interval = intervals.get(ranks, JOB_RANKS[-1][1])
        replay = JobReplay(large[1].exposition, large[0].exposition, ranks)
        try:
            print(f"Prometheus scraping a large_job job of {ranks} replayed ranks every {interval:g} s ...", flush=True)
            jobs.append(_attempt(job_prometheus, replay, interval, f"Prometheus {prometheus_version()}"))
            if not args.no_victoriametrics:
                print("... and vmagent -> VictoriaMetrics ...", flush=True)
                store = f"vmagent + VictoriaMetrics {victoria_metrics_version()}"
                jobs.append(_attempt(job_victoria_metrics, replay, interval, store))
                print("... and the job's own Prometheus forwarding to VictoriaMetrics ...", flush=True)
                store = f"the job's Prometheus {prometheus_version()} -> VictoriaMetrics {victoria_metrics_version()}"
                jobs.append(_attempt(job_forwarded, replay, interval, store))
        finally:
            replay.close()
    return jobs


if __name__ == "__main__":
    sys.exit(main())
