"""Real Prometheus-family servers (the Debian packages) for tests and benchmarks: started on a loopback port, awaited
until ready, logging into a scratch directory, and stopped together."""

from __future__ import annotations

import json
import shutil
import subprocess
import urllib.parse
import urllib.request
from pathlib import Path
from typing import IO, Any

import yaml

from tests.support.waiting import free_port, wait_until

PROMETHEUS = shutil.which("prometheus") or "/usr/bin/prometheus"


class Servers:
    """The servers started from here: each logs to `<scratch>/<binary>.log`; stop() ends them all."""

    def __init__(self, scratch: Path) -> None:
        self.scratch = scratch
        self._running: list[tuple[subprocess.Popen[bytes], IO[bytes]]] = []

    def start(self, binary: str, port: int, *options: str, ready_within: float = 60) -> None:
        """Run `binary` listening on 127.0.0.1:port and wait until its /-/ready answers 200."""
        command = [f"--web.listen-address=127.0.0.1:{port}", *options]
        self.run(binary, command, f"http://127.0.0.1:{port}/-/ready", ready_within, every=0.5)

    def run(
        self,
        binary: str,
        command: list[str],
        ready_url: str,
        ready_within: float = 60,
        every: float = 0.5,
        cwd: Path | None = None,
    ) -> None:
        """Run `binary` with `command`, logging to `<scratch>/<binary>.log`, and wait until `ready_url` answers 200."""
        path = shutil.which(binary)
        if path is None:
            raise FileNotFoundError(f"{binary} is not installed (make test installs the Debian packages)")
        log = open(self.scratch / f"{binary}.log", "wb")  # noqa: SIM115 - closed in stop()
        process = subprocess.Popen([path, *command], stdout=log, stderr=subprocess.STDOUT, cwd=cwd)
        self._running.append((process, log))

        def ready() -> bool:
            if process.poll() is not None:
                raise AssertionError(f"{binary} exited with {process.returncode}: see {log.name}")
            with urllib.request.urlopen(ready_url, timeout=2) as response:
                return bool(response.status == 200)

        try:
            wait_until(ready, ready_within, binary, every=every)
        except BaseException:
            self.stop()  # the caller gets the failure, not servers left running
            raise

    def prometheus(self, port: int, config: Path) -> None:
        self.start("prometheus", port, f"--config.file={config}", f"--storage.tsdb.path={self.scratch / 'tsdb'}")

    def alertmanager(self, port: int, config: Path) -> None:
        # No cluster: it would bind the shared port 9094 and wait for its gossip to settle before sending.
        self.start(
            "prometheus-alertmanager",
            port,
            f"--config.file={config}",
            f"--storage.path={self.scratch / 'alertmanager'}",
            "--cluster.listen-address=",
        )

    def stop(self) -> None:
        for process, _ in self._running:
            process.terminate()
        for process, log in self._running:
            try:
                process.wait(30)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait(10)
            log.close()
        self._running.clear()


def query(prometheus_port: int, expr: str) -> list[dict[str, Any]]:
    """The result of an instant query as a list (a scalar result is one element)."""
    url = f"http://127.0.0.1:{prometheus_port}/api/v1/query?" + urllib.parse.urlencode({"query": expr})
    with urllib.request.urlopen(url, timeout=10) as response:
        body = json.loads(response.read())
    assert body["status"] == "success", body
    result = body["data"]["result"]
    return result if isinstance(result, list) else [result]


class PrometheusServer:
    """/usr/bin/prometheus alone on a scratch directory and a free port, with its own queries, RSS and metrics: the
    scaling benchmark and the tests that measure what Prometheus holds."""

    def __init__(self, config: dict[str, Any], scratch: str) -> None:
        self.port = free_port()
        self.base = f"http://127.0.0.1:{self.port}"
        path = Path(scratch) / "prometheus.yml"
        path.write_text(yaml.safe_dump(config, sort_keys=False))
        self.process = subprocess.Popen(
            [
                PROMETHEUS,
                f"--config.file={path}",
                f"--storage.tsdb.path={scratch}/tsdb",
                f"--web.listen-address=127.0.0.1:{self.port}",
                "--log.level=warn",
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        wait_until(
            lambda: urllib.request.urlopen(f"{self.base}/-/ready", timeout=2).status == 200, 60, "Prometheus ready"
        )

    def query(self, expr: str) -> list[dict[str, Any]]:
        url = f"{self.base}/api/v1/query?" + urllib.parse.urlencode({"query": expr})
        with urllib.request.urlopen(url, timeout=30) as response:
            return list(json.loads(response.read())["data"]["result"])

    def scalar(self, expr: str) -> float:
        result = self.query(expr)
        if len(result) != 1:
            raise ValueError(f"{expr}: {len(result)} results")
        return float(result[0]["value"][1])

    def own(self, name: str) -> float:
        """A metric of Prometheus itself, read from its /metrics (it does not scrape itself here)."""
        from prometheus_client.parser import text_string_to_metric_families

        with urllib.request.urlopen(f"{self.base}/metrics", timeout=10) as response:
            text = response.read().decode()
        for family in text_string_to_metric_families(text):
            for sample in family.samples:
                if sample.name == name:
                    return float(sample.value)
        raise KeyError(name)

    def rss(self) -> float:
        import psutil

        return float(psutil.Process(self.process.pid).memory_info().rss)

    def close(self) -> None:
        self.process.terminate()
        try:
            self.process.wait(30)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait(10)
