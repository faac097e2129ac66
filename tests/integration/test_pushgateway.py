"""The Pushgateway sink against a real Pushgateway (the Debian package) and real MindSpore training runs."""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import mindspore as ms
import pytest
import yaml
from mindspore import nn
from mindspore.train import Callback, Model

from ms_exporter import TrainingMonitor
from ms_exporter.config import PushgatewayConfig, load_config
from ms_exporter.core import catalogue
from ms_exporter.core.catalogue import MetricFamily
from ms_exporter.core.store import MetricStore
from ms_exporter.demo import build_network, synthetic_dataset
from ms_exporter.generate.rules import LIVE, RULES_FILE
from ms_exporter.sinks.pushgateway import PushgatewaySink
from tests.support.scrape import Scrape, scrape
from tests.support.servers import PrometheusServer, Servers
from tests.support.waiting import free_port, wait_until

pytestmark = pytest.mark.integration
ROOT = Path(__file__).resolve().parents[2]
JOB = "mindspore_training"
BATCH = 8
DATA_SIZE = 96  # 12 batches per epoch
EPOCHS = 2
STEPS = EPOCHS * DATA_SIZE // BATCH


class Gateway:
    """A running prometheus-pushgateway; `group(project)` is what it holds for that project's rank 0."""

    def __init__(self, port: int) -> None:
        self.port = port
        self.url = f"http://127.0.0.1:{port}"

    def scrape(self) -> Scrape:
        return scrape(self.url + "/metrics")

    def group(self, project: str) -> dict[str, float]:
        """name -> value of the pushed series of this group (label sets beyond the grouping key are dropped)."""
        return {
            s.name: s.value
            for s in self.scrape().samples
            if s.labels.get("job") == JOB and s.labels.get("project") == project and s.labels.get("rank") == "0"
        }

    def push_time(self, project: str) -> float | None:
        return self.group(project).get("push_time_seconds")


@pytest.fixture(scope="module")
def gateway(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Gateway]:
    if shutil.which("prometheus-pushgateway") is None:
        pytest.skip("prometheus-pushgateway (the Debian package) is not installed")
    port = free_port()
    servers = Servers(tmp_path_factory.mktemp("pushgateway"))
    # Debian's build persists to /var/lib/prometheus/pushgateway.data by default, which outlives the test run:
    # an empty --persistence.file keeps pushed groups in this gateway's memory only.
    servers.start("prometheus-pushgateway", port, "--persistence.file=", ready_within=30)
    try:
        yield Gateway(port)
    finally:
        servers.stop()


class SlowGateway:
    """Accepts pushes but answers only after `delay` seconds: longer than the sink's timeout."""

    def __init__(self, delay: float) -> None:
        class Handler(BaseHTTPRequestHandler):
            def do_PUT(self) -> None:  # the http.server interface
                self.rfile.read(int(self.headers.get("Content-Length", 0)))
                time.sleep(delay)
                self.send_response(200)
                self.end_headers()

            do_POST = do_PUT

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


class Hook(Callback):
    """Placed after the monitor: records the loss the network returned and runs `at_step(step)`."""

    def __init__(self, at_step: Any = None) -> None:
        super().__init__()
        self.at_step = at_step
        self.losses: list[float] = []

    def on_train_step_end(self, run_context: Any) -> None:
        cb_params = run_context.original_args()
        self.losses.append(float(cb_params.net_outputs.asnumpy()))
        if self.at_step is not None:
            self.at_step(int(cb_params.cur_step_num))


def train(monitor: TrainingMonitor, hook: Hook, epochs: int = EPOCHS) -> None:
    ms.set_context(mode=ms.GRAPH_MODE)
    ms.set_seed(0)
    network = build_network(layers=1, d_model=32, heads=2)
    model = Model(network, optimizer=nn.Momentum(network.trainable_params(), 0.01, 0.9))
    model.train(
        epochs, synthetic_dataset(size=DATA_SIZE, batch=BATCH), callbacks=[monitor, hook], dataset_sink_mode=False
    )


def pushgateway_errors(monitor: TrainingMonitor) -> float:
    family = monitor.store.get("mindspore_exporter_errors_total")
    assert family is not None
    return sum(
        child.value
        for child in family.children()  # type: ignore[union-attr]
        if dict(child.labels).get("component") == "pushgateway"
    )


def test_train_end_pushes_the_final_state_grouped_by_project_and_rank(gateway: Gateway) -> None:
    monitor = TrainingMonitor(port=0, project="pg-test", pushgateway={"url": gateway.url, "on": ["train_end"]})
    hook = Hook()
    try:
        train(monitor, hook)
        own = scrape(monitor.url)
        pushed = [s for s in gateway.scrape().samples if s.labels.get("project") == "pg-test"]
        assert pushed, "nothing pushed for project pg-test"
        assert {(s.labels["job"], s.labels["rank"]) for s in pushed} == {(JOB, "0")}
        group = gateway.group("pg-test")
        assert group["mindspore_train_global_step"] == STEPS
        assert group["mindspore_train_loss"] == own.value("mindspore_train_loss") == hook.losses[-1]
        errors = [s for s in pushed if s.name == "mindspore_exporter_errors_total"]
        assert {s.labels["component"] for s in errors} >= {"pushgateway"} and sum(s.value for s in errors) == 0
        pushed_at = group["push_time_seconds"]
        assert pushed_at > 0 and group["push_failure_time_seconds"] == 0
        # Every series /metrics serves is in the push, histograms included.
        served = {s.name for s in own.samples}
        assert served <= {s.name for s in pushed}
        # The goodput ledger as of the train end, the run's totals too (docs/goodput.md).
        for family in (catalogue.TIME_SECONDS, catalogue.RUN_TIME_SECONDS):
            ledger = {s.labels["bucket"]: s.value for s in pushed if s.name == family.name}
            assert set(ledger) == set(catalogue.TIME_BUCKETS) and ledger["productive"] > 0, family.name
    finally:
        monitor.close()
    assert gateway.push_time("pg-test") == pushed_at  # the run ended with a push: close() does not push again


def test_the_shipped_rules_read_no_pushed_copy(gateway: Gateway, tmp_path: Path) -> None:
    """Prometheus scraping the Pushgateway as shipped (honor_labels) keeps the pushed series without an instance,
    and every selector of the shipped rules leaves them out: a job's last push fires nothing, counts no rank."""
    monitor = TrainingMonitor(port=0, project="pg-rules", pushgateway={"url": gateway.url, "on": ["train_end"]})
    try:
        train(monitor, Hook(), epochs=1)
    finally:
        monitor.close()
    shipped = yaml.safe_load((ROOT / "deploy/prometheus/prometheus.yml").read_text())
    job = next(job for job in shipped["scrape_configs"] if job["job_name"] == "pushgateway")
    job["static_configs"] = [{"targets": [f"127.0.0.1:{gateway.port}"]}]
    prometheus = PrometheusServer(
        {
            "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
            "rule_files": [str(ROOT / RULES_FILE)],
            "scrape_configs": [job],
        },
        str(tmp_path),
    )
    try:
        wait_until(
            lambda: prometheus.query('mindspore_train_info{project="pg-rules"}'), 60, "the pushed series in Prometheus"
        )
        pushed = prometheus.query('{project="pg-rules", __name__=~"mindspore_.*"}')
        assert pushed and all("instance" not in series["metric"] for series in pushed)
        assert {series["metric"]["job"] for series in pushed} == {JOB}
        text = (ROOT / RULES_FILE).read_text()
        names = sorted(set(re.findall(r"(mindspore_\w+)\{" + re.escape(LIVE), text)))
        assert {
            "mindspore_train_info",
            "mindspore_train_loss",
            "mindspore_train_steps_total",
            "mindspore_train_phase",
        } <= set(names)
        for name in names:
            assert prometheus.query(f'{name}{{instance!="", project="pg-rules"}}') == [], name
        assert prometheus.query('mindspore_train_loss{project="pg-rules"}'), "the unfiltered selector sees the push"
        assert prometheus.query('project:mindspore_train_ranks_reporting:count{project="pg-rules"}') == []
    finally:
        prometheus.close()


def test_training_that_raised_still_pushes_its_last_step(gateway: Gateway) -> None:
    def fail(step: int) -> None:
        if step == 5:
            raise RuntimeError("injected training failure")

    monitor = TrainingMonitor(port=0, project="pg-raised", pushgateway={"url": gateway.url})
    try:
        with pytest.raises(RuntimeError, match="injected training failure"):
            train(monitor, Hook(fail))
        assert gateway.group("pg-raised")["mindspore_train_global_step"] == 5
    finally:
        monitor.close()


def test_interval_pushes_while_training_and_stops_when_the_run_ends(gateway: Gateway) -> None:
    seen: list[float] = []

    def wait_for_a_push_of(step: int) -> None:
        # Training is held at step 3 until a periodic push carries it: the push happened during training.
        if step == 3:
            monitor.publish()  # steps microseconds apart wait for the next publication; this hook holds it up
            seen.append(
                wait_until(
                    lambda: gateway.group("pg-interval").get("mindspore_train_global_step", 0) >= 3,
                    15,
                    "a periodic push during training",
                )
            )

    monitor = TrainingMonitor(
        port=0, project="pg-interval", pushgateway={"url": gateway.url, "on": ["interval"], "interval": 0.5}
    )
    try:
        train(monitor, Hook(wait_for_a_push_of), epochs=1)
        assert seen == [True]
        assert not [t for t in threading.enumerate() if t.name == "ms_exporter-pushgateway"]
        last = gateway.push_time("pg-interval")
        time.sleep(1.5)  # three intervals: asserting that nothing happens needs a wait, not a poll
        assert gateway.push_time("pg-interval") == last
        monitor.close()
        assert gateway.push_time("pg-interval") == last  # `on` has no train_end: close() does not push either
        assert pushgateway_errors(monitor) == 0
    finally:
        monitor.close()


def test_a_dead_pushgateway_is_counted_and_never_stops_training() -> None:
    timeout = 1.0
    monitor = TrainingMonitor(
        port=0,
        project="pg-dead",
        pushgateway={
            "url": f"http://127.0.0.1:{free_port()}",
            "on": ["train_end", "interval"],
            "interval": 0.2,
            "timeout": timeout,
        },
    )
    hook = Hook()
    try:
        train(monitor, hook, epochs=1)
        assert len(hook.losses) == STEPS // EPOCHS  # training went on
        assert scrape(monitor.url).value("mindspore_exporter_errors_total", component="pushgateway") > 0
    finally:
        began = time.monotonic()
        monitor.close()
        assert time.monotonic() - began < 3 * timeout + 5  # a hang check, not a speed target


def test_a_slow_pushgateway_times_out_is_counted_and_never_hangs() -> None:
    timeout = 1.0
    slow = SlowGateway(delay=4 * timeout)
    try:
        monitor = TrainingMonitor(
            port=0,
            project="pg-slow",
            pushgateway={"url": slow.url, "on": ["train_end", "interval"], "interval": 0.3, "timeout": timeout},
        )
        hook = Hook()
        try:
            train(monitor, hook, epochs=1)
            assert len(hook.losses) == STEPS // EPOCHS
            assert scrape(monitor.url).value("mindspore_exporter_errors_total", component="pushgateway") > 0
        finally:
            monitor.close()
        # Never trained: close() makes the one push, which meets the slow gateway too.
        untrained = TrainingMonitor(port=0, project="pg-slow-close", pushgateway={"url": slow.url, "timeout": timeout})
        began = time.monotonic()
        untrained.close()
        assert time.monotonic() - began < 3 * timeout + 5  # a hang check, not a speed target
        assert pushgateway_errors(untrained) == 1
    finally:
        slow.close()


def test_start_run_ended_and_close_are_idempotent_and_a_second_run_pushes(gateway: Gateway) -> None:
    store = MetricStore((("rank", "0"), ("project", "pg-unit")))
    value = store.register(MetricFamily("pg_unit_value", "gauge", "A test value.", "1")).series()
    errors: list[tuple[str, BaseException]] = []
    config = PushgatewayConfig(url=gateway.url, on=("train_end", "interval"), interval=0.2, timeout=2.0)
    sink = PushgatewaySink(store, config, lambda component, exc: errors.append((component, exc)))

    def pushers() -> list[threading.Thread]:
        return [t for t in threading.enumerate() if t.name == "ms_exporter-pushgateway"]

    value.value = 1
    sink.on_train_begin({"cur_step_num": 0})
    sink.on_train_begin({"cur_step_num": 0})
    assert len(pushers()) == 1
    sink.on_train_end(0, True)
    assert pushers() == []
    assert gateway.group("pg-unit")["pg_unit_value"] == 1
    sink.on_train_end(0, True)  # twice is harmless
    value.value = 2
    sink.on_train_begin({"cur_step_num": 0})  # a second run
    assert len(pushers()) == 1
    wait_until(lambda: gateway.group("pg-unit").get("pg_unit_value") == 2, 10, "a periodic push of the second run")
    value.value = 3
    sink.on_train_end(0, True)
    assert gateway.group("pg-unit")["pg_unit_value"] == 3
    pushed_at = gateway.push_time("pg-unit")
    sink.close()
    sink.close()
    sink.on_train_begin({"cur_step_num": 0})  # closed: no thread
    assert pushers() == []
    assert gateway.push_time("pg-unit") == pushed_at
    assert errors == []

    # Closed without a run: the one push happens at close.
    other = PushgatewaySink(
        MetricStore((("rank", "0"), ("project", "pg-unit-close"))),
        config,
        lambda component, exc: errors.append((component, exc)),
    )
    other.close()
    assert gateway.push_time("pg-unit-close") is not None
    assert errors == []


# The small network of these tests, trained until stopped, in a process of its own.
SIGTERM_JOB = f"""
import sys
import mindspore as ms
from mindspore import nn
from mindspore.train import Model
from tests.support.servers import PrometheusServer
from ms_exporter import TrainingMonitor
from ms_exporter.demo import build_network, synthetic_dataset

ms.set_context(mode=ms.GRAPH_MODE)
monitor = TrainingMonitor(sys.argv[1])
print(f"metrics: {{monitor.url}}", flush=True)
network = build_network(layers=1, d_model=32, heads=2)
model = Model(network, optimizer=nn.Momentum(network.trainable_params(), 0.01, 0.9))
model.train(1000, synthetic_dataset(size={DATA_SIZE}, batch={BATCH}), callbacks=[monitor], dataset_sink_mode=False)
"""


def test_a_bare_yaml_on_key_is_the_on_setting(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "monitor.yaml"
    path.write_text("monitor_config:\n  pushgateway:\n    url: http://127.0.0.1:9091\n    on: [interval]\n")
    assert load_config(path).pushgateway.on == ("interval",)
    monkeypatch.setenv("MS_EXPORTER_PUSHGATEWAY", "{on: [train_end, interval]}")
    assert load_config(path).pushgateway.on == ("train_end", "interval")


def test_sigterm_pushes_the_last_numbers_of_the_stopped_job(gateway: Gateway, tmp_path: Path) -> None:
    config = tmp_path / "monitor.yaml"
    # Written by hand as a user would: a bare `on:` key, which YAML 1.1 reads as the boolean true.
    config.write_text(
        f"monitor_config:\n  port: 0\n  project: pg-sigterm\n"
        f"  pushgateway:\n    url: {gateway.url}\n    on: [train_end]\n"
    )
    proc = subprocess.Popen(
        [sys.executable, "-c", SIGTERM_JOB, str(config)],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
        env={**os.environ, "PYTHONPATH": str(ROOT), "GLOG_v": "3"},
    )
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        assert line.startswith("metrics: "), line
        url = line.split(" ", 1)[1].strip()

        def step() -> float:
            assert proc.poll() is None, "training ended before the signal"
            try:  # no step series before train begin
                return next(iter(scrape(url, timeout=2).find("mindspore_train_global_step")), 0)
            except OSError:
                return 0

        wait_until(lambda: step() >= 10, 120, "step 10 of the job")
        seen = step()
        assert gateway.push_time("pg-sigterm") is None  # train_end only: nothing pushed while it runs
        proc.send_signal(signal.SIGTERM)
        code = proc.wait(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert code != 0  # the default action still ended the job
    assert gateway.group("pg-sigterm")["mindspore_train_global_step"] >= seen
