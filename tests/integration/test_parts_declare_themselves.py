"""Adding a probe or a sink is writing its module: its PART beside its builder, a family only it reads beside its
class with its docs row, and a config section of its own. `make generate` collects them, and from then on the
configuration accepts the parts and the section, the monitor builds and serves them, the parts table of
docs/configuration.md lists them, its key table has the section's keys, and docs/metrics.md's table has the family's
row. Tried on a copy of the package, so the checkout is left as it is."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest

from ms_exporter.config import ConfigError, load_config
from ms_exporter.core import builtin_parts, catalogue
from ms_exporter.core.catalogue import MetricFamily, Row
from ms_exporter.generate.parts import declared, render_docs, render_module

pytestmark = pytest.mark.integration
ROOT = Path(__file__).resolve().parents[2]

PROBE = '''
"""The last step number: a throwaway probe, written as a new probe is."""

from __future__ import annotations

from ms_exporter.core.catalogue import MetricFamily, Row
from ms_exporter.core.part import PartContext
from ms_exporter.core.probe import Probe
from ms_exporter.core.registry import ProbeEntry
from ms_exporter.core.sample import StepSample

THROWAWAY_STEP = MetricFamily(
    "mindspore_train_throwaway_step",
    "gauge",
    "The last step, from a throwaway probe.",
    "steps",
    row=Row("training", updated="every publication: the last step", group="throwaway"),
)


class ThrowawayProbe(Probe):
    """| mindspore_train_throwaway_step | gauge | | steps |"""

    name = "throwaway"

    def __init__(self, context: PartContext) -> None:
        self._series = context.store.register(THROWAWAY_STEP).series()

    def on_step(self, sample: StepSample) -> None:
        self._series.value = float(sample.step)


def build(context: PartContext) -> list[Probe]:
    return [ThrowawayProbe(context)]


PART = ProbeEntry("throwaway", build, ("throwaway",), order=1000)
'''

SINK = '''
"""Each published step's number in a list, under a label its own config section sets: a throwaway sink, written
as a new sink is."""

from __future__ import annotations

from dataclasses import dataclass

from ms_exporter.config.checks import int_in, setting, text
from ms_exporter.core.part import PartContext
from ms_exporter.core.registry import BackendEntry
from ms_exporter.core.sample import StepSample
from ms_exporter.core.sink import Sink


@dataclass(frozen=True)
class ThrowawaySinkSettings:
    """monitor_config.throwaway_sink: what the throwaway sink writes."""

    label: str = setting("steps", check=text(), doc="the name the steps are kept under", allowed="text")
    every: int = setting(1, check=int_in(1, 100), doc="keep every this many steps", allowed="integer 1-100")


class ThrowawaySink(Sink):
    name = "throwaway_sink"
    kept: dict[str, list[int]] = {}

    def __init__(self, settings: ThrowawaySinkSettings) -> None:
        self._settings = settings

    def on_step(self, sample: StepSample) -> None:
        if sample.step % self._settings.every == 0:
            ThrowawaySink.kept.setdefault(self._settings.label, []).append(sample.step)


def build(context: PartContext) -> list[Sink]:
    return [ThrowawaySink(context.config.section("throwaway_sink"))]


PART = BackendEntry("throwaway_sink", build, order=1000, section=ThrowawaySinkSettings)
'''

DRIVER = """
import json, urllib.request
from ms_exporter import TrainingMonitor
from ms_exporter.sinks.throwaway_sink import ThrowawaySink
from tests.support.cb_params import context

monitor = TrainingMonitor(
    port=0, web={"cache_seconds": 0}, backend=["prometheus", "throwaway_sink"], throwaway_sink={"label": "mine"}
)
try:
    monitor.on_train_begin(context(0, 0.0))
    for step in (1, 2, 3):
        monitor.on_train_step_end(context(step, 1.0))
    monitor.publish()
    page = urllib.request.urlopen(monitor.url, timeout=30).read().decode()
finally:
    monitor.close()
print(json.dumps({"page": page, "sink": ThrowawaySink.kept, "parts": [part.name for part in monitor.parts]}))
"""

# The sink's section as a user meets it: its defaults, a file, the environment over the file, its errors.
CHECKS = """
import json, os
from ms_exporter.config import ConfigError, load_config

def error(source):
    try:
        load_config(source)
    except ConfigError as exc:
        return exc.problems
    return None

found = {
    "defaults": load_config({}).section("throwaway_sink").label,
    "given": load_config({"throwaway_sink": {"every": 5}}).section("throwaway_sink").every,
    "printed": load_config({"throwaway_sink": {"every": 5}}).to_dict()["throwaway_sink"],
    "unknown": error({"throwaway_sink": {"evry": 5}}),
    "bad": error({"throwaway_sink": {"every": 0}}),
}
os.environ["MS_EXPORTER_THROWAWAY_SINK"] = "{label: from_env}"
found["environment"] = load_config({"throwaway_sink": {"every": 5}}).to_dict()["throwaway_sink"]
print(json.dumps(found))
"""
CHECKED = {
    "defaults": "steps",
    "given": 5,
    "printed": {"label": "steps", "every": 5},
    "unknown": [
        "monitor_config.throwaway_sink.evry: unknown key (monitor_config); did you mean 'every'? allowed keys: "
        "label, every"
    ],
    "bad": ["monitor_config.throwaway_sink.every: must be an integer from 1 to 100, got 0 (from monitor_config)"],
    "environment": {"label": "from_env", "every": 5},
}


def test_a_probe_and_a_sink_written_as_one_module_each_are_configured_served_and_documented(tmp_path: Path) -> None:
    copy = tmp_path / "checkout"
    shutil.copytree(ROOT / "ms_exporter", copy / "ms_exporter", ignore=shutil.ignore_patterns("__pycache__"))
    (copy / "docs").mkdir()
    for page in ("configuration.md", "metrics.md"):
        shutil.copy(ROOT / "docs" / page, copy / "docs" / page)
    (copy / "ms_exporter" / "probes" / "throwaway.py").write_text(textwrap.dedent(PROBE).lstrip())
    (copy / "ms_exporter" / "sinks" / "throwaway_sink.py").write_text(textwrap.dedent(SINK).lstrip())
    env = {**os.environ, "PYTHONPATH": f"{copy}{os.pathsep}{ROOT}", "GLOG_v": "3"}

    # Before `make generate`, the configuration does not know the new parts.
    with pytest.raises(ConfigError, match="throwaway_sink"):
        load_config({"backend": ["throwaway_sink"]})
    generate = [sys.executable, "-m", "ms_exporter.generate.parts", "-o", "ms_exporter/core/builtin_parts.py"]
    subprocess.run([*generate, "--docs", "docs/configuration.md"], cwd=copy, env=env, check=True, timeout=300)
    for tables, page in (("metrics_tables", "docs/metrics.md"), ("settings_tables", "docs/configuration.md")):
        command = [sys.executable, "-m", f"ms_exporter.generate.{tables}", "--docs", page]
        subprocess.run(command, cwd=copy, env=env, check=True, timeout=300)

    checked = subprocess.run(
        [sys.executable, "-c", CHECKS], cwd=copy, env=env, capture_output=True, text=True, timeout=300, check=False
    )
    assert checked.returncode == 0, checked.stderr[-3000:]
    assert json.loads(checked.stdout.strip().splitlines()[-1]) == CHECKED
    ran = subprocess.run(
        [sys.executable, "-c", DRIVER], cwd=copy, env=env, capture_output=True, text=True, timeout=300, check=False
    )
    assert ran.returncode == 0, ran.stderr[-3000:]
    seen = json.loads(ran.stdout.strip().splitlines()[-1])
    assert "# TYPE mindspore_train_throwaway_step gauge" in seen["page"]
    assert "mindspore_train_throwaway_step{" in seen["page"] and "} 3.0" in seen["page"].split("throwaway_step{")[1]
    assert seen["sink"] == {"mine": [1, 2, 3]}
    assert {"throwaway", "throwaway_sink"} <= set(seen["parts"])
    table = (copy / "docs" / "configuration.md").read_text()
    assert "| probe | `throwaway` | `throwaway` | `ms_exporter/probes/throwaway.py` |" in table
    assert "| backend | `throwaway_sink` | a `backend:` value | `ms_exporter/sinks/throwaway_sink.py` |" in table
    assert "| `throwaway_sink.every` | `1` | integer 1-100 | keep every this many steps |" in table
    assert "| `throwaway_sink.label` | `steps` | text | the name the steps are kept under |" in table
    metrics = (copy / "docs" / "metrics.md").read_text()
    training = metrics.split("<!-- metrics: training")[1].split("<!-- metrics:end -->")[0]
    row = "| `mindspore_train_throwaway_step` | gauge | | steps | throwaway | every publication: the last step | same |"
    assert row in training
    assert (copy / "docs" / "metrics.md").read_text().count("mindspore_train_throwaway_step") == 1


def test_the_committed_parts_index_and_table_are_what_make_generate_writes() -> None:
    parts = declared()
    module = (ROOT / "ms_exporter" / "core" / "builtin_parts.py").read_text(encoding="utf-8")
    assert module == render_module(parts), "run `make generate` and commit ms_exporter/core/builtin_parts.py"
    assert render_docs(parts) in (ROOT / "docs" / "configuration.md").read_text(encoding="utf-8")
    assert [name for name, *_ in builtin_parts.PROBES][:3] == ["identity", "progress", "hang_deadline"]


def test_a_family_declared_beside_its_part_is_copied_into_the_index_as_plain_values_and_read_back_equal() -> None:
    family = MetricFamily(
        "mindspore_train_example_ratio", "gauge", "An example’s ratio.", "1", ("kind",), row=Row("training", "always")
    )
    parts = {**declared(), "families": [("ms_exporter.probes.example", family)]}
    namespace: dict[str, Any] = {}
    exec(render_module(parts), namespace)  # the module `make generate` would write
    (values,) = namespace["FAMILIES"]
    name, kind, help_text, unit, labels, buckets, row = values
    assert MetricFamily(name, kind, help_text, unit, labels, buckets, Row(*row)) == family
    # The catalogue lists what the committed index holds beside its own, each once.
    assert catalogue.FAMILIES == catalogue.CATALOGUE_FAMILIES + catalogue.PART_FAMILIES
    assert len(catalogue.PART_FAMILIES) == len(builtin_parts.FAMILIES)
