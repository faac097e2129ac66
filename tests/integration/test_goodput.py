"""The goodput ledger across a real SIGKILL and restart, scraped directly and by a real Prometheus.

examples/resumable_train.py trains 7 epochs of 50 steps (40-60 ms each) with a ModelCheckpoint every 100 steps.
The first process is killed with SIGKILL past step 250; the second, with the same run_id, resumes from the step-200
checkpoint, so it redoes steps 201 to wherever the first one got. Both serve on one port that Prometheus scrapes
every second.
"""

from __future__ import annotations

import json
import os
import signal
import struct
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import yaml

from ms_exporter.core import catalogue as c
from ms_exporter.core.analysis.checkpoint_interval import advised_interval
from ms_exporter.generate.rules import TEST_TIMING, render_rules, render_yaml
from ms_exporter.tools.report import load_run, summary
from tests.support.dashboard_queries import ADVISOR_PANELS, without_data
from tests.support.scrape import Scrape, scrape
from tests.support.servers import Servers, query
from tests.support.waiting import free_port, wait_until

pytestmark = pytest.mark.integration
ROOT = Path(__file__).resolve().parents[2]
RUN_ID = "killed-and-resumed"
LINGER = 15  # seconds the second process serves after training: its last numbers are read meanwhile
KILL_AFTER = 250  # steps


def start(save_dir: Path, port: int, record: Path, *more: str) -> subprocess.Popen[str]:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "GLOG_v": "3"}
    return subprocess.Popen(
        [
            sys.executable,
            str(ROOT / "examples" / "resumable_train.py"),
            "--save-dir",
            str(save_dir),
            "--run-id",
            RUN_ID,
            "--port",
            str(port),
            "--record",
            str(record),
            "--save-seconds",
            "1",
            "--epochs",
            "7",
            "--d-model",
            "192",
            *more,
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=env,
        cwd=ROOT,
    )


def steps_recorded(record: Path) -> dict[int, float]:
    """step -> perf_counter at its end, as the script's own recording callback saw it."""
    if not record.exists():
        return {}
    lines = record.read_text().splitlines()
    return {row["step"]: row["perf"] for row in map(json.loads, lines[:-1] if lines and not lines[-1] else lines)}


def buckets(page: Scrape, family: str) -> dict[str, float]:
    return {labels["bucket"]: page.value(family, bucket=labels["bucket"]) for labels in page.labels_of(family)}


def check_sums_to_wall_time(page: Scrape, read_at: float, started_at: float) -> dict[str, float]:
    """The process's buckets against its age as this test measured it (from Popen to the scrape's answer)."""
    ledger = buckets(page, c.TIME_SECONDS.name)
    assert set(ledger) == set(c.TIME_BUCKETS)
    wall = read_at - started_at
    assert sum(ledger.values()) == pytest.approx(wall, rel=0.02), (ledger, wall)
    return ledger


def check_advice(page: Any, ledger: dict[str, float], gap: float) -> None:
    """The checkpoint interval advisor after one failure, from what the second process served."""
    save = page.value(c.CHECKPOINT_SAVE_SECONDS.name)
    cost = page.value(c.FAILURE_COST.name)
    exposure = sum(page.value(c.RUN_TIME_SECONDS.name, bucket=bucket) for bucket in c.TIME_BUCKETS)
    advised = {bound: page.value(c.CHECKPOINT_INTERVAL_ADVISED.name, bound=bound) for bound in c.ADVISED_BOUNDS}
    print(f"\nadvice: save {save:.3f} s, failure cost {cost:.1f} s, exposure {exposure:.1f} s, advised {advised}")
    assert 0 < save < 10
    assert page.value(c.MTBF.name) == pytest.approx(exposure, rel=0.05)  # one failure
    # The dead time (the first process's last state save, goodput.save_seconds (5 s) before the kill at most on an
    # idle machine, later saves on a loaded one, to the second's start), then its start-up and compilation.
    assert gap + ledger[c.STARTUP] + ledger[c.COMPILE] - 1 <= cost <= gap + 20 + ledger[c.STARTUP] + ledger[c.COMPILE]
    assert advised["low"] < advised["best"] < advised["high"]
    # Advised at the last state save from the exposure it served as the MTBF then (one failure), not this reading's.
    assert advised["best"] == pytest.approx(advised_interval(save, page.value(c.MTBF.name), 1, cost), rel=1e-9)


def test_redo_and_restarts_after_a_sigkill_in_the_ledger_and_in_prometheus(tmp_path: Path) -> None:
    save_dir, port, prometheus_port = tmp_path / "save", free_port(), free_port()
    (tmp_path / "rules.yml").write_text(render_yaml(render_rules(timing=TEST_TIMING, job_regex="mindspore")))
    (tmp_path / "prometheus.yml").write_text(
        yaml.safe_dump(
            {
                "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
                "rule_files": [str(tmp_path / "rules.yml")],
                "scrape_configs": [{"job_name": "mindspore", "static_configs": [{"targets": [f"127.0.0.1:{port}"]}]}],
            }
        )
    )
    servers = Servers(tmp_path)
    servers.prometheus(prometheus_port, tmp_path / "prometheus.yml")
    processes: list[subprocess.Popen[str]] = []
    try:
        # The first process, killed past step 250 (its last checkpoint is step 200's).
        first_record = tmp_path / "first.jsonl"
        started_at = time.time()
        processes.append(start(save_dir, port, first_record))
        wait_until(lambda: len(steps_recorded(first_record)) >= KILL_AFTER, 300, f"{KILL_AFTER} steps")
        page = scrape(f"http://127.0.0.1:{port}/metrics")
        check_sums_to_wall_time(page, time.time(), started_at)
        assert page.value(c.RESTARTS.name) == 0
        processes[0].send_signal(signal.SIGKILL)
        killed_at = time.time()
        processes[0].wait(30)
        reached = max(steps_recorded(first_record))
        mark = struct.unpack("<q", (save_dir / f"ms_exporter-run-{RUN_ID}-rank0.step").read_bytes())[0]
        # The monitor's step end comes before the recording callback's: a kill between them is one step apart.
        assert reached <= mark <= reached + 1
        wait_until(
            lambda: query(prometheus_port, f'up{{instance="127.0.0.1:{port}"}} == 0'),
            30,
            "Prometheus to see the first process gone",
        )

        # The second process resumes from the step-200 checkpoint with the same run_id.
        second_record = tmp_path / "second.jsonl"
        started_at = time.time()
        processes.append(start(save_dir, port, second_record, "--linger", str(LINGER)))
        assert processes[1].stdout is not None
        output = []
        for line in processes[1].stdout:
            output.append(line)
            if line.startswith("training ended"):
                break
        page = scrape(f"http://127.0.0.1:{port}/metrics")
        ledger = check_sums_to_wall_time(page, time.time(), started_at)
        assert "resumed from resumable-4_50.ckpt (epoch 4)\n" in output, "".join(output)
        assert page.value(c.RESTARTS.name) == 1
        # Redo: from the end of the first step after the restart (compile, step 201) to the end of the highest
        # step the killed process reached, as the recording callback measured it.
        redone = steps_recorded(second_record)
        assert min(redone) == 201 and max(redone) == 350
        reference = redone[mark] - redone[201]
        print(f"\nredo: ledger {ledger[c.REDO]:.3f} s, recorded {reference:.3f} s for steps 202-{mark}")
        assert ledger[c.REDO] == pytest.approx(reference, rel=0.05)
        assert ledger[c.PRODUCTIVE] > 0 and ledger[c.COMPILE] > 0 and ledger[c.STARTUP] > 0
        check_advice(page, ledger, started_at - killed_at)
        # The advisor's dashboard panels, while the second process lingers (an ended target's series go stale).
        wait_until(
            lambda: not without_data(lambda expr: query(prometheus_port, expr), "resumable", titles=ADVISOR_PANELS),
            LINGER - 3,
            "the checkpoint advisor's panels to have data",
        )
        processes[1].wait(60)
        assert processes[1].returncode == 0, "".join(output) + processes[1].stdout.read()

        # Prometheus: what it read of the run's totals, across the kill, and the recording rule over them.
        state = json.loads((save_dir / f"ms_exporter-run-{RUN_ID}-rank0.json").read_text())
        assert state["restarts"] == 1 and state["finished"] is True
        final = {
            bucket: state["earlier_seconds"][bucket] + state["process"]["seconds"][bucket] for bucket in c.TIME_BUCKETS
        }
        read = {
            r["metric"]["bucket"]: [float(value) for _, value in r["values"]]
            for r in query(prometheus_port, f"{c.RUN_TIME_SECONDS.name}[1h]")
        }
        assert set(read) == set(c.TIME_BUCKETS)
        for bucket, values in read.items():
            assert values == sorted(values), f"{bucket} went back: {values}"  # across the kill too: no reset
            # The last reading is the ledger's final figure, but for the linger after training (`other`), which
            # goes on a second or two past the last scrape.
            assert values[-1] == pytest.approx(final[bucket], abs=3.0 if bucket == c.OTHER else 0.01), bucket
        assert read[c.REDO][-1] == pytest.approx(ledger[c.REDO], abs=0.01)
        # The JSON Lines file both processes appended to: its last snapshot (at close) holds the run's final
        # ledger, which `ms-exporter report` draws as one bar.
        facts = summary(load_run([save_dir / "metrics-rank0.jsonl"]))
        assert facts["restarts"] == 1 and facts["time"] == pytest.approx(final, abs=1e-6)
        advice = facts["checkpoint"]  # what `ms-exporter report` prints under the bar
        assert 0 < advice["low"] < advice["advised"] < advice["high"] and advice["mtbf"] > 0, advice
        expected = (read[c.PRODUCTIVE][-1] - read[c.PRODUCTIVE][0]) / sum(v[-1] - v[0] for v in read.values())

        def recorded() -> list[dict[str, Any]]:
            time.sleep(2)  # a rule evaluation after the last scrape
            return query(prometheus_port, c.PROJECT_GOODPUT_1H)

        (rule,) = wait_until(recorded, 30, c.PROJECT_GOODPUT_1H)
        print(f"goodput: rule {float(rule['value'][1]):.4f}, from the readings {expected:.4f}")
        # increase() extrapolates every series alike to the window's edges, except where a counter's first value is
        # near 0 (it stops at 0 there): the ratio moves by a fraction of a percent.
        assert float(rule["value"][1]) == pytest.approx(expected, abs=0.01)
    finally:
        for process in processes:
            if process.poll() is None:
                process.kill()
                process.wait(30)
        servers.stop()
