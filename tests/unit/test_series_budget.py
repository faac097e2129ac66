"""series_profile: large_job (sinks/shared/series_budget.py): what a non-detail rank's page has and lacks, that a detail
rank's page is the full one, and that every family an alert or recording rule reads stays on every rank (the list
is read from the generated rules file, so it cannot drift from the rules)."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from prometheus_client import CollectorRegistry
from prometheus_client.openmetrics.exposition import generate_latest
from prometheus_client.openmetrics.parser import text_string_to_metric_families

from ms_exporter import TrainingMonitor
from ms_exporter.config import ConfigError, load_config
from ms_exporter.core import catalogue
from ms_exporter.core.store import MetricStore
from ms_exporter.generate.rule_series import render_module, series_read
from ms_exporter.generate.rules import render_rules
from ms_exporter.sinks.prometheus import StoreCollector
from ms_exporter.sinks.shared import series_budget
from ms_exporter.sinks.shared.rule_series import RULE_SERIES
from tests.support.pythons import OTLP, needs
from tests.support.scrape import scrape

ROOT = Path(__file__).resolve().parents[2]
RULES = ROOT / "deploy" / "prometheus" / "rules" / "mindspore-training.rules.yml"
FAMILIES = {family.name: family for family in catalogue.FAMILIES}
SERIES_MODULE = ROOT / "ms_exporter" / "sinks" / "shared" / "rule_series.py"


def rules_read() -> dict[str, set[str]]:
    """Every catalogue family the committed rules file reads, with the series names of it that they read."""
    return series_read(yaml.safe_load(RULES.read_text(encoding="utf-8")))


def test_every_family_the_rules_read_is_kept_on_every_rank_or_named_as_detail_only() -> None:
    read = rules_read()
    assert len(read) > 30  # the parse found the rules' families (the file reads 41 today)
    kept = series_budget.EVERY_RANK | series_budget.DETAIL_ONLY_RULE_FAMILIES
    assert sorted(set(read) - kept) == [], "a rule reads a family that large_job drops from non-detail ranks"
    assert sorted(kept - set(read)) == [], "large_job keeps a family on every rank that no rule reads"
    assert not series_budget.EVERY_RANK & series_budget.DETAIL_ONLY_RULE_FAMILIES


def test_the_committed_rule_series_module_is_what_make_generate_writes() -> None:
    written = render_module(series_read(render_rules()))
    assert SERIES_MODULE.read_text(encoding="utf-8") == written, "run `make generate` and commit it"
    assert {family: frozenset(names) for family, names in rules_read().items()} == RULE_SERIES


def test_a_rule_reading_a_name_that_is_no_family_is_named() -> None:
    rules = {"groups": [{"rules": [{"alert": "Made", "expr": "mindspore_train_made_up > 1"}]}]}
    with pytest.raises(ValueError, match="Made reads mindspore_train_made_up"):
        series_read(rules)


def test_no_rule_reads_a_bucket_of_a_histogram_kept_as_sum_and_count() -> None:
    for family, names in rules_read().items():
        if FAMILIES[family].type == "histogram":
            assert names <= {family + "_sum", family + "_count"}, (family, names)


def test_the_detail_only_families_the_rules_read_are_the_per_layer_ones() -> None:
    for name in series_budget.DETAIL_ONLY_RULE_FAMILIES:
        family = FAMILIES[name]
        # the median layer's ratio is joined to each layer's on the same rank (LayerFrozen): it goes with them
        assert "layer" in family.labels or family is catalogue.UPDATE_RATIO_MEDIAN, name


def filled_store() -> MetricStore:
    """A store with a family of each shape large_job treats differently."""
    store = MetricStore((("rank", "3"), ("project", "p")))
    store.register(catalogue.LOSS).series().value = 2.5
    steps = store.register(catalogue.STEP_DURATION).histogram()
    for seconds in (0.01, 0.02, 0.5):
        steps.observe(seconds)
    store.register(catalogue.HOOK_DURATION).histogram(hook="step_end").observe(1e-5)
    store.register(catalogue.GRAD_NORM_DISTRIBUTION).histogram().observe(1.0)
    store.register(catalogue.LAYER_GRAD_NORM).series(layer="encoder.0").value = 0.3
    store.register(catalogue.LAYERNORM_DRIFT).series(layer="norm.0").value = 0.01
    store.register(catalogue.TIME_SECONDS).series(bucket="productive").value = 9.0
    store.register(catalogue.ERRORS).series(component="loss").value = 0.0
    return store


def page(store: MetricStore) -> dict[str, dict[str, float]]:
    """The store as OpenMetrics through the collector, parsed by prometheus_client's strict OpenMetrics parser:
    family -> {sample name: value}."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(StoreCollector(store, lambda *_: None))
    text = generate_latest(registry).decode()
    return {
        family.name: {sample.name + str(sorted(sample.labels.items())): sample.value for sample in family.samples}
        for family in text_string_to_metric_families(text)
    }


def test_a_non_detail_rank_exposes_the_rules_families_and_its_histograms_as_sum_and_count() -> None:
    store = filled_store()
    full = page(store)
    series_budget.attach(store, "large_job", [0], rank=3)
    budget = page(store)
    assert set(budget) == {"mindspore_train_loss", "mindspore_train_step_duration_seconds", "mindspore_exporter_errors"}
    steps = budget["mindspore_train_step_duration_seconds"]
    assert sorted(steps) == [
        "mindspore_train_step_duration_seconds_count[('project', 'p'), ('rank', '3')]",
        "mindspore_train_step_duration_seconds_sum[('project', 'p'), ('rank', '3')]",
    ]
    # the values the rules read are the full page's
    for name, value in steps.items():
        assert full["mindspore_train_step_duration_seconds"][name] == value
    assert sorted(steps.values()) == pytest.approx([0.53, 3.0])  # sum and count of the three steps
    # what only a detail rank keeps: per-layer series, other histograms, families no rule reads
    for gone in (
        "mindspore_train_layer_grad_norm",
        "mindspore_train_layernorm_scale_drift_ratio",
        "mindspore_exporter_callback_duration_seconds",
        "mindspore_train_grad_norm_distribution",
        "mindspore_train_time_seconds",
    ):
        assert gone in full and gone not in budget, gone


def test_a_detail_rank_and_the_full_profile_expose_everything() -> None:
    store = filled_store()
    full = page(store)
    assert series_budget.attach(store, "large_job", [1, 3], rank=3).detail
    assert page(store) == full
    series_budget.attach(store, "full", [], rank=3)
    assert page(store) == full


def test_the_monitor_serves_the_budget_its_config_names(tmp_path: Path) -> None:
    """A real TrainingMonitor (rank 0) and a real scrape: large_job with detail_ranks [5] makes it a non-detail
    rank; with detail_ranks [0] it serves everything."""
    pages = {}
    for detail in ([5], [0]):
        monitor = TrainingMonitor(
            port=0, save_dir=str(tmp_path), web={"cache_seconds": 0}, series_profile="large_job", detail_ranks=detail
        )
        try:
            assert monitor.url is not None
            pages[detail[0]] = {s.name for s in scrape(monitor.url).samples}
        finally:
            monitor.close()
    lean, rich = pages[5], pages[0]
    assert "mindspore_exporter_callback_duration_seconds_bucket" in rich  # pre-created at construction
    assert not any(name.startswith("mindspore_exporter_callback_duration") for name in lean)
    assert "mindspore_train_info" in lean and "mindspore_exporter_errors_total" in lean
    assert lean < rich
    names = {name for family in series_budget.EVERY_RANK for name in (family, family + "_sum", family + "_count")}
    assert sorted(lean - names) == []


@needs(OTLP)
def test_otlp_exports_a_non_detail_ranks_histograms_without_buckets() -> None:
    from ms_exporter.sinks.otlp import StoreHistogramExporter

    store = filled_store()
    series_budget.attach(store, "large_job", [0], rank=3)
    exporter = StoreHistogramExporter(object(), store, lambda *_: None)  # type: ignore[arg-type]
    histograms = {metric.name: metric.data.data_points for metric in exporter._histograms()}
    assert set(histograms) == {"mindspore_train_step_duration_seconds"}
    (point,) = histograms["mindspore_train_step_duration_seconds"]
    assert (point.count, list(point.explicit_bounds), list(point.bucket_counts)) == (3, [], [3])
    assert point.sum == pytest.approx(0.53)
    series_budget.attach(store, "large_job", [3], rank=3)
    assert len(exporter._histograms()) == 3  # a detail rank: every histogram, with its buckets


def test_the_config_keys() -> None:
    assert (load_config({}).series_profile, load_config({}).detail_ranks) == ("full", (0,))
    config = load_config({"series_profile": "large_job", "detail_ranks": [8, 0, 8]})
    assert (config.series_profile, config.detail_ranks) == ("large_job", (0, 8))
    assert load_config({"detail_ranks": 4}).detail_ranks == (4,)
    for bad in ({"series_profile": "small"}, {"detail_ranks": [-1]}, {"detail_ranks": [True]}, {"detail_ranks": "0"}):
        with pytest.raises(ConfigError):
            load_config(bad)
    with pytest.raises(ConfigError, match="detail_ranks: must be a global rank or a list"):
        load_config({"detail_ranks": list(range(5000))})


def test_the_environment_sets_the_profile(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MS_EXPORTER_SERIES_PROFILE", "large_job")
    monkeypatch.setenv("MS_EXPORTER_DETAIL_RANKS", "[0, 16]")
    config = load_config({})
    assert (config.series_profile, config.detail_ranks) == ("large_job", (0, 16))
