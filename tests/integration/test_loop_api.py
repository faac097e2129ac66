"""MindSpore's quick start loop with the monitor's lines added (examples/quickstart_loop.py), trained for real: what it
serves against what the loop computed, against what the Callback serves for the same training, a stall, and the ways a
loop ends (a break, SIGTERM, a script that never closes the monitor) against the shipped rules and routing."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path

import pytest

from tests.support.alert_stack import Stack
from tests.support.scrape import Scrape, scrape
from tests.support.waiting import free_port, wait_until
from tests.support.webhook import Webhook

pytestmark = pytest.mark.integration
ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "quickstart_loop.py"
MODEL_TRAIN = Path(__file__).with_name("quickstart_model_train.py")
PAGES = ("MindSporeTrainingRankMissing", "MindSporeTrainingRankDown")
ALERT_STACK_JOB_PORTS = 4  # the stack fixture scrapes four jobs
SAMPLES = 1280  # 20 steps of 64 per epoch


class Job:
    """A training script run to its end while a thread scrapes its endpoint; keeps the last page it got."""

    def __init__(self, script: Path, port: int, *arguments: str, cwd: Path) -> None:
        self.port = port
        self.log = cwd / f"job-{port}.log"
        env = {**os.environ, "PYTHONPATH": str(ROOT), "GLOG_v": "3"}
        self.process = subprocess.Popen(
            [sys.executable, str(script), "--port", str(port), *arguments],
            stdout=self.log.open("wb"),
            stderr=subprocess.STDOUT,
            env=env,
            cwd=cwd,
        )
        self.last: str | None = None
        self._scraper = threading.Thread(target=self._scrape, daemon=True)
        self._scraper.start()

    def _scrape(self) -> None:
        while self.process.poll() is None:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/metrics", timeout=5) as response:
                    self.last = response.read().decode()
            except OSError:
                pass
            time.sleep(0.25)

    def finish(self, timeout: float = 300) -> Scrape:
        """Waits for the script to end (0) and returns the last page its endpoint served."""
        code = self.process.wait(timeout)
        self._scraper.join(10)
        assert code == 0, self.output()
        assert self.last is not None, self.output()
        return Scrape(self.last)

    def output(self) -> str:
        return self.log.read_text(errors="replace")[-4000:]

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
            self.process.wait(30)


def families(page: Scrape) -> set[str]:
    return set(re.findall(r"^# TYPE (\S+)", page.text, re.M))


@pytest.mark.parametrize("compiled", [False, True], ids=["pynative", "jit"])
def test_the_quick_start_loop_serves_what_it_computed(tmp_path: Path, compiled: bool) -> None:
    """2 epochs of 20 steps: the loss, the LR and the global gradient norm served are the loop's own figures, each
    step's batch counted, the data wait measured between steps, and the run ended as asked."""
    record = tmp_path / "computed.jsonl"
    arguments = ["--epochs", "2", "--samples", str(SAMPLES), "--record", str(record), "--data-seconds", "0.05"]
    job = Job(EXAMPLE, free_port(), *arguments, *(["--jit"] if compiled else []), cwd=tmp_path)
    try:
        page = job.finish()
    finally:
        job.stop()
    computed = [json.loads(line) for line in record.read_text().splitlines()]
    last = computed[-1]
    assert last["step"] == 40
    assert page.value("mindspore_train_global_step") == 40
    assert page.value("mindspore_train_epoch") == 2
    assert page.value("mindspore_train_loss") == pytest.approx(last["loss"], rel=1e-6)
    assert page.value("mindspore_train_learning_rate") == pytest.approx(last["lr"], rel=1e-6)
    # grad_norm.every_n_steps is 10: step 40 was sampled; the device's float32 norms against the loop's float64 one.
    assert page.value("mindspore_train_grad_norm") == pytest.approx(last["grad_norm"], rel=1e-5)
    assert page.value("mindspore_train_samples_total") == 40 * 64
    assert page.value("mindspore_train_data_wait_seconds_count") == 39  # every step but the first waits
    assert page.value("mindspore_train_data_wait_seconds_sum") > 0
    assert page.value("mindspore_train_phase", phase="ended") == 1


def test_the_loop_serves_every_family_the_callback_serves_for_the_same_training(tmp_path: Path) -> None:
    """The quick start's network and data once through the loop API, once through Model.train with the monitor as its
    Callback (and GradNormTrainOneStepCell for the norms): the same families on both pages."""
    loop = Job(EXAMPLE, free_port(), "--epochs", "1", "--samples", str(SAMPLES), cwd=tmp_path)
    try:
        loop_page = loop.finish()
    finally:
        loop.stop()
    callback = Job(MODEL_TRAIN, free_port(), "--samples", str(SAMPLES), cwd=tmp_path)
    try:
        callback_page = callback.finish()
    finally:
        callback.stop()
    assert families(loop_page) == families(callback_page)
    assert loop_page.value("mindspore_train_global_step") == callback_page.value("mindspore_train_global_step") == 20


def test_a_stalled_loop_step_raises_hang_suspected(tmp_path: Path) -> None:
    config = tmp_path / "monitor.yaml"
    config.write_text("hang:\n  min_seconds: 3\n")
    port = free_port()
    job = Job(
        EXAMPLE, port, "--config", str(config), "--samples", str(SAMPLES), "--stall-at", "15", "--stall-seconds",
        "600", cwd=tmp_path,
    )  # fmt: skip
    try:
        wait_until(
            lambda: scrape(f"http://127.0.0.1:{port}/metrics").find("mindspore_train_hang_suspected") == [1.0],
            240,
            "mindspore_train_hang_suspected == 1",
        )
        page = scrape(f"http://127.0.0.1:{port}/metrics")
        assert page.value("mindspore_train_phase", phase="step") == 1  # held inside step 15, which began
        # Published about once a second by the training thread, which is held: up to the steps before the stall.
        assert 1 <= page.value("mindspore_train_global_step") <= 14
    finally:
        job.stop()


def test_a_loop_that_breaks_is_terminated_or_never_closes_pages_nobody(
    stack: Stack, webhook: Webhook, tmp_path: Path
) -> None:
    """A `break` then close(), a SIGTERM mid-loop, and a script that never calls close(): each serves phase="ended"
    until Prometheus read it, so nothing pages. A SIGKILLed loop beside them pages, so the pipeline would have."""
    broken, term, unclosed, killed = stack.job_ports
    long_run = ["--epochs", "1000", "--samples", str(SAMPLES)]
    jobs = {
        "loop-break": Job(EXAMPLE, broken, "--project", "loop-break", *long_run, "--break-at", "150", cwd=tmp_path),
        "loop-term": Job(EXAMPLE, term, "--project", "loop-term", *long_run, cwd=tmp_path),
        "loop-unclosed": Job(
            EXAMPLE,
            unclosed,
            "--project",
            "loop-unclosed",
            "--epochs",
            "7",
            "--samples",
            str(SAMPLES),
            "--no-close",
            cwd=tmp_path,
        ),  # fmt: skip
        "loop-kill": Job(EXAMPLE, killed, "--project", "loop-kill", *long_run, cwd=tmp_path),
    }
    try:
        for project in ("loop-term", "loop-kill"):
            wait_until(
                lambda p=project: stack.query(f'mindspore_train_global_step{{project="{p}"}} > 10'),
                240,
                f"{project} scraped past step 10",
            )
        jobs["loop-term"].process.send_signal(signal.SIGTERM)
        jobs["loop-kill"].process.kill()
        assert jobs["loop-term"].process.wait(240) == -signal.SIGTERM, jobs["loop-term"].output()
        for project in ("loop-break", "loop-unclosed"):
            assert jobs[project].process.wait(300) == 0, jobs[project].output()
        wait_until(lambda: any(a in PAGES for a, _, _ in webhook.firing("loop-kill")), 120, "loop-kill's page")
        for project in ("loop-break", "loop-term", "loop-unclosed"):
            read = stack.query(f'last_over_time(mindspore_train_phase{{project="{project}",phase="ended"}}[10m]) == 1')
            assert read, f"{project}: Prometheus never read phase=ended\n{jobs[project].output()}"
        time.sleep(10)  # RankMissing/RankDown wait 2 s in these rules: well past that, and past loop-kill's page
        pages = [alert for alert in webhook.firing() if alert[0] in PAGES and alert[1] != "loop-kill"]
        assert pages == [], pages
    finally:
        for job in jobs.values():
            job.stop()
