"""The store and its Prometheus rendering, asserted through a private registry."""

from __future__ import annotations

import math

from prometheus_client import CollectorRegistry

from ms_exporter.core.catalogue import MetricFamily
from ms_exporter.core.store import MetricStore
from ms_exporter.sinks.prometheus import StoreCollector


def registry_for(store: MetricStore, errors: list) -> CollectorRegistry:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(StoreCollector(store, lambda component, exc: errors.append((component, exc))))
    return registry


def test_gauges_counters_histograms_render_with_constant_labels() -> None:
    store = MetricStore((("rank", "3"), ("project", "p")))
    store.register(MetricFamily("mindspore_train_loss", "gauge", "loss", "1")).series().value = 1.5
    store.register(MetricFamily("mindspore_train_steps_total", "counter", "steps", "1")).series().value = 7
    memory = store.register(MetricFamily("mindspore_train_memory_bytes", "gauge", "mem", "bytes"))
    memory.series(kind="host_rss").value = 100
    hist = store.register(
        MetricFamily("mindspore_train_step_duration_seconds", "histogram", "d", "seconds", buckets=(0.01, 0.1, 1.0))
    ).histogram()
    hist.observe(0.05)
    hist.observe(0.5, count=3)  # a sink of 3 steps
    hist.observe(5.0)
    registry = registry_for(store, [])
    labels = {"rank": "3", "project": "p"}
    assert registry.get_sample_value("mindspore_train_loss", labels) == 1.5
    assert registry.get_sample_value("mindspore_train_steps_total", labels) == 7
    assert registry.get_sample_value("mindspore_train_memory_bytes", {**labels, "kind": "host_rss"}) == 100
    bucket = "mindspore_train_step_duration_seconds_bucket"
    assert registry.get_sample_value(bucket, {**labels, "le": "0.01"}) == 0
    assert registry.get_sample_value(bucket, {**labels, "le": "0.1"}) == 1
    assert registry.get_sample_value(bucket, {**labels, "le": "1.0"}) == 4
    assert registry.get_sample_value(bucket, {**labels, "le": "+Inf"}) == 5
    assert registry.get_sample_value("mindspore_train_step_duration_seconds_count", labels) == 5
    assert math.isclose(registry.get_sample_value("mindspore_train_step_duration_seconds_sum", labels), 6.55)


def test_a_broken_family_costs_only_its_series() -> None:
    store = MetricStore((("rank", "0"), ("project", "p")))
    store.register(MetricFamily("good", "gauge", "g", "1")).series().value = 1
    store.register(MetricFamily("bad", "gauge", "b", "1")).series().value = "not a number"  # type: ignore[assignment]
    errors: list = []
    registry = registry_for(store, errors)
    assert registry.get_sample_value("good", {"rank": "0", "project": "p"}) == 1
    assert registry.get_sample_value("bad", {"rank": "0", "project": "p"}) is None
    assert errors and errors[0][0] == "prometheus"


def test_version_changes_when_a_series_appears() -> None:
    store = MetricStore()
    family = store.register(MetricFamily("g", "gauge", "g", "1"))
    before = store.version
    family.series()
    family.series()  # existing: no change
    assert store.version == before + 1
