"""The operator commands from a base install (`pip install ms-exporter`): a fresh venv without MindSpore.

The checkout is installed non-editable, so what runs is the package pip built with the dependency list in
pyproject.toml: a command that imported MindSpore, numpy or psutil would fail here.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import re
import shutil
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
import yaml

from ms_exporter import cli

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]
CAPTURE = REPO / "tests" / "unit" / "data" / "top_rank1_step8.prom"
TRAINING_SIDE = ("mindspore", "numpy", "psutil")
INSTALL_HINT = "pip install 'ms-exporter[mindspore]' (or pip install mindspore 'numpy<2' psutil)"
# Build from a copy of what the build reads (pyproject.toml's readme and package): an in-tree build leaves build/
# in the shared checkout, and setuptools packs whatever stale modules an earlier build left there. Only these:
# the checkout also holds virtual environments of gigabytes (.venv, .venv-mindformers).
PACKAGE_SOURCES = ("pyproject.toml", "README.md", "ms_exporter")
_NOT_SOURCE = shutil.ignore_patterns("__pycache__", "*.pyc")


@dataclass(frozen=True)
class OperatorVenv:
    root: Path
    work: Path  # the commands' working directory: not the checkout, whose ms_exporter would shadow the install
    env: dict[str, str]

    def python(self, code: str) -> subprocess.CompletedProcess[str]:
        return self._run([str(self.root / "bin" / "python"), "-c", code])

    def ms_exporter(self, *args: str) -> subprocess.CompletedProcess[str]:
        return self._run([str(self.root / "bin" / "ms-exporter"), *args])

    def _run(self, argv: list[str]) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            argv,
            cwd=self.work,
            env=self.env,
            capture_output=True,
            text=True,
            timeout=60,
            stdin=subprocess.DEVNULL,
            check=False,
        )


@pytest.fixture(scope="module")
def venv(tmp_path_factory: pytest.TempPathFactory) -> OperatorVenv:
    base = tmp_path_factory.mktemp("operator")
    source, root, work = base / "source", base / "venv", base / "work"
    source.mkdir()
    for name in PACKAGE_SOURCES:
        if (REPO / name).is_dir():
            shutil.copytree(REPO / name, source / name, ignore=_NOT_SOURCE)
        else:
            shutil.copy2(REPO / name, source / name)
    work.mkdir()
    unset = ("PYTHONPATH", "PYTHONHOME", "PYTHONSTARTUP", "VIRTUAL_ENV")
    env = {k: v for k, v in os.environ.items() if k not in unset and not k.startswith("MS_EXPORTER_")}
    env.update(PIP_NO_INPUT="1", PIP_DISABLE_PIP_VERSION_CHECK="1")
    # sys.executable is the test venv's interpreter; venv builds on its base Python, without its packages.
    subprocess.run([sys.executable, "-m", "venv", str(root)], check=True, env=env, timeout=120)
    install = subprocess.run(
        [
            str(root / "bin" / "python"),
            "-m",
            "pip",
            "install",
            "--quiet",
            "--no-compile",
            "--disable-pip-version-check",
            str(source),
        ],
        cwd=work,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        stdin=subprocess.DEVNULL,
        check=False,
    )
    assert install.returncode == 0, f"pip install of the checkout failed:\n{install.stdout}\n{install.stderr}"
    return OperatorVenv(root, work, env)


def checkout_output(*args: str) -> str:
    """What the same command prints when run in-process from the checkout (with MindSpore around)."""
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert cli.main(list(args)) == 0
    return out.getvalue()


def succeeded(done: subprocess.CompletedProcess[str]) -> str:
    assert done.returncode == 0, f"status {done.returncode}\nstdout:\n{done.stdout}\nstderr:\n{done.stderr}"
    return done.stdout


def test_the_base_install_is_the_built_package_without_the_training_side(venv: OperatorVenv) -> None:
    probe = succeeded(
        venv.python(
            "import importlib.metadata, importlib.util, json, ms_exporter\n"
            "print(json.dumps({'file': ms_exporter.__file__,\n"
            "                  'requires': importlib.metadata.requires('ms-exporter'),\n"
            f"                  'found': [n for n in {TRAINING_SIDE!r} if importlib.util.find_spec(n)]}}))"
        )
    )
    facts = json.loads(probe)
    assert Path(facts["file"]).is_relative_to(venv.root)  # the installed copy, not the checkout
    unconditional = sorted(r.split(";")[0].strip() for r in facts["requires"] if ";" not in r)
    assert unconditional == ["h11>=0.14", "prometheus-client>=0.20", "pyyaml"]
    # The dashboard generator's SDK starts at Python 3.11: installed there, left out below (the commands say so).
    by_python = {
        r.split(";")[0].strip(): r.split(";")[1].strip() for r in facts["requires"] if "extra ==" not in r and ";" in r
    }
    assert by_python.get("grafana-foundation-sdk==1769699998!10.1.0") == 'python_version >= "3.11"', by_python
    extra = sorted(r.split(";")[0].strip() for r in facts["requires"] if 'extra == "mindspore"' in r)
    assert extra == ["mindspore", "numpy<2", "psutil"]
    assert facts["found"] == []
    imported = venv.python("import mindspore")
    assert imported.returncode != 0 and "No module named 'mindspore'" in imported.stderr


def test_the_monitor_says_what_to_install(venv: OperatorVenv) -> None:
    done = venv.python("from ms_exporter import TrainingMonitor")
    assert done.returncode != 0
    assert done.stderr.strip().splitlines()[-1] == (
        "ms_exporter.MissingDependencyError: TrainingMonitor needs MindSpore, numpy and psutil, which are not "
        f"installed here: {INSTALL_HINT}"
    )
    cells = succeeded(
        venv.python(
            "import ms_exporter\n"
            "for name in ('GradNormTrainOneStepCell', 'LossScaleTrainOneStepCell'):\n"
            "    try:\n"
            "        getattr(ms_exporter, name)\n"
            "    except ImportError as exc:\n"
            "        print(type(exc).__name__, exc.name, exc)\n"
            "from ms_exporter import ConfigError, MonitorConfig, load_config\n"
            "print(type(load_config(None)) is MonitorConfig, issubclass(ConfigError, ValueError))"
        )
    )
    assert cells.splitlines() == [
        f"MissingDependencyError mindspore {name} needs MindSpore, numpy and psutil, which are not installed here: "
        f"{INSTALL_HINT}"
        for name in ("GradNormTrainOneStepCell", "LossScaleTrainOneStepCell")
    ] + ["True True"]


def test_demo_says_what_to_install(venv: OperatorVenv) -> None:
    done = venv.ms_exporter("demo", "--steps", "1")
    assert done.returncode == 1
    assert done.stderr == (
        f"ms-exporter demo needs MindSpore, numpy and psutil, which are not installed here: {INSTALL_HINT}\n"
    )


def test_rules(venv: OperatorVenv) -> None:
    text = succeeded(venv.ms_exporter("rules"))
    assert text == checkout_output("rules")
    groups = yaml.safe_load(text)["groups"]
    alerts = {rule["alert"]: rule for group in groups for rule in group["rules"] if "alert" in rule}
    assert {"MindSporeTrainingLossNonFinite", "MindSporeTrainingStalled", "MindSporeTrainingRankDown"} <= set(alerts)
    assert all(rule["labels"]["severity"] and rule["annotations"]["summary"] for rule in alerts.values())


def test_dashboard(venv: OperatorVenv) -> None:
    text = succeeded(venv.ms_exporter("dashboard"))
    assert text == checkout_output("dashboard")
    dashboard = json.loads(text)
    assert dashboard["uid"] and len(dashboard["panels"]) > 10


def test_kubernetes(venv: OperatorVenv, tmp_path: Path) -> None:
    succeeded(venv.ms_exporter("kubernetes", "-o", str(tmp_path / "venv")))
    checkout_output("kubernetes", "-o", str(tmp_path / "checkout"))
    kinds = {}
    for name in ("prometheusrule.yaml", "grafana-dashboard.yaml"):
        text = (tmp_path / "venv" / name).read_text()
        assert text == (tmp_path / "checkout" / name).read_text()
        kinds[name] = yaml.safe_load(text)["kind"]
    assert kinds == {"prometheusrule.yaml": "PrometheusRule", "grafana-dashboard.yaml": "ConfigMap"}


def test_check_config(venv: OperatorVenv, tmp_path: Path) -> None:
    example = str(REPO / "examples" / "monitor.yaml")
    text = succeeded(venv.ms_exporter("check-config", example))
    assert text == checkout_output("check-config", example)
    assert yaml.safe_load(text)["monitor_config"]["project"] == "example-transformer"
    broken = tmp_path / "broken.yaml"
    broken.write_text("monitor_config:\n  port: 99999\n")
    done = venv.ms_exporter("check-config", str(broken))
    assert done.returncode == 1 and "monitor_config.port" in done.stderr and "Traceback" not in done.stderr


@pytest.fixture
def captured_rank() -> Iterator[str]:
    """A local endpoint that serves a /metrics page captured from a real rank (rank 1 at step 8), its last step
    moved to now: `top` shows the values of a rank whose last step is long past as stale."""
    page = re.sub(
        rb"(mindspore_train_last_step_timestamp_seconds\{[^}]*\}) \S+", rb"\1 %.3f" % time.time(), CAPTURE.read_bytes()
    )

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # http.server's name
            status, body = (200, page) if self.path == "/metrics" else (404, b"not found\n")
            self.send_response(status)
            self.send_header("Content-Type", "text/plain; version=0.0.4; charset=utf-8")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=5)


def test_top(venv: OperatorVenv, captured_rank: str) -> None:
    text = succeeded(venv.ms_exporter("top", "--once", captured_rank))
    lines = text.splitlines()
    assert "1 up, 0 down" in lines[0]
    assert lines[1].split()[:4] == ["RANK", "STEP", "LOSS", "SMOOTHED"]
    rows = [line.split() for line in lines[2:] if line.strip()]
    assert len(rows) == 1
    assert rows[0][:4] == ["1", "8", "0.89653", "0.67819"]
    assert "capture" in rows[0] and f"http://{captured_rank}/metrics" in rows[0]


def test_checksums(venv: OperatorVenv, captured_rank: str) -> None:
    """Runs without numpy or MindSpore; a rank without replica checks (this one: one rank) says so."""
    text = succeeded(venv.ms_exporter("checksums", captured_rank))
    assert text.splitlines() == [f"no page: http://{captured_rank}/debug/checksums: HTTP 404 Not Found"]


def test_report(venv: OperatorVenv, tmp_path: Path) -> None:
    losses = [1.5, 1.2, 0.9, 1.0]
    records: list[dict[str, object]] = [
        {"type": "event", "project": "ops", "rank": 0, "event": "train_begin", "time": 1700000000.0}
    ]
    for step, loss in enumerate(losses, start=1):
        records.append(
            {
                "type": "step",
                "project": "ops",
                "rank": 0,
                "step": step,
                "epoch": 1,
                "loss": loss,
                "learning_rate": 0.01,
                "step_duration_seconds": 0.05,
                "samples_per_second": 320.0,
                "time": 1700000000.0 + step,
            }
        )
    records.append(
        {
            "type": "snapshot",
            "project": "ops",
            "rank": 0,
            "time": 1700000005.0,
            "metrics": {'memory_bytes{kind="host_rss"}': 5.0e8, 'threshold_breaches_total{metric="loss"}': 1},
        }
    )
    records.append({"type": "event", "project": "ops", "rank": 0, "event": "train_end", "time": 1700000006.0})
    run = tmp_path / "metrics-rank0.jsonl"
    run.write_text("".join(json.dumps(r) + "\n" for r in records))

    output = tmp_path / "venv.html"
    text = succeeded(venv.ms_exporter("report", str(run), "-o", str(output)))
    assert text.splitlines() == ["project ops rank 0: 4 steps, final loss 1.0, min loss 0.9", f"wrote {output}"]
    reference = tmp_path / "checkout.html"
    checkout_output("report", str(run), "-o", str(reference))
    page = output.read_text()
    assert page == reference.read_text()
    assert "ms_exporter report: project ops rank 0" in page and '"min_loss":0.9' in page
