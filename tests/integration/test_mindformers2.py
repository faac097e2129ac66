"""MindSpore Transformers 2.0.0's PyNative Trainer callbacks for real: its own CallbackHandler drives
PyNativeTrainingMonitor, built from a run YAML's `callbacks:` by its own registry, around real MindSpore PYNATIVE
steps, in the order and with the arguments trainer/trainer.py uses (tests/integration/mindformers2_job.py says what
stands in for the Trainer itself). ./.mindformers2 holds the package, installed without its dependencies by
`make mindformers2` (tests/support/mindformers2.py); the jobs run with it on PYTHONPATH, this process never imports it.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from ms_exporter.mindformers import REGISTER_PATH
from tests.support import mindformers2
from tests.support.scrape import Scrape

pytestmark = pytest.mark.integration

HERE = Path(__file__).resolve().parent
RUN_YAML = HERE / "data" / "mindformers2_run.yaml"
STEPS = 10  # training.steps
SAVE_EVERY, SAVE_SECONDS = 5, 2.0  # mindformers2_job.py's stand-in CheckpointCallback
SAMPLES_PER_STEP = 8  # local_batch_size 4 x 2 accumulation steps


def _job(tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    if not mindformers2.installed():
        pytest.skip(f"MindSpore Transformers 2.0.0 is not installed in {mindformers2.TARGET.name}: make mindformers2")
    env = {k: v for k, v in os.environ.items() if not k.startswith("MS_EXPORTER_")}
    env = mindformers2.environment(env)
    env["PYTHONPATH"] += os.pathsep + str(mindformers2.REPO)
    # The registry's loader of classes by path: where run_mindformer.py --register_path points it, and where it
    # copies the loaded file (its module cache, by default ./modules).
    env.update(REGISTER_PATH=str(REGISTER_PATH), OM_MODULES_CACHE=str(tmp_path / "modules"))
    done = subprocess.run(
        [sys.executable, str(HERE / "mindformers2_job.py"), *args],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, (done.stdout + done.stderr)[-5000:]
    return done


def test_the_trainers_callback_handler_drives_it_and_metrics_show_what_the_handler_passed(tmp_path: Path) -> None:
    done = _job(tmp_path, "train", str(RUN_YAML), str(tmp_path))
    # Built by the registry from the entry's auto_register (REGISTER_PATH), a subclass of 2.0.0's TrainerCallback.
    assert "BUILT ms_exporter.monitor.mindformers_trainer PyNativeTrainingMonitor True" in done.stdout, done.stdout
    assert "MINDFORMERS2_TRAIN_DONE 2.0.0" in done.stdout
    records: list[dict[str, Any]] = [json.loads(line) for line in (tmp_path / "steps.jsonl").open()]
    assert [r["step"] for r in records] == list(range(1, STEPS + 1))
    for record in records:
        served, step = Scrape(record["metrics"]), record["step"]
        assert served.value("mindspore_train_global_step") == step
        assert served.value("mindspore_train_loss") == pytest.approx(record["loss"], rel=1e-6), step
        assert served.value("mindspore_train_grad_norm") == pytest.approx(record["grad_norm"], rel=1e-6), step
        # The LR probe reads the optimizer's schedule: the LR the step applied, not the next step's.
        assert served.value("mindspore_train_learning_rate") == pytest.approx(record["lr"], rel=1e-6), step
        assert served.value("mindspore_train_samples_total") == SAMPLES_PER_STEP * step
        assert served.value("mindspore_train_info", project="pynative-tiny") == 1  # the entry's own keys
        assert served.value("mindspore_train_steps_total") == step
    # The loss moved: these are training steps, not one value repeated.
    assert len({round(r["loss"], 6) for r in records}) > 1
    ended = Scrape((tmp_path / "ended.txt").read_text())
    assert ended.value("mindspore_train_phase", phase="ended") == 1  # on_train_end ended the run as completed
    # The CheckpointCallback before ours saved inside steps 5 and 10: checkpoint time, not those steps' time.
    assert ended.value("mindspore_train_time_seconds_total", bucket="checkpoint") >= 2 * SAVE_SECONDS
    durations = [Scrape(r["metrics"]).value("mindspore_train_step_duration_seconds_sum") for r in records]
    for step in range(SAVE_EVERY, STEPS + 1, SAVE_EVERY):
        assert durations[step - 1] - durations[step - 2] < SAVE_SECONDS, (step, durations)


def test_a_launcher_that_imports_ms_exporter_mindformers_lists_it_by_type(tmp_path: Path) -> None:
    done = _job(tmp_path, "type", str(RUN_YAML))
    assert "BUILT ms_exporter.monitor.mindformers_trainer PyNativeTrainingMonitor True by-type" in done.stdout, (
        done.stdout + done.stderr
    )
