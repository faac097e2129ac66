"""Real data-parallel training under msrun (2 CPU workers), discovered by a real Prometheus through file_sd."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any

import pytest
import yaml

from ms_exporter.rules import TEST_TIMING, render_rules, render_yaml
from tests.scrape import scrape

pytestmark = pytest.mark.integration
ROOT = Path(__file__).resolve().parents[2]
STEPS = 64  # 1024 samples / batch 16 / 2 shards = 32 steps per epoch, 2 epochs


def free_port(count: int = 1) -> int:
    """A port p such that p .. p+count-1 are all free on loopback."""
    for _ in range(100):
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            base = int(probe.getsockname()[1])
        if base + count > 65535:
            continue
        try:
            for offset in range(1, count):
                with socket.socket() as other:
                    other.bind(("127.0.0.1", base + offset))
            return base
        except OSError:
            continue
    raise RuntimeError("no free port range")


def wait_until(condition: Any, seconds: float, what: str) -> Any:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        try:
            result = condition()
        except OSError:
            result = None
        if result:
            return result
        time.sleep(0.5)
    raise AssertionError(f"timed out after {seconds:.0f} s waiting for {what}")


def test_two_ranks_discovered_aggregated_and_a_dead_rank_alerts(tmp_path: Path) -> None:
    targets = tmp_path / "sd"
    prometheus_port, base_port, master_port = free_port(), free_port(2), free_port()
    (tmp_path / "rules.yml").write_text(render_yaml(render_rules(timing=TEST_TIMING, job_regex="mindspore")))
    (tmp_path / "prometheus.yml").write_text(yaml.safe_dump({
        "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
        "rule_files": [str(tmp_path / "rules.yml")],
        "scrape_configs": [{"job_name": "mindspore", "file_sd_configs": [
            {"files": [str(targets / "ms-exporter-*.json")], "refresh_interval": "1s"}]}],
    }))
    env = {**os.environ, "PYTHONPATH": str(ROOT), "GLOG_v": "3",
           "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"}
    prometheus = subprocess.Popen([shutil.which("prometheus") or "prometheus",
                                   f"--config.file={tmp_path / 'prometheus.yml'}",
                                   f"--storage.tsdb.path={tmp_path / 'tsdb'}",
                                   f"--web.listen-address=127.0.0.1:{prometheus_port}"],
                                  stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    job = subprocess.Popen([shutil.which("msrun", path=env["PATH"]) or "msrun", "--worker_num=2",
                            "--local_worker_num=2", f"--master_port={master_port}", f"--log_dir={tmp_path / 'log'}",
                            "--join=True", str(ROOT / "examples" / "distributed_train.py"), "--port", str(base_port),
                            "--file-sd-dir", str(targets), "--project", "dist", "--linger", "300"],
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env, cwd=tmp_path,
                           start_new_session=True)

    def query(expr: str) -> list[dict[str, Any]]:
        url = f"http://127.0.0.1:{prometheus_port}/api/v1/query?" + urllib.parse.urlencode({"query": expr})
        with urllib.request.urlopen(url, timeout=10) as response:
            return json.loads(response.read())["data"]["result"]

    try:
        files = wait_until(lambda: sorted(targets.glob("ms-exporter-dist-rank*.json")) if len(
            list(targets.glob("ms-exporter-dist-rank*.json"))) == 2 else None, 180, "both ranks' target files")
        ports = [json.loads(f.read_text())[0]["targets"][0].rsplit(":", 1)[1] for f in files]
        assert ports == [str(base_port), str(base_port + 1)]  # port = base + local rank
        for rank, port in enumerate(ports):
            info = scrape(f"http://127.0.0.1:{port}/metrics").labels_of("mindspore_train_info")
            assert len(info) == 1 and info[0]["rank"] == str(rank) and info[0]["world_size"] == "2"
            assert info[0]["local_rank"] == str(rank)

        wait_until(lambda: len(query('up{job="mindspore"} == 1')) == 2, 60, "Prometheus discovering both ranks")
        # Training ends; the endpoints linger with their final values, so the rule's mean can be checked exactly.
        wait_until(lambda: len(query(f'mindspore_train_global_step{{project="dist"}} == {STEPS}')) == 2, 240,
                   f"both ranks at step {STEPS}")
        time.sleep(3)
        losses = {r["metric"]["rank"]: float(r["value"][1]) for r in query('mindspore_train_loss{project="dist"}')}
        assert set(losses) == {"0", "1"} and losses["0"] != losses["1"]  # each rank reports its own shard's loss
        (mean,) = query('project:mindspore_train_loss:mean{project="dist"}')
        assert float(mean["value"][1]) == pytest.approx((losses["0"] + losses["1"]) / 2, rel=1e-9)

        os.kill(int((targets / "pid-rank1").read_text()), signal.SIGKILL)  # no chance to leave discovery
        # (msrun then stops the other worker too; rank 1's endpoint must be among the ones reported down.)
        rank1 = f"127.0.0.1:{base_port + 1}"
        wait_until(lambda: rank1 in {a["metric"]["instance"] for a in query(
            'ALERTS{alertname="MindSporeTrainingRankDown", alertstate="firing"}')}, 60, "RankDown for rank 1")
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(job.pid, signal.SIGKILL)  # msrun and both workers
        job.wait(30)
        prometheus.terminate()
        prometheus.wait(30)
