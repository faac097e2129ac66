"""Which rank, and where: a real 3-worker msrun job whose rank 1 data iterator blocks at step ~150.

Ranks 0 and 2 then wait for rank 1 in the gradient all-reduce (phase `step`) while rank 1 waits in its data
iterator (phase `data_wait`). Checked live and afterwards: the phases, rank 1's stack dump, `ms-exporter hangs`
over the endpoints and over the save_dirs, and a real Prometheus with the rules firing MindSporeTrainingHang for
rank 1 only. On CPU the collective gives up about 30 s after the block and msrun ends the job: the verdict must
come before that (hang.min_seconds 3 here; steps take 0.1-0.3 s).
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any

import pytest
import yaml

from ms_exporter.generate.rules import TEST_TIMING, render_rules, render_yaml
from tests.scrape import scrape
from tests.waiting import free_port, wait_until

pytestmark = pytest.mark.integration
ROOT = Path(__file__).resolve().parents[2]
WORKERS = 3


def query(port: int, expr: str) -> list[dict[str, Any]]:
    url = f"http://127.0.0.1:{port}/api/v1/query?" + urllib.parse.urlencode({"query": expr})
    with urllib.request.urlopen(url, timeout=10) as response:
        return list(json.loads(response.read())["data"]["result"])


def phases(port: int) -> dict[str, tuple[str, float]]:
    """rank -> (phase, seconds in it), straight from each rank's endpoint."""
    found = {}
    for rank in range(WORKERS):
        page = scrape(f"http://127.0.0.1:{port + rank}/metrics")
        (phase,) = [labels["phase"] for labels in page.labels_of("mindspore_train_phase")
                    if page.value("mindspore_train_phase", phase=labels["phase"]) == 1]
        found[str(rank)] = (phase, page.value("mindspore_train_phase_seconds"))
    return found


def hangs(*targets: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "ms_exporter", "hangs", *targets], capture_output=True, text=True,
                          check=False, cwd=ROOT, timeout=60)


def test_the_rank_whose_data_iterator_blocks_is_named_live_and_afterwards(tmp_path: Path) -> None:
    targets, saves = tmp_path / "sd", tmp_path / "save"
    prometheus_port, base_port, master_port = free_port(), free_port(WORKERS), free_port()
    (tmp_path / "rules.yml").write_text(render_yaml(render_rules(timing=TEST_TIMING, job_regex="mindspore")))
    (tmp_path / "prometheus.yml").write_text(yaml.safe_dump({
        "global": {"scrape_interval": "5s", "evaluation_interval": "1s"},
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
    job = subprocess.Popen([shutil.which("msrun", path=env["PATH"]) or "msrun", f"--worker_num={WORKERS}",
                            f"--local_worker_num={WORKERS}", f"--master_port={master_port}",
                            f"--log_dir={tmp_path / 'log'}", "--join=True",
                            str(ROOT / "examples" / "distributed_train.py"), "--port", str(base_port),
                            "--file-sd-dir", str(targets), "--project", "hang", "--epochs", "50",
                            "--block-rank", "1", "--block-after", "2400", "--hang-min-seconds", "3",
                            "--save-dir", str(saves)],
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env, cwd=tmp_path,
                           start_new_session=True)
    endpoints = [f"127.0.0.1:{base_port + rank}" for rank in range(WORKERS)]
    try:
        blocked_at = float(wait_until(lambda: (saves / "blocked-at").exists() and (saves / "blocked-at").read_text(),
                                      300, "rank 1's data loader to block"))
        # Live: rank 1 waits in its data iterator, ranks 0 and 2 inside their step, in the all-reduce.
        def hung() -> dict[str, tuple[str, float]] | None:
            now = phases(base_port)
            return now if now["1"][0] == "data_wait" and now["1"][1] > 3 and now["0"][0] == now["2"][0] == "step" \
                else None

        wait_until(hung, 20, "rank 1 in data_wait past its deadline, ranks 0 and 2 in step")
        live = hangs(*endpoints)
        assert live.returncode == 1, live.stdout + live.stderr
        assert "project hang: rank 1 never arrived: in data_wait while 2 rank(s) are in step" in live.stdout
        firing = wait_until(lambda: query(prometheus_port, 'ALERTS{alertname="MindSporeTrainingHang", '
                                                           'alertstate="firing"}'), 25, "MindSporeTrainingHang")
        assert [(a["metric"]["rank"], a["metric"]["phase"], a["metric"]["verdict"]) for a in firing] == [
            ("1", "data_wait", "never arrived")]
        seconds = time.time() - blocked_at
        print(f"\nMindSporeTrainingHang firing {seconds:.1f} s after rank 1's data loader blocked")
        (dump,) = (saves / "rank1").glob("hang-rank1-*.txt")
        text = dump.read_text()
        assert text.splitlines()[1].startswith("phase: data_wait for ")
        assert "in __getitem__" in text and "self._never.wait()" in text  # the blocked loader's frame
        assert re.search(r"training thread top frame: .*mindspore.*", text), text.splitlines()[2]
    finally:
        # msrun starts each worker in a session of its own: killing msrun's group would leave them training.
        for pid_file in targets.glob("pid-rank*"):
            with contextlib.suppress(ProcessLookupError, ValueError):
                os.kill(int(pid_file.read_text()), signal.SIGKILL)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(job.pid, signal.SIGKILL)
        job.wait(60)
        prometheus.terminate()
        prometheus.wait(30)
    # Afterwards, from what the ranks left in their save_dirs.
    later = hangs(*(str(saves / f"rank{rank}") for rank in range(WORKERS)))
    assert "project hang: rank 1 never arrived: in data_wait" in later.stdout, later.stdout + later.stderr
