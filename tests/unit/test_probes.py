"""Each probe's arithmetic, fed samples directly (the integration tests feed them from real training)."""

from __future__ import annotations

import logging
import math

import pytest

from ms_exporter.config import Bound
from ms_exporter.core import catalogue
from ms_exporter.core.store import MetricStore
from ms_exporter.features.breach_watch import CALM_CHECKS, ThresholdWatcher
from ms_exporter.probes.loss import LossProbe
from ms_exporter.probes.memory import MIB, MemoryProbe
from ms_exporter.probes.throughput import ThroughputProbe
from tests.support.samples import sample


def value(store: MetricStore, name: str, **labels: str) -> float:
    family = store.get(name)
    assert family is not None, name
    return family.series(**labels).value


def test_loss_smoothing_rising_and_nonfinite() -> None:
    store = MetricStore()
    probe = LossProbe(store, window=3)
    for step, loss in enumerate([4.0, 3.0, 3.5, 3.6, float("nan"), 3.7, 1.0], start=1):
        probe.on_step(sample(step, loss))
        if step == 4:
            assert value(store, "mindspore_train_loss_smoothed") == pytest.approx((3.0 + 3.5 + 3.6) / 3)
            assert value(store, "mindspore_train_loss_consecutive_increases") == 2
        if step == 5:
            assert math.isnan(value(store, "mindspore_train_loss"))
        if step == 6:  # NaN neither broke nor extended the streak; 3.7 > 3.6 extends it
            assert value(store, "mindspore_train_loss_consecutive_increases") == 3
    assert value(store, "mindspore_train_loss") == 1.0
    assert value(store, "mindspore_train_loss_consecutive_increases") == 0
    assert value(store, "mindspore_train_nonfinite_loss_total") == 1
    assert value(store, "mindspore_train_loss_smoothed") == pytest.approx((3.6 + 3.7 + 1.0) / 3)


def test_a_rollback_takes_the_smoothed_loss_back_to_the_good_state() -> None:
    store = MetricStore()
    probe = LossProbe(store, window=3)
    for step, loss in enumerate([4.0, 3.0, 2.0], start=1):
        probe.on_step(sample(step, loss))
    probe.on_good_state(3)
    for step, loss in ((4, 2.5), (5, 1e12)):  # the spike that makes the monitor roll back to step 3
        probe.on_step(sample(step, loss))
    assert value(store, "mindspore_train_loss_consecutive_increases") == 2
    probe.on_rollback(2)  # not the state it kept: nothing changes
    assert value(store, "mindspore_train_loss_smoothed") == pytest.approx((2.0 + 2.5 + 1e12) / 3)
    probe.on_rollback(3)
    assert value(store, "mindspore_train_loss_smoothed") == pytest.approx((4.0 + 3.0 + 2.0) / 3)
    assert value(store, "mindspore_train_loss_consecutive_increases") == 0
    probe.on_step(sample(6, 2.5))  # after the rollback: against step 3's loss, in step 3's window
    assert value(store, "mindspore_train_loss_smoothed") == pytest.approx((3.0 + 2.0 + 2.5) / 3)
    assert value(store, "mindspore_train_loss_consecutive_increases") == 1


def test_throughput_over_window_and_token_series_only_with_tokens() -> None:
    store = MetricStore()
    probe = ThroughputProbe(store, samples=True, tokens=True)
    probe.on_step(sample(1, samples=10, t=1.0, duration=1.0))
    assert value(store, "mindspore_train_samples_per_second") == pytest.approx(10.0)
    assert store.get("mindspore_train_tokens_per_second") is None  # image-like data: no token series at all
    for step in range(2, 6):
        probe.on_step(sample(step, samples=10, tokens=100, t=float(step), duration=0.5, wait=0.5))
    assert value(store, "mindspore_train_samples_total") == 50
    assert value(store, "mindspore_train_tokens_total") == 400
    assert value(store, "mindspore_train_samples_per_second") == pytest.approx(50 / 5)
    # 400 tokens over 5 s of window, counting from the first step's begin.
    assert value(store, "mindspore_train_tokens_per_second") == pytest.approx(400 / 5)


def test_throughput_window_forgets_old_points() -> None:
    store = MetricStore()
    probe = ThroughputProbe(store, samples=True, tokens=False)
    for step in range(1, 40):
        # slow at first (1 sample/s), then 100 samples/s
        probe.on_step(sample(step, samples=1 if step < 20 else 100, t=float(step), duration=1.0))
    assert value(store, "mindspore_train_samples_per_second") == pytest.approx(100, rel=0.01)


def test_memory_kinds_growth_and_zero_device_omitted() -> None:
    store = MetricStore()
    device = {"value": 0}
    # interval 0: every step reads the device (the monitor passes its `interval`)
    probe = MemoryProbe(
        store,
        warmup_steps=2,
        window=5,
        interval=0.0,
        device_readers={"device_allocated": lambda: device["value"], "device_peak": lambda: 0},
    )
    probe.sample_host()
    family = store.get("mindspore_train_memory_bytes")
    assert family is not None
    assert {dict(s.labels)["kind"] for s in family.children()} == {"host_rss"}  # the host sample reads no device
    probe.on_step(sample(1, steps=1))
    kinds = {dict(s.labels)["kind"] for s in family.children()}
    assert kinds == {"host_rss"}  # device readers returning 0 (CPU) export nothing
    ratio = store.get("mindspore_train_memory_growth_ratio")
    assert ratio is not None and ratio.children() == []  # no baseline, so no series, before warm-up
    device["value"] = 100 * MIB
    probe.on_step(sample(2, steps=1))  # warmed up: the baseline
    for step, grow in ((3, 102), (4, 104), (5, 106)):
        device["value"] = grow * MIB
        probe.on_step(sample(step, steps=1))
    assert value(store, "mindspore_train_memory_bytes", kind="device_allocated") == 106 * MIB
    assert value(store, "mindspore_train_memory_growth_ratio", kind="device_allocated") == pytest.approx(0.06)
    assert value(store, "mindspore_train_memory_consecutive_increases", kind="device_allocated") == 3
    assert value(store, "mindspore_train_memory_growth_bytes_per_second", kind="device_allocated") > 0
    device["value"] = 106 * MIB + 1000  # grew, but by less than 1 MiB: the streak ends
    probe.on_step(sample(6, steps=1))
    assert value(store, "mindspore_train_memory_consecutive_increases", kind="device_allocated") == 0
    assert "device_peak" not in {dict(s.labels)["kind"] for s in family.children()}


def test_device_memory_is_read_at_most_every_interval() -> None:
    reads: list[int] = []
    probe = MemoryProbe(
        MetricStore(),
        warmup_steps=0,
        window=5,
        interval=3600.0,
        device_readers={"device_allocated": lambda: reads.append(1) or 5 * MIB},
    )
    for step in range(1, 50):
        probe.on_step(sample(step))
    assert len(reads) == 1  # the first step, then not again within the hour


def test_threshold_breach_warns_once_per_episode(caplog: pytest.LogCaptureFixture) -> None:
    store = MetricStore()
    loss = store.register(catalogue.LOSS).series()
    tokens = store.register(catalogue.TOKENS_PER_SECOND).series()
    watcher = ThresholdWatcher(
        store, {"loss": Bound("max", 5.0), "tokens_per_second": Bound("min", 100.0)}, warmup_steps=3, watch_after=2
    )
    caplog.set_level(logging.WARNING, logger="ms_exporter")
    tokens.value = 1.0  # low during warm-up: not a breach yet
    calm = [2.0] * CALM_CHECKS
    # 9 during the watch's warm-up; then 6-8; back and forth (one episode); calm long enough; 9 again.
    losses = [9.0, 6.0, 7.0, 8.0, 2.0, 9.0, *calm, 9.0]
    for steps_done, loss_value in enumerate(losses, start=1):
        loss.value = loss_value
        watcher.check_step(steps_done)
    breaches = store.get("mindspore_train_threshold_breaches_total")
    assert breaches is not None
    assert breaches.series(metric="loss").value == 2  # 6 ... 9 (a flap is no new episode), and the last 9
    assert breaches.series(metric="tokens_per_second").value == 1  # one long episode after warm-up
    loss_warnings = [r for r in caplog.records if "loss =" in r.getMessage()]
    assert len(loss_warnings) == 2
    assert "loss = 6" in loss_warnings[0].getMessage() and "max 5" in loss_warnings[0].getMessage()


def test_threshold_watch_follows_series_that_appear_later() -> None:
    store = MetricStore()
    watcher = ThresholdWatcher(store, {"grad_norm": Bound("max", 10.0)}, warmup_steps=0)
    watcher.check_step(1)  # no such series yet: nothing to check
    store.register(catalogue.GRAD_NORM).series().value = 50.0
    watcher.check_step(2)
    breaches = store.get("mindspore_train_threshold_breaches_total")
    assert breaches is not None and breaches.series(metric="grad_norm").value == 1


def test_layernorm_std_of_scales_near_one_keeps_its_digits() -> None:
    """E[x^2] - E[x]^2 of raw values near 1 with a spread of 4e-5 lost 8 digits (a flaky integration check); the
    device's two passes in float32 around the first value keep the mean to 1e-12 and the std to 1e-5."""
    import mindspore as ms
    import numpy as np

    from ms_exporter.config import LayerNormConfig
    from ms_exporter.core.store import MetricStore
    from ms_exporter.probes.layernorm import LayerNormProbe, _Scale

    values = 1.0 + np.random.default_rng(3).normal(0.0, 4e-5, 512)
    store = MetricStore((("rank", "0"), ("project", "p")))
    probe = LayerNormProbe(store, LayerNormConfig())
    probe._scales = [_Scale("norm", ms.Parameter(ms.Tensor(values.astype(np.float32)), name="norm.gamma"))]
    probe.sample(0)
    exact = values.astype(np.float32).astype(np.float64)
    (scale,) = probe._scales
    assert scale.series is not None
    mean, std, _ = scale.series
    assert std.value == pytest.approx(exact.std(), rel=1e-5)
    assert mean.value == pytest.approx(exact.mean(), rel=1e-12)
