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
    JOB_RANKS,
    SYNTHETIC,
    UPPER_BOUND,
    JobReplay,
    advanced,
    alert_families,
    doc_relabeling,
    job_forwarded,
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
    assert len(configs) >= 2  # federation, relabeling at scale (remote write: deploy/prometheus/prometheus-agent.yml)
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


def _table_after(block: str, heading_line: str) -> list[list[str]]:
    """The rows of the first Markdown table after the line that starts with `heading_line`."""
    lines = block.split(heading_line, 1)[1].splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("| "))
    rows = []
    for line in lines[start + 2 :]:
        if not line.startswith("| "):
            break
        rows.append([cell.strip() for cell in line.strip("|").split(" | ")])
    return rows


def test_the_large_job_block_names_every_alert_and_measures_every_store_at_both_sizes() -> None:
    """series_profile: large_job in the committed block (written by `make scaling`): every alert of the rules file
    has a row saying where it fires, and each replayed job was measured through Prometheus and through vmagent +
    VictoriaMetrics with no failed scrape and the series the per-rank pages add up to, and through the job's own
    Prometheus forwarding to VictoriaMetrics under the goal."""
    block = DOC.read_text().split(BEGIN, 1)[1].split(END, 1)[0]
    assert "### Very large jobs: `series_profile: large_job`, measured" in block
    alerts = _table_after(block, "Where each alert of")
    assert sorted(row[0].strip("`") for row in alerts) == sorted(alert_families())
    assert {row[1] for row in alerts} >= {"every rank"}
    jobs = _table_after(block, "A replayed job:")

    def kind(store: str) -> str:
        return "forwarded" if store.startswith("the job's Prometheus") else store.split()[0]

    measured = {(kind(row[0]), int(row[1].replace(",", ""))) for row in jobs}
    stores = ("Prometheus", "vmagent", "forwarded")
    assert measured == {(store, ranks) for store in stores for ranks, _ in JOB_RANKS}
    for row in jobs:
        assert float(row[9]) == 0, row  # failed scrapes
        if kind(row[0]) == "forwarded":
            # the shared store's series: under the goal (150,000 per 10,000 ranks), with every alert evaluated
            assert row[6] == "under" and float(row[3].replace(",", "")) < 15 * int(row[1].replace(",", "")), row
            assert f"Forwarded, {row[1]} ranks: of the shared store's {row[3]} series" in block
            continue
        series, computed = (float(row[i].replace(",", "")) for i in (3, 5))
        # the store holds what the pages add up to; vmagent's own synthetic series per target are 5 or 6
        # (scrape_timeout_seconds, counted in "computed", was not always in the store), 1/61 of a rank's
        assert abs(series - computed) <= (0.01 if row[0].startswith("Prometheus") else 0.02) * computed, row


def test_the_job_replay_serves_rank_0_the_detail_page_and_the_others_the_lean_one() -> None:
    import gzip
    import urllib.request

    replay = JobReplay('a{rank="0",project="p"} 1\nb{rank="0"} 2\n', 'a{rank="0",project="p"} 1\n', 3)
    try:
        pages = []
        for rank, encoding in ((0, "gzip"), (2, "gzip"), (1, "identity")):
            request = urllib.request.Request(
                f"http://127.0.0.1:{replay.port}/metrics/{rank}", headers={"Accept-Encoding": encoding}
            )
            with urllib.request.urlopen(request, timeout=10) as response:
                body = response.read()
                pages.append(gzip.decompress(body) if response.headers.get("Content-Encoding") == "gzip" else body)
        assert pages == [
            b'a{rank="0",project="p"} 1\nb{rank="0"} 2\n',
            b'a{rank="2",project="p"} 1\n',
            b'a{rank="1",project="p"} 1\n',
        ]
        assert replay.requests == 3 and replay.bytes_served > 0
        with urllib.request.urlopen(f"http://127.0.0.1:{replay.port}/metrics/2", timeout=10) as response:
            assert response.read() == b'a{rank="2",project="p"} 1\n'  # a gauge: the same a scrape later
        counted = JobReplay('c_count{rank="0"} 1\n', 'c_count{rank="0"} 1\n', 2)
        try:
            url = f"http://127.0.0.1:{counted.port}/metrics/1"
            served = []
            for rewind in (False, False, True):
                if rewind:
                    counted.rewind()  # the next store's run begins with the first page again
                with urllib.request.urlopen(url, timeout=10) as response:
                    served.append(response.read())
            assert served == [b'c_count{rank="1"} 1\n', b'c_count{rank="1"} 2\n', b'c_count{rank="1"} 1\n']
        finally:
            counted.close()
    finally:
        replay.close()


def test_a_replayed_rank_s_counters_advance_from_its_second_scrape_on() -> None:
    page = (
        'mindspore_train_steps_total{rank="0"} 3\ny_seconds_sum{rank="0"} 1.5\ny_seconds_count{rank="0"} 2\n'
        'z{rank="0"} 7\nmindspore_train_nonfinite_loss_total{rank="0"} 0\nmindspore_exporter_errors_total 0\n'
    )
    assert advanced(page) == (
        'mindspore_train_steps_total{rank="0"} 4\ny_seconds_sum{rank="0"} 2.5\ny_seconds_count{rank="0"} 3\n'
        'z{rank="0"} 7\nmindspore_train_nonfinite_loss_total{rank="0"} 0\nmindspore_exporter_errors_total 0\n'
    )  # a healthy step: nothing that pages moves


# A rank's page, enough for project: rules (loss, world size) and rank: rules (step time) to have results.
FORWARDED_PAGE = """# TYPE mindspore_train_loss gauge
mindspore_train_loss{project="p",rank="0"} 2.5
# TYPE mindspore_train_steps counter
mindspore_train_steps_total{project="p",rank="0"} 10
# TYPE mindspore_train_step_duration_seconds summary
mindspore_train_step_duration_seconds_sum{project="p",rank="0"} 5
mindspore_train_step_duration_seconds_count{project="p",rank="0"} 10
# TYPE mindspore_train_world_size gauge
mindspore_train_world_size{project="p",rank="0"} 6
"""


def test_a_job_s_own_prometheus_forwards_the_aggregates_and_rank_0_and_nothing_else() -> None:
    # make scaling's third run, on 6 ranks: deploy/prometheus/prometheus-job.yml's rules and remote_write, for real.
    replay = JobReplay(FORWARDED_PAGE, FORWARDED_PAGE, 6)
    try:
        job = job_forwarded(replay, 1.0, 2)
    finally:
        replay.close()
    kinds = job["kinds"]
    assert kinds["rank0"] == 5  # rank 0's whole page, without up or scrape_*
    assert kinds["rank"] == 6  # the step-time mean of every rank
    assert kinds["project"] >= 3  # loss mean, min and max at least
    assert kinds["alerts"] == 0  # a healthy job: a replayed step moves nothing that pages
    assert job["series"] == sum(kinds.values())  # nothing else: no other rank's page, no up
    assert job["job_series"] > 6 * 5 + job["series"]  # the job's server keeps every rank's page
