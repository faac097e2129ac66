"""A real msrun job of examples/distributed_train.py on CPU workers, and a real Prometheus discovering its ranks."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from ms_exporter.generate.rules import TEST_TIMING, render_rules, render_yaml
from tests.support.servers import Servers, query
from tests.support.waiting import free_port

ROOT = Path(__file__).resolve().parents[2]


@dataclass
class DistributedJob:
    """An msrun job of examples/distributed_train.py, and a real Prometheus discovering its ranks via file_sd."""

    targets: Path
    base_port: int
    prometheus_port: int

    def query(self, expr: str) -> list[dict[str, Any]]:
        return query(self.prometheus_port, expr)

    def by_rank(self, expr: str) -> dict[str, float]:
        return {r["metric"]["rank"]: float(r["value"][1]) for r in self.query(expr)}

    def alerts(self) -> list[dict[str, Any]]:
        url = f"http://127.0.0.1:{self.prometheus_port}/api/v1/alerts"
        with urllib.request.urlopen(url, timeout=10) as response:
            alerts: list[dict[str, Any]] = json.loads(response.read())["data"]["alerts"]
            return alerts


def msrun_environment(**extra: str) -> dict[str, str]:
    """This process's environment for msrun's workers: the checkout importable, MindSpore's log quiet, and this
    interpreter's folder first on PATH so that the workers' `python` is this venv's."""
    return {
        **os.environ,
        "PYTHONPATH": str(ROOT),
        "GLOG_v": "3",
        "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}",
        **extra,
    }


def msrun_command(env: dict[str, str], workers: int, master_port: int, log_dir: Path, *arguments: str) -> list[str]:
    """msrun starting `workers` local CPU workers of examples/distributed_train.py with `arguments`."""
    return [
        shutil.which("msrun", path=env["PATH"]) or "msrun",
        f"--worker_num={workers}",
        f"--local_worker_num={workers}",
        f"--master_port={master_port}",
        f"--log_dir={log_dir}",
        "--join=True",
        str(ROOT / "examples" / "distributed_train.py"),
        *arguments,
    ]


@contextlib.contextmanager
def distributed_job(
    tmp_path: Path, *arguments: str, workers: int = 2, project: str = "dist", scrape_interval: str = "1s"
) -> Iterator[DistributedJob]:
    """msrun with `workers` CPU workers of examples/distributed_train.py, and Prometheus with the test-timing rules."""
    targets = tmp_path / "sd"
    prometheus_port, base_port, master_port = free_port(), free_port(workers), free_port()
    (tmp_path / "rules.yml").write_text(render_yaml(render_rules(timing=TEST_TIMING, job_regex="mindspore")))
    (tmp_path / "prometheus.yml").write_text(
        yaml.safe_dump(
            {
                "global": {"scrape_interval": scrape_interval, "evaluation_interval": "1s"},
                "rule_files": [str(tmp_path / "rules.yml")],
                "scrape_configs": [
                    {
                        "job_name": "mindspore",
                        "file_sd_configs": [{"files": [str(targets / "ms-exporter-*.json")], "refresh_interval": "1s"}],
                    }
                ],
            }
        )
    )
    env = msrun_environment()
    servers = Servers(tmp_path)
    servers.prometheus(prometheus_port, tmp_path / "prometheus.yml")
    job = subprocess.Popen(
        msrun_command(
            env,
            workers,
            master_port,
            tmp_path / "log",
            "--port",
            str(base_port),
            "--file-sd-dir",
            str(targets),
            "--project",
            project,
            "--linger",
            "300",
            *arguments,
        ),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        env=env,
        cwd=tmp_path,
        start_new_session=True,
    )
    try:
        yield DistributedJob(targets, base_port, prometheus_port)
    finally:
        # msrun starts each worker in a session of its own: killing msrun's group would leave them training.
        for pid_file in targets.glob("pid-rank*"):
            with contextlib.suppress(ProcessLookupError, ValueError):
                os.kill(int(pid_file.read_text()), signal.SIGKILL)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(job.pid, signal.SIGKILL)
        job.wait(30)
        servers.stop()
