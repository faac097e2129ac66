"""Two real scrapers on one rank (Prometheus, and vmagent writing to VictoriaMetrics for vmalert), and a normal
end: both read `phase="ended"`, and neither engine's rules page RankMissing or RankDown for the rank that left.

The run is ended just after vmagent, the slower scraper, scraped: Prometheus reads the end twice long before
vmagent asks again, so an end that waited for the first scraper only would be gone when vmagent comes back.
"""

from __future__ import annotations

import json
import threading
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import mindspore as ms
import pytest
import yaml
from mindspore import nn
from mindspore.train import Callback, Model

from ms_exporter import TrainingMonitor
from ms_exporter.demo import build_network, synthetic_dataset
from ms_exporter.endpoint.pages import MetricsPages
from ms_exporter.sinks.prometheus import PrometheusEndpoint
from tests.support.servers import Servers, query
from tests.support.victoriametrics import VictoriaMetrics
from tests.support.waiting import free_port, wait_until

pytestmark = pytest.mark.integration
ROOT = Path(__file__).resolve().parents[2]
RULES = ROOT / "deploy/prometheus/rules/mindspore-training.rules.yml"
PROJECT = "two-scrapers"
PAGES = ("MindSporeTrainingRankMissing", "MindSporeTrainingRankDown")
VMAGENT_INTERVAL = 6.0  # seconds; Prometheus scrapes every second
VMAGENT_AGENT = "vm_promscrape"  # vmagent's User-Agent


class StopWhenAsked(Callback):
    """Ends training normally (MindSpore's request_stop) at the first step end after `stop` is set."""

    def __init__(self, stop: threading.Event) -> None:
        super().__init__()
        self.stop = stop

    def on_train_step_end(self, run_context: Any) -> None:
        time.sleep(0.05)
        if self.stop.is_set():
            run_context.request_stop()


def pages_of(monitor: TrainingMonitor) -> MetricsPages:
    endpoint = next(sink for sink in monitor.parts if isinstance(sink, PrometheusEndpoint))
    assert endpoint._server is not None
    return endpoint._server.pages


def last_request(pages: MetricsPages, user_agent_prefix: str) -> float | None:
    """perf_counter time of the newest /metrics request from the scraper whose User-Agent starts so."""
    with pages.scrapers._lock:
        times = [
            s.requests[-1] for (_, agent), s in pages.scrapers._scrapers.items() if agent.startswith(user_agent_prefix)
        ]
    return max(times) if times else None


def vmalert_alerts(vm: VictoriaMetrics) -> list[dict[str, Any]]:
    with urllib.request.urlopen(f"http://127.0.0.1:{vm.vmalert_port}/api/v1/alerts", timeout=10) as response:
        return list(json.loads(response.read())["data"]["alerts"] or [])  # null when none


def last_evaluations(rules_url: str) -> dict[str, str]:
    """When each of PAGES was last evaluated, from a rules API (Prometheus's and vmalert's share its shape)."""
    with urllib.request.urlopen(rules_url, timeout=10) as response:
        groups = json.loads(response.read())["data"]["groups"]
    return {
        rule["name"]: str(rule["lastEvaluation"])
        for group in groups
        for rule in group["rules"]
        if rule["name"] in PAGES
    }


@pytest.fixture
def scrapers(tmp_path: Path) -> Iterator[tuple[int, VictoriaMetrics, Path]]:
    targets = tmp_path / "targets"
    targets.mkdir()
    prometheus_port, alertmanager = free_port(), f"http://127.0.0.1:{free_port()}"  # nobody listens: no pages sent
    (tmp_path / "prometheus.yml").write_text(
        yaml.safe_dump(
            {
                "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
                "rule_files": [str(RULES)],
                "scrape_configs": [
                    {
                        "job_name": "mindspore",
                        "file_sd_configs": [{"files": [str(targets / "ms-exporter-*.json")], "refresh_interval": "1s"}],
                    }
                ],
            }
        )
    )
    servers = Servers(tmp_path)
    vm = VictoriaMetrics(tmp_path)
    try:
        servers.prometheus(prometheus_port, tmp_path / "prometheus.yml")
        vm.store()
        vm.vmagent(targets, scrape_interval=f"{VMAGENT_INTERVAL:g}s")
        vm.vmalert(alertmanager)
        yield prometheus_port, vm, targets
    finally:
        vm.stop()
        servers.stop()


def test_a_rank_that_ends_normally_is_read_as_ended_by_both_scrapers_and_pages_neither(
    scrapers: tuple[int, VictoriaMetrics, Path],
) -> None:
    prometheus_port, vm, targets = scrapers
    ms.set_context(mode=ms.GRAPH_MODE)
    network = build_network(layers=1, d_model=32, heads=2)
    model = Model(network, optimizer=nn.Momentum(network.trainable_params(), 0.01, 0.9))
    monitor = TrainingMonitor(
        port=0, project=PROJECT, interval=0.5, file_sd_dir=str(targets), save_dir=str(targets.parent / "run")
    )
    stop = threading.Event()
    training = threading.Thread(
        target=model.train,
        args=(1000, synthetic_dataset(size=64, batch=8)),
        kwargs={"callbacks": [monitor, StopWhenAsked(stop)], "dataset_sink_mode": False},
        daemon=True,
    )
    training.start()
    try:
        pages = pages_of(monitor)
        selector = f'mindspore_train_steps_total{{project="{PROJECT}"}}'
        wait_until(lambda: query(prometheus_port, selector) and vm.query(selector), 120, "both engines store the rank")
        # Both scrapers scrape regularly; then the run ends right after vmagent's scrape.
        wait_until(lambda: len(pages.scrapers._scrapers) == 2, 60, "two scrapers seen")
        seen = last_request(pages, VMAGENT_AGENT)
        wait_until(lambda: last_request(pages, VMAGENT_AGENT) != seen, 3 * VMAGENT_INTERVAL, "a vmagent scrape")
        stop.set()
        training.join(60)
        assert not training.is_alive()
    finally:
        stop.set()
        monitor.close()  # lingers for the scrapers, then removes the file_sd target
    assert not list(targets.glob("ms-exporter-*.json"))

    # Both read the end...
    ended = f'last_over_time(mindspore_train_phase{{project="{PROJECT}",phase="ended"}}[5m]) == 1'
    assert query(prometheus_port, ended), "Prometheus never read phase=ended"
    wait_until(lambda: vm.query(ended), 30, "VictoriaMetrics holds phase=ended (vmagent read the end)")

    # ...and once the rank is gone from both, each engine's rules have evaluated without a page for it.
    gone = f'absent(mindspore_train_steps_total{{project="{PROJECT}"}})'
    wait_until(lambda: query(prometheus_port, gone) and vm.query(gone), 120, "the rank gone from both engines")
    for rules_url in (
        f"http://127.0.0.1:{prometheus_port}/api/v1/rules",
        f"http://127.0.0.1:{vm.vmalert_port}/api/v1/rules",
    ):
        evaluated = last_evaluations(rules_url)
        assert sorted(evaluated) == sorted(PAGES), evaluated
        wait_until(
            lambda url=rules_url, before=evaluated: all(a != before[n] for n, a in last_evaluations(url).items()),
            60,
            f"an evaluation of {rules_url} after the rank was gone",
        )
    prometheus_alerts = query(prometheus_port, f'ALERTS{{project="{PROJECT}"}}')
    assert not [a for a in prometheus_alerts if a["metric"]["alertname"] in PAGES], prometheus_alerts
    paged = [a for a in vmalert_alerts(vm) if a["name"] in PAGES and a["labels"].get("project") == PROJECT]
    assert not paged, paged
