"""The metric catalogue is the one place a name is written, and docs/metrics.md is held to it."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

from ms_exporter.core import catalogue, registry
from ms_exporter.core.catalogue import FAMILIES, MetricFamily, Row
from ms_exporter.generate.metrics_tables import histogram_series_rows, render_page, render_rows
from tests.support.pythons import DASHBOARD_SDK, needs

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "ms_exporter"
NAME = re.compile(r"mindspore_(?:train|exporter)_[a-z_]+")
# docs/metrics.md rows: | `name` | type | labels | ...
ROW = re.compile(r"^\| `(mindspore_(?:train|exporter)_[a-z_]+)` \|([^|]*)\|([^|]*)\|")


_DOC_KEYWORDS = {"doc", "allowed", "shown"}  # a setting's docs (config/checks.py), written into docs/configuration.md


def _code_strings(path: Path) -> list[tuple[int, str]]:
    """String constants in code, docstrings, a setting's docs and a family's declaration left out (they document
    what a class emits or a key means, or declare a family beside its part)."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    docstrings = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and node.body:
            first = node.body[0]
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant):
                docstrings.add(id(first.value))
        called = node.func.id if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) else None
        for keyword in node.keywords if called == "setting" else ():  # type: ignore[attr-defined]
            if keyword.arg in _DOC_KEYWORDS:
                docstrings.update(id(part) for part in ast.walk(keyword.value))
        if called == "MetricFamily":  # a family declared beside the one part that reads it: its name's one home
            docstrings.update(id(part) for part in ast.walk(node))  # type: ignore[arg-type]
    return [
        (node.lineno, node.value)
        for node in ast.walk(tree)
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docstrings
    ]


def test_no_module_but_the_catalogue_writes_a_metric_name() -> None:
    found = []
    # The catalogue, and the list `make generate` writes from the rules (which read the catalogue's names).
    generated = {PACKAGE / "core" / "catalogue.py", PACKAGE / "sinks" / "shared" / "rule_series.py"}
    for path in sorted(PACKAGE.rglob("*.py")):
        if path in generated:
            continue
        for line, text in _code_strings(path):
            found += [f"{path.relative_to(ROOT)}:{line}: {name}" for name in NAME.findall(text)]
    assert found == [], "metric names belong in ms_exporter/core/catalogue.py:\n" + "\n".join(found)


def test_names_follow_prometheus_conventions() -> None:
    assert len({f.name for f in FAMILIES}) == len(FAMILIES)
    for family in FAMILIES:
        assert family.name.startswith((catalogue.TRAIN_PREFIX, catalogue.EXPORTER_PREFIX)), family.name
        assert family.name.endswith("_total") == (family.type == "counter"), family.name
        assert (family.unit == "seconds") <= ("seconds" in family.name), family.name
        assert (family.type == "histogram") == bool(family.buckets), family.name
        assert list(family.buckets) == sorted(family.buckets), family.name
        assert family.help.strip() and not set(family.labels) & set(catalogue.CONSTANT_LABELS), family.name


def _documented() -> dict[str, tuple[str, str]]:
    rows = {}
    for line in (ROOT / "docs" / "metrics.md").read_text(encoding="utf-8").splitlines():
        match = ROW.match(line)
        if match:
            rows[match.group(1)] = (match.group(2).strip(), match.group(3).strip())
    return rows


def _histogram_series(family: MetricFamily) -> set[str]:
    return {family.bucket, family.sum, family.count} if family.type == "histogram" else set()


def test_every_family_has_a_row_in_the_metrics_doc_with_its_type_and_labels() -> None:
    documented = _documented()
    missing = [f.name for f in FAMILIES if f.name not in documented]
    assert missing == [], f"families without a row in docs/metrics.md: {missing}"
    for family in FAMILIES:
        type_text, labels_text = documented[family.name]
        assert type_text.split()[0] == family.type, (family.name, type_text)
        labels = set(re.findall(r"`([A-Za-z_]+)`", labels_text)) & set(family.labels + ("le",))
        assert labels == set(family.labels), (family.name, labels_text)


def test_every_row_of_the_metrics_doc_names_a_family() -> None:
    known = {f.name for f in FAMILIES}.union(*(_histogram_series(f) for f in FAMILIES))
    unknown = sorted(set(_documented()) - known)
    assert unknown == [], f"docs/metrics.md documents series the catalogue does not have: {unknown}"


def test_closed_label_values_are_documented() -> None:
    text = (ROOT / "docs" / "metrics.md").read_text(encoding="utf-8")
    for value in (*catalogue.MEMORY_KINDS, *catalogue.HOOKS, *catalogue.ACTIONS, *registry.BACKENDS):
        assert f"`{value}`" in text, value


def test_watchable_keys_name_their_families() -> None:
    for key, watch in catalogue.WATCHABLE.items():
        assert watch.family in FAMILIES
        assert watch.family.short.startswith(key) or key == "memory_growth_ratio", key


@needs(DASHBOARD_SDK)  # the histogram-series table reads the rendered dashboard
def test_the_committed_family_tables_are_what_make_generate_writes_from_the_catalogue() -> None:
    page = (ROOT / "docs" / "metrics.md").read_text(encoding="utf-8")
    assert render_page(page) == page, "run `make generate` and commit docs/metrics.md"


def test_a_family_without_a_row_in_no_table_or_in_an_unknown_column_is_an_error_naming_it() -> None:
    bare = MetricFamily("mindspore_train_bare", "gauge", "A family without docs.", "1")
    with pytest.raises(ValueError, match="mindspore_train_bare has no row"):
        render_page("<!-- metrics: training -->\n<!-- metrics:end -->\n", (catalogue.INFO, bare))
    lonely = MetricFamily(
        "mindspore_train_lonely", "gauge", "A family whose table is not on the page.", "1", row=Row("x", "y")
    )
    with pytest.raises(ValueError, match=r"in none \['mindspore_train_lonely'\]"):
        render_page("<!-- metrics: training -->\n<!-- metrics:end -->\n", (catalogue.INFO, lonely))
    with pytest.raises(ValueError, match="names columns \\['colour'\\]"):
        render_page("<!-- metrics: training; columns: colour -->\n<!-- metrics:end -->\n", (catalogue.INFO,))


def test_a_row_shows_what_the_declaration_says_unless_its_words_say_more() -> None:
    family = MetricFamily(
        "mindspore_train_example_seconds", "gauge", "An example.", "seconds", ("kind",), row=Row("t", "step | end")
    )
    assert render_rows([family], ("group", "sink mode")) == [
        "| name | type | extra labels | unit | group | updated | sink mode |",
        "|---|---|---|---|---|---|---|",
        "| `mindspore_train_example_seconds` | gauge | `kind` | seconds | | step \\| end | same |",
    ]
    worded = MetricFamily("mindspore_train_x", "gauge", "X.", "1", row=Row("t", "always", type="gauge (=1)", unit="-"))
    assert render_rows([worded])[2] == "| `mindspore_train_x` | gauge (=1) | | - | always |"


@needs(DASHBOARD_SDK)  # the histogram-series table reads the rendered dashboard
def test_a_histogram_s_series_rows_say_what_they_count_and_which_rules_and_panels_read_them() -> None:
    rows = histogram_series_rows((catalogue.STEP_DURATION, catalogue.HOOK_DURATION))
    assert rows[2:] == [
        "| `mindspore_train_step_duration_seconds_bucket` | counter (`le`) | steps that took at most `le` seconds | "
        'the dashboard\'s "Step time p50 / p95" |',
        "| `mindspore_train_step_duration_seconds_sum` | counter | seconds spent in steps | "
        "`rank:mindspore_train_step_duration_seconds:mean` |",
        "| `mindspore_train_step_duration_seconds_count` | counter | steps timed (equals the steps counted in "
        "`mindspore_train_steps_total` while `step_time` is on) | `rank:mindspore_train_step_duration_seconds:mean`; "
        "`rank:mindspore_train_data_wait_seconds:mean` |",
        "| `mindspore_exporter_callback_duration_seconds_bucket` | counter (`hook`, `le`) | hook calls that took at "
        'most `le` seconds | the dashboard\'s "Monitor cost p99 per hook" |',
        "| `mindspore_exporter_callback_duration_seconds_sum` | counter (`hook`) | seconds the monitor spent in the "
        "hook | - |",
        "| `mindspore_exporter_callback_duration_seconds_count` | counter (`hook`) | hook calls | - |",
    ]
    unsaid = MetricFamily("mindspore_train_unsaid", "histogram", "U.", "1", buckets=(1.0,), row=Row("t", "always"))
    with pytest.raises(ValueError, match="mindspore_train_unsaid: its row's `series` must say"):
        histogram_series_rows((unsaid,))
