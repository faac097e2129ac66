"""MindSpore Transformers for real: its own Trainer, configured from a run YAML whose `callbacks:` list
names TrainingMonitor, in the second virtual environment (mindformers 1.8.0, MindSpore 2.7.2;
tests/support/mindformers_venv.py).
The numbers the monitor serves are held against what MindSpore Transformers' MFLossMonitor prints at the same steps.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml

from tests.support import mindformers_venv, mindspore_users
from tests.support.mindspore_users import unit_modules_reaching_mindspore
from tests.support.scrape import Scrape

pytestmark = pytest.mark.integration

HERE = Path(__file__).resolve().parent
RUN_YAML = HERE / "data" / "mindformers_llama2_tiny.yaml"
STEPS = 24  # 48 samples, batch 2
# MFLossMonitor's line: step, loss (%f, then the epoch's mean), lr, overflow, loss scale and global norm as printed.
PRINTED = re.compile(
    r"step:\[\s*(?P<step>\d+)/\s*\d+\], loss:\[(?P<loss>[^/]+)/[^]]*\], per_step_time: \S+, "
    r"lr: (?P<lr>\S+), overflow cond: (?P<overflow>\w+), loss_scale: (?P<scale>[^,]+), "
    r"global_norm: \[(?P<norm>[^]]+)\]"
)


@pytest.fixture(scope="module")
def python() -> Path:
    try:
        return mindformers_venv.ensure()
    except mindformers_venv.Unavailable as exc:
        pytest.skip(f"the MindSpore Transformers environment cannot be built here: {exc}")


@dataclass
class Background:
    process: subprocess.Popen[bytes]
    output: Path


@pytest.fixture(scope="module")
def unit_suite(python: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Background]:
    """The unit test modules that reach MindSpore (tests/support/mindspore_users.py) under MindSpore 2.7.2 with Python
    3.11 (the long run's; `make test` runs the whole unit suite under 2.7.2 on Python 3.9: make test-py39)."""
    output = tmp_path_factory.mktemp("unit-suite") / "output.txt"
    modules = [str(path.relative_to(mindformers_venv.REPO)) for path in unit_modules_reaching_mindspore()]
    with output.open("wb") as sink:
        suite = subprocess.Popen(
            [str(python), "-m", "pytest", "-q", "-p", "no:cacheprovider", *modules],
            cwd=mindformers_venv.REPO,
            stdout=sink,
            stderr=subprocess.STDOUT,
        )
    yield Background(suite, output)
    if suite.poll() is None:
        suite.kill()
        suite.wait(30)


@pytest.fixture(scope="module")
def run(python: Path, tmp_path_factory: pytest.TempPathFactory) -> tuple[str, Path]:
    work = tmp_path_factory.mktemp("mindformers")
    done = subprocess.run(
        [str(python), str(HERE / "mindformers_job.py"), str(RUN_YAML), str(work)],
        cwd=work,
        capture_output=True,
        text=True,
        timeout=900,
    )
    output = done.stdout + done.stderr
    assert done.returncode == 0 and "MINDFORMERS_TRAIN_DONE 2.7.2" in output, output[-5000:]
    return output, work


def test_yaml_trainer_serves_metrics_that_agree_with_mflossmonitor(run: tuple[str, Path]) -> None:
    output, work = run
    printed = {int(m["step"]): m for m in PRINTED.finditer(output)}
    assert sorted(printed) == list(range(1, STEPS + 1)), output[-3000:]
    scrapes = {r["step"]: Scrape(r["metrics"]) for r in map(json.loads, (work / "scrapes.jsonl").open())}
    assert sorted(scrapes) == list(range(1, STEPS + 1))
    for step, line in printed.items():
        served = scrapes[step]
        assert served.value("mindspore_train_global_step") == step
        # %f: six decimals
        assert served.value("mindspore_train_loss") == pytest.approx(float(line["loss"]), abs=1e-6), step
        assert served.value("mindspore_train_learning_rate") == pytest.approx(float(line["lr"]), rel=1e-6), step
        assert served.value("mindspore_train_loss_scale") == float(line["scale"]), step
        assert served.value("mindspore_train_grad_norm") == pytest.approx(float(line["norm"]), rel=1e-6), step
        assert line["overflow"] == "False"
        assert served.value("mindspore_train_overflow_steps_total") == 0
    last = scrapes[STEPS]
    # The entry's own keys reached the monitor (project, the flops description).
    assert last.value("mindspore_train_info", project="llama2-tiny") == 1
    assert last.value("mindspore_train_flops_per_token") > 0
    # The run YAML's own monitor_config was read: its step_interval made the norm a per-step series (above), and
    # the user is told which of its keys were read and which were left to MindSpore Transformers.
    assert (
        "MindSpore Transformers keys read as ms_exporter's: step_interval -> grad_norm.every_n_steps, "
        "global_norm_spike_threshold -> grad_norm.threshold; left to MindSpore Transformers' "
        "TrainingStateMonitor: monitor_on, check_for_global_norm"
    ) in output
    rows = [json.loads(line) for line in (work / "monitor" / "metrics-rank0.jsonl").open()]
    losses = {row["step"]: row["loss"] for row in rows if "loss" in row}
    assert sorted(losses) == list(range(1, STEPS + 1))


def test_run_mindformer_registers_it_by_path(python: Path, tmp_path: Path) -> None:
    """run_mindformer.py's way: `--register_path` (the REGISTER_PATH variable) and `auto_register` in the entry."""
    script = """
import sys
from mindformers.tools.register import MindFormerModuleType, MindFormerRegister
entry = {"type": "TrainingMonitor", "auto_register": "ms_exporter_callback.TrainingMonitor", "enable": False}
monitor = MindFormerRegister.get_instance_from_cfg(entry, MindFormerModuleType.CALLBACK)
print("BUILT", type(monitor).__module__, type(monitor).__name__, "ms_exporter" in sys.modules)
"""
    done = _run_with_register_path(python, tmp_path, script)
    assert "BUILT ms_exporter.monitor.callback TrainingMonitor True" in done.stdout, done.stdout + done.stderr


@pytest.mark.parametrize("how", ["import", "register_path"])
def test_the_third_articles_class_name_is_in_mindformers_callback_registry(
    python: Path, tmp_path: Path, how: str
) -> None:
    """`type: MindSporeTransformersMonitor`, the monitor_config article's `callback.type`, builds the monitor both
    ways in."""
    entry = {"type": "MindSporeTransformersMonitor", "enable": False}
    if how == "import":
        setup = "import ms_exporter.mindformers\n"
    else:
        setup = ""
        entry["auto_register"] = "ms_exporter_callback.TrainingMonitor"
    script = f"""
import sys
{setup}from mindformers.tools.register import MindFormerModuleType, MindFormerRegister
monitor = MindFormerRegister.get_instance_from_cfg({entry!r}, MindFormerModuleType.CALLBACK)
print("BUILT", type(monitor).__module__, type(monitor).__name__)
"""
    done = _run_with_register_path(python, tmp_path, script)
    assert "BUILT ms_exporter.monitor.callback TrainingMonitor" in done.stdout, done.stdout + done.stderr


def test_the_third_articles_block_in_a_run_yamls_monitor_config_is_refused_by_mindformers(
    python: Path, tmp_path: Path
) -> None:
    """What MindSpore Transformers 1.8 does with the monitor_config article's block where that article puts it
    (docs/articles.md says so and where the block goes instead): it refuses the first key it does not know while
    loading the file, before any callback of ours exists; the same block named by the monitor's `callbacks:` entry is
    read."""
    run = yaml.safe_load(RUN_YAML.read_text())
    article = yaml.safe_load((HERE / "data" / "articles" / "third_article_monitor_config.yaml").read_text())
    refused = tmp_path / "refused.yaml"
    refused.write_text(yaml.safe_dump({**run, "monitor_config": article["monitor_config"]}))
    script = f"""
from mindformers import MindFormerConfig
try:
    MindFormerConfig({str(refused)!r})
except KeyError as exc:
    print("REFUSED", exc)
"""
    done = subprocess.run(
        [str(python), "-c", script], cwd=tmp_path, capture_output=True, text=True, timeout=300, env=_environment()
    )
    assert "REFUSED" in done.stdout and "gets an unexpected key: " in done.stdout, done.stdout + done.stderr
    (tmp_path / "monitor.yaml").write_text(yaml.safe_dump(article))
    script = """
import ms_exporter.mindformers
from mindformers.tools.register import MindFormerModuleType, MindFormerRegister
entry = {"type": "MindSporeTransformersMonitor", "config": "monitor.yaml", "port": 0}
monitor = MindFormerRegister.get_instance_from_cfg(entry, MindFormerModuleType.CALLBACK)
print("READ", monitor.config.backend, monitor.config.interval)
monitor.close()
"""
    done = subprocess.run(
        [str(python), "-c", script], cwd=tmp_path, capture_output=True, text=True, timeout=300, env=_environment()
    )
    assert "READ ('local', 'tensorboard') 30.0" in done.stdout, done.stdout + done.stderr


# Long (make test-long): the suite's short version is the two tests above, real MindSpore Transformers training and
# registration under MindSpore 2.7.2, and `make test`'s unit suite under MindSpore 2.7.2 on Python 3.9.
@pytest.mark.long
def test_unit_suite_passes_on_mindspore_2_7(unit_suite: Background) -> None:
    """The supported range's other end: every unit test module that reaches MindSpore, under MindSpore 2.7.2."""
    # The rule keeps every module that imports MindSpore itself (and those that reach it through this repository's).
    chosen = set(unit_modules_reaching_mindspore())
    direct = {
        p
        for p in mindspore_users.UNIT.glob("test_*.py")
        if re.search(r"^\s*(from|import) mindspore\b", p.read_text(), re.M)
    }
    assert direct and direct <= chosen, sorted(p.name for p in direct - chosen)
    returncode = unit_suite.process.wait(900)
    output = unit_suite.output.read_text(errors="replace")
    assert returncode == 0 and " passed" in output, output[-5000:]


def _environment() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if not k.startswith("MS_EXPORTER_")}


def _run_with_register_path(python: Path, cwd: Path, script: str) -> subprocess.CompletedProcess[str]:
    """`script` in the MindSpore Transformers venv, with REGISTER_PATH set to what `python -m ms_exporter.mindformers`
    prints (the folder run_mindformer.py's --register_path takes)."""
    register_path = subprocess.run(
        [str(python), "-m", "ms_exporter.mindformers"], capture_output=True, text=True, check=True
    ).stdout.strip()
    return subprocess.run(
        [str(python), "-c", script],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=300,
        env={**_environment(), "REGISTER_PATH": register_path},
    )
