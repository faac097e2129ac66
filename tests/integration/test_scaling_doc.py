"""docs/scaling.md: its per-rank counts come from a real measurement that adds up, and its snippets are valid."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml

from benchmarks.scaling import (
    BEGIN,
    CASES,
    END,
    SYNTHETIC,
    UPPER_BOUND,
    doc_relabeling,
    measure,
    prometheus_configs,
    prometheus_load,
    promtool_check,
    replace_block,
    rule_bytes,
    series_in_prometheus,
    yaml_blocks,
)
from tests.support.kubernetes_schema import schema_problems

pytestmark = pytest.mark.integration
ROOT = Path(__file__).resolve().parents[2]
DOC = ROOT / "docs/scaling.md"
STEPS = 30


def _lines(text: str, pattern: str) -> int:
    return len(re.findall(pattern, text, flags=re.MULTILINE))


def _dropped(relabel: list[dict[str, object]], name: str, labels: dict[str, str]) -> bool:
    """Prometheus' drop semantics for these rules: the source label values joined by ';', the regex anchored."""
    values = {"__name__": name, **labels}
    for rule in relabel:
        joined = str(rule.get("separator", ";")).join(values.get(str(s), "") for s in rule["source_labels"])  # type: ignore[union-attr]
        if rule.get("action") == "drop" and re.fullmatch(str(rule["regex"]), joined):
            return True
    return False


def test_measured_counts_add_up_and_prometheus_sees_the_same() -> None:
    default = measure(CASES[0], STEPS, prometheus_seconds=2)
    upper = measure(CASES[1], STEPS)

    for figures in (default, upper):
        text = figures.exposition
        assert figures.series == _lines(text, r"^[a-z_]+(\{.*\})? \S+$") > 0
        assert figures.bucket_series == _lines(text, r"^\w+_bucket\{") > 0
        histograms = _lines(text, r"^# TYPE \w+ histogram$")
        # Each histogram series is its buckets plus _sum and _count.
        assert figures.histogram_series == figures.bucket_series + 2 * _lines(text, r"^\w+_count\{")
        assert histograms > 0 and figures.families >= histograms
        assert figures.layernorm_series == 3 * figures.layernorms_in_model > 0
        assert 0 < figures.bytes_gzip < figures.bytes_openmetrics
        assert figures.mean_label_pairs >= 3  # name, rank, project at least

    assert default.layer_grad_norm_series == 5  # grad_norm.top_k's default, nothing watched
    assert default.weight_norm_series == 0
    cap = UPPER_BOUND["grad_norm"]["max_series"]
    assert upper.layer_grad_norm_series == cap
    assert upper.weight_norm_series == cap - UPPER_BOUND["grad_norm"]["top_k"]  # the watched layers
    assert upper.series > default.series

    seen = default.prometheus
    assert seen["samples_scraped"] == default.series
    assert seen["series_added_first_scrape"] == default.series
    assert seen["synthetic_in_head"] == len(SYNTHETIC)
    assert seen["series_in_head"] == default.series + len(SYNTHETIC)
    assert series_in_prometheus(default) == default.series + len(SYNTHETIC)
    assert rule_bytes(default, 10_000) > 9 * rule_bytes(default, 1_000) > 0

    # The page's relabeling on a real Prometheus, over replayed ranks 0..3: rank 0 keeps everything.
    relabel = doc_relabeling(DOC.read_text())
    assert relabel
    ranks = 4
    load = prometheus_load(upper.exposition, ranks, interval=1.0, scrapes=1, relabel=relabel, baseline=False)
    assert load["failed_scrapes"] == 0
    assert load["samples_scraped"] == ranks * upper.series
    dropped_per_rank = sum(
        _dropped(relabel, s.split("{")[0], {"rank": "1"})
        for s in upper.exposition.splitlines()
        if s and not s.startswith("#")
    )
    assert dropped_per_rank > upper.layer_grad_norm_series
    assert load["samples_kept"] == ranks * upper.series - (ranks - 1) * dropped_per_rank
    assert load["head_series"] == load["samples_kept"] + ranks * len(SYNTHETIC)


def test_the_relabeling_drops_per_layer_detail_and_cost_buckets_of_other_ranks_only() -> None:
    relabel = doc_relabeling(DOC.read_text())
    assert relabel
    for name, labels in [
        ("mindspore_train_layer_grad_norm", {"layer": "head"}),
        ("mindspore_train_layernorm_scale_mean", {"layer": "encoder.layers.0.norm1"}),
        ("mindspore_train_weight_norm", {"layer": "head"}),
        ("mindspore_exporter_callback_duration_seconds_bucket", {"hook": "step_end", "le": "0.001"}),
    ]:
        assert _dropped(relabel, name, {**labels, "rank": "17"}), name
        assert not _dropped(relabel, name, {**labels, "rank": "0"}), name
    for name in (
        "mindspore_train_loss",
        "mindspore_exporter_callback_duration_seconds_count",
        "mindspore_train_step_duration_seconds_bucket",
        "mindspore_train_grad_norm",
        "up",
    ):
        assert not _dropped(relabel, name, {"rank": "17"}), name


def test_the_page_has_its_measured_block_and_valid_snippets() -> None:
    text = DOC.read_text()
    assert text.count(BEGIN) == 1 and text.count(END) == 1
    block = text.split(BEGIN, 1)[1].split(END, 1)[0]
    assert "Measured by `python -m benchmarks.scaling" in block  # written by the script, not by hand
    assert "### 1,000 and 10,000 ranks, computed" in block
    assert replace_block(text, BEGIN + "\nnew\n" + END).count("\nnew\n") == 1

    configs = prometheus_configs(text)
    assert len(configs) >= 3  # federation, remote write, the relabeling at scale
    for config in configs:
        promtool_check(config)
    operator = [b for b in yaml_blocks(text) if "metricRelabelings" in b]
    assert operator
    for snippet in operator:
        podmonitor = {
            "apiVersion": "monitoring.coreos.com/v1",
            "kind": "PodMonitor",
            "metadata": {"name": "mindspore-training"},
            "spec": {
                "selector": {"matchLabels": {"app.kubernetes.io/name": "mindspore-training"}},
                **yaml.safe_load(snippet),
            },
        }
        assert schema_problems(podmonitor) == []
