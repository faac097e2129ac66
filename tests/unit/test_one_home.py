"""One home per formula and threshold: each is written once, its users read it there, and the docs are held to it."""

from __future__ import annotations

import ast
import dataclasses
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from ms_exporter.config import HangConfig, MonitorConfig, load_config
from ms_exporter.config.alert_thresholds import thresholds_of
from ms_exporter.core import catalogue
from ms_exporter.core.analysis.learned_deadline import MIN_CYCLES, nearest_rank
from ms_exporter.core.compat import zip_strict
from ms_exporter.core.phases import PhaseClock
from ms_exporter.core.sample import StepSample
from ms_exporter.core.store import MetricStore
from ms_exporter.core.thresholds import DEFAULTS, EXPLODING_FACTOR, LOSS_SPIKE_FACTOR, Thresholds
from ms_exporter.generate.rules import render_rules
from ms_exporter.generate.settings_tables import Key as SettingKey
from ms_exporter.generate.settings_tables import keys as settings_keys
from ms_exporter.generate.settings_tables import plain_value, render_page, render_rows
from ms_exporter.probes.hang_deadline import HangDeadlineProbe
from ms_exporter.tools import report

ROOT = Path(__file__).resolve().parents[2]


# -- "exploding = high x 10", once -------------------------------------------------------------------------------


def _alert_exprs(thresholds: Thresholds) -> dict[str, str]:
    return {
        rule["alert"]: rule["expr"]
        for group in render_rules(thresholds)["groups"]
        for rule in group["rules"]
        if "alert" in rule
    }


def test_the_exploding_gradient_norm_follows_the_high_one_unless_given() -> None:
    assert Thresholds(grad_norm_high=2.5).grad_norm_exploding == 25
    assert Thresholds(grad_norm_high=2.5, grad_norm_exploding=7.0).grad_norm_exploding == 7.0
    assert DEFAULTS.grad_norm_exploding == DEFAULTS.grad_norm_high * EXPLODING_FACTOR == 100
    assert thresholds_of(load_config({"grad_norm": {"threshold": 4}})).grad_norm_exploding == 40
    assert _alert_exprs(Thresholds(grad_norm_high=2.5))["MindSporeTrainingGradNormExploding"].endswith("> 25")


# -- config defaults read from the thresholds, and no circle between the two -------------------------------------


def _python(code: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120, check=False
    )


def test_the_config_reads_its_alert_and_spike_defaults_from_the_thresholds() -> None:
    config = load_config({})
    assert config.goodput.alert_below == DEFAULTS.goodput_low
    assert config.actions.snapshot.spike_factor == config.actions.rollback.spike_factor == LOSS_SPIKE_FACTOR
    # Read, not copied: thresholds moved before the config is imported (the package imports it) move its defaults.
    moved = _python(
        "import dataclasses, importlib.util, sys\n"
        "spec = importlib.util.spec_from_file_location('ms_exporter.core.thresholds',"
        " 'ms_exporter/core/thresholds.py')\n"
        "t = sys.modules[spec.name] = importlib.util.module_from_spec(spec)\n"
        "spec.loader.exec_module(t)\n"
        "t.DEFAULTS = dataclasses.replace(t.DEFAULTS, goodput_low=0.7, grad_norm_high=3.0)\n"
        "t.LOSS_SPIKE_FACTOR = 4.5\n"
        "from ms_exporter.config import load_config\n"
        "c = load_config({})\n"
        "print(c.goodput.alert_below, c.grad_norm.threshold, c.actions.snapshot.spike_factor,"
        " c.actions.rollback.spike_factor)\n"
    )
    assert moved.returncode == 0, moved.stderr
    assert moved.stdout.split() == ["0.7", "3.0", "4.5", "4.5"]


def _package_imports(path: Path) -> set[str]:
    """Every ms_exporter module a file imports, TYPE_CHECKING blocks and function bodies included."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("ms_exporter"):
            found.add(node.module)
        elif isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names if alias.name.startswith("ms_exporter"))
    return found


def test_the_thresholds_import_nothing_of_the_package_so_config_and_thresholds_make_no_circle() -> None:
    assert _package_imports(ROOT / "ms_exporter" / "core" / "thresholds.py") == set()
    # the report imports it too
    assert _package_imports(ROOT / "ms_exporter" / "core" / "analysis" / "learned_deadline.py") == set()
    assert "ms_exporter.core.thresholds" in _package_imports(ROOT / "ms_exporter" / "config" / "sections.py")


@pytest.mark.parametrize(
    "order",
    [
        ("config", "core.thresholds", "config.alert_thresholds"),
        ("core.thresholds", "config", "config.alert_thresholds"),
        ("config.alert_thresholds", "core.thresholds", "config"),
        ("core.analysis.learned_deadline", "tools.report", "config"),
    ],
)
def test_each_module_imports_first_in_a_fresh_interpreter(order: tuple[str, ...]) -> None:
    imported = _python(
        "".join(f"import ms_exporter.{name}\n" for name in order)
        + "from ms_exporter.config.alert_thresholds import thresholds_of\n"
        "from ms_exporter.config import load_config\n"
        "from ms_exporter.core.thresholds import DEFAULTS\n"
        "assert thresholds_of(load_config({})) == DEFAULTS\n"
    )
    assert imported.returncode == 0, imported.stderr


# -- one hang deadline for the probe and the report --------------------------------------------------------------

# (step duration, data wait, cycle to the next record): the first step compiles (42 s stands in for the cycles
# until MIN_CYCLES are in); a 100 s cycle among the first ones is no stall under that stand-in; later a long one
# raises the learned figure at once, and a 50 s one is a stall.
_FIRST = (40.0, 2.0)
_CYCLES = [
    0.2,
    100.0,
    0.3,
    0.25,
    0.2,
    *[0.2 + 0.01 * (i % 7) for i in range(20)],
    5.0,
    0.2,
    0.3,
    50.0,
    *[0.25] * 30,
    0.1,
    0.2,
]


def _run_of(cycles: list[float]) -> report.Run:
    run = report.Run(label="", files=[])
    t = 1000.0
    for index in range(len(cycles) + 1):
        duration, wait = _FIRST if index == 0 else (0.15, 0.01)
        run.steps["step"].append(index + 1)
        run.steps["time"].append(t)
        run.steps[catalogue.STEP_DURATION.short].append(duration)
        run.steps[catalogue.DATA_WAIT.short].append(wait)
        if index < len(cycles):
            t += cycles[index]
    return run


def _probe_deadlines(run: report.Run, hang: HangConfig) -> list[float]:
    """The probe fed the run's records as step samples: its learned deadline while each gap lasted."""
    store = MetricStore()
    probe = HangDeadlineProbe(store, hang, PhaseClock(store))
    probe.on_train_begin({})
    deadlines = []
    for index, step in enumerate(run.steps["step"]):
        if index:
            deadlines.append(probe.learned())
        t = run.steps["time"][index]
        probe.on_step(
            StepSample(
                step,
                1,
                1,
                1.0,
                run.steps[catalogue.STEP_DURATION.short][index],
                run.steps[catalogue.DATA_WAIT.short][index],
                8,
                0,
                t,
                t,
            )
        )
    return deadlines


def test_the_report_and_the_probe_learn_the_same_hang_deadline_from_the_same_cycles() -> None:
    hang = dataclasses.replace(HangConfig(), min_seconds=1.0, factor=3.0, percentile=90, window=20)
    run = _run_of(_CYCLES)
    gaps = report.gaps(run, hang)
    assert [deadline for _, _, _, deadline in gaps] == _probe_deadlines(run, hang)
    assert [deadline for _, _, _, deadline in gaps][:MIN_CYCLES] == [3 * 42.0] * MIN_CYCLES  # the first step
    stalled = [stall["seconds"] for stall in report.stalls(run, hang)]
    assert stalled == [5.0, 50.0]  # not the 100 s cycle, which the first step's stand-in covers


def test_one_percentile_definition_nearest_rank() -> None:
    values = [float(v) for v in range(1, 11)]
    assert [nearest_rank(values, p) for p in (10, 50, 90, 99, 100)] == [1.0, 5.0, 9.0, 10.0, 10.0]
    assert nearest_rank([4.0], 1) == 4.0
    with pytest.raises(ValueError, match="no values"):
        nearest_rank([], 50)


# -- docs/configuration.md's key table, held to the schema -------------------------------------------------------

_ROW = re.compile(r"^\| (`[^|]+) \| ([^|]*) \|")
# Defaults the table says in words because the schema's default is a list of every choice, not a literal.
_IN_WORDS = {"metrics": ("all groups", catalogue.METRIC_GROUPS if hasattr(catalogue, "METRIC_GROUPS") else None)}


def _schema_defaults(kind: type, prefix: str = "") -> dict[str, Any]:
    """Every leaf key of the schema, dotted, with its default."""
    found: dict[str, Any] = {}
    for f in dataclasses.fields(kind):
        check = f.metadata["check"]
        if dataclasses.is_dataclass(check) and isinstance(check, type):
            found.update(_schema_defaults(check, f"{prefix}{f.name}."))
        else:
            found[prefix + f.name] = f.default if f.default is not dataclasses.MISSING else f.default_factory()
    return found


def _documented() -> dict[str, str]:
    """Each key of the table with its default cell ("`a`, unset" spread over the keys of a row that names several;
    a key without a dot in such a row shares the first key's section)."""
    found: dict[str, str] = {}
    for line in (ROOT / "docs" / "configuration.md").read_text(encoding="utf-8").splitlines():
        match = _ROW.match(line)
        if not match or match.group(1) == "key":
            continue
        keys = re.findall(r"`([^`]+)`", match.group(1))
        section = keys[0].rpartition(".")[0]
        keys = [key if "." in key or not section else f"{section}.{key}" for key in keys]
        default = match.group(2).strip()
        parts = [part.strip() for part in default.split(", ")]
        for key, cell in zip_strict(
            keys, parts if len(keys) > 1 and len(parts) == len(keys) else [default] * len(keys)
        ):
            assert key not in found, f"docs/configuration.md documents {key} twice"
            found[key] = cell
    return found


def test_every_config_key_is_in_the_docs_table_with_the_schema_default() -> None:
    schema = _schema_defaults(MonitorConfig)
    documented = _documented()
    assert sorted(set(schema) - set(documented)) == [], "keys missing from docs/configuration.md's tables"
    assert sorted(set(documented) - set(schema)) == [], "docs/configuration.md documents keys that do not exist"
    wrong = {}
    for key, cell in documented.items():
        default = schema[key]
        literal = re.fullmatch(r"`([^`]*)`", cell)
        if key in _IN_WORDS:
            words, value = _IN_WORDS[key]
            ok = cell == words and (value is None or plain_value(default) == plain_value(value))
        elif literal:  # a YAML value: it must be the schema's default
            ok = plain_value(default) == yaml.safe_load(literal.group(1))
        else:  # words (unset, derived, from the parallel context ...): the schema leaves it unset
            ok = default is None
        if not ok:
            wrong[key] = (cell, default)
    assert wrong == {}, "docs/configuration.md: (documented default, schema default)"


def test_the_committed_key_tables_are_what_make_generate_writes_from_the_declarations() -> None:
    page = (ROOT / "docs" / "configuration.md").read_text(encoding="utf-8")
    assert render_page(page) == page, "run `make generate` and commit docs/configuration.md"
    every = settings_keys()
    described = [key for key in every if key.doc]
    assert len(described) > 0.9 * len(every)  # a key without doc shares the row of the one before it


def test_a_key_in_no_table_or_in_two_is_an_error_naming_it() -> None:
    every = settings_keys()
    with pytest.raises(ValueError, match="in none .*'log_level'"):
        render_page("<!-- settings: enable -->\n<!-- settings:end -->\n", [k for k in every if "." not in k.name])
    twice = "<!-- settings: grad_norm -->\n<!-- settings:end -->\n" * 2
    with pytest.raises(ValueError, match="in two tables .*'grad_norm.enable'"):
        render_page(twice, [k for k in every if k.name.startswith("grad_norm.")])
    with pytest.raises(ValueError, match="'nope', which is no key or section"):
        render_page("<!-- settings: nope -->\n<!-- settings:end -->\n", every)


def test_a_key_without_doc_or_allowed_joins_the_row_before_it_and_a_default_in_words_is_shown() -> None:
    rows = render_rows(
        [
            SettingKey("flops.model.num_layers", None, "the model's shape", "integers ≥ 1", None),
            SettingKey("flops.model.hidden_size", None, "", "", None),
            SettingKey("flops.model.num_experts", 0, "experts", "integer ≥ 0", None),
            SettingKey("web.tags", {"a": 1}, "a | b", "mapping", "the run's"),
        ]
    )
    assert rows == [
        "| `flops.model.num_layers`, `hidden_size` | unset | integers ≥ 1 | the model's shape |",
        "| `flops.model.num_experts` | `0` | integer ≥ 0 | experts |",
        "| `web.tags` | the run's | mapping | a \\| b |",
    ]


def test_the_reserved_tag_names_are_the_catalogues_labels() -> None:
    from ms_exporter.config import RESERVED_LABELS, ConfigError, load_config
    from ms_exporter.core.catalogue import CONSTANT_LABELS, FAMILIES

    for family in FAMILIES:
        assert set(family.labels) <= RESERVED_LABELS, family.name
    assert set(CONSTANT_LABELS) | {"le", "job", "instance"} <= RESERVED_LABELS
    with pytest.raises(ConfigError, match="tag name 'phase' is set by the exporter itself"):
        load_config({"tags": {"phase": "pretrain"}})
    assert load_config({"tags": {"dataset": "v3"}}).tags == {"dataset": "v3"}


def test_the_backend_and_metrics_names_are_the_registries() -> None:
    from ms_exporter.config import BACKENDS, METRIC_GROUPS, load_config
    from ms_exporter.core import registry

    assert tuple(name for name, entry in registry.BACKENDS.items() if entry.selectable) == BACKENDS
    assert set(METRIC_GROUPS) == {group for entry in registry.PROBES.values() for group in entry.groups}
    assert load_config({}).metrics == registry.metric_groups()


def test_the_groups_that_watched_metrics_need_are_probe_groups() -> None:
    # warn_on_value's families are written by probes: the group a watch needs is a group the registry switches.
    from ms_exporter.core import catalogue, registry

    for key in catalogue.WARN_ON_VALUE_KEYS:
        assert catalogue.WATCHABLE[key].group in registry.metric_groups(), key
