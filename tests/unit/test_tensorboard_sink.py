"""The tensorboard backend's choices: which ranks write, a missing extra, a writer that fails, SummaryCollector's
habits (histograms, prefixed layer tags at collect_freq), event-file rotation."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import mindspore as ms
import numpy as np
import pytest
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from ms_exporter.config import ConfigError
from ms_exporter.core import catalogue as c
from ms_exporter.core.device.device_reductions import HISTOGRAM_SAMPLE, drawn_positions
from ms_exporter.core.errors import Breaker, ErrorSink
from ms_exporter.core.output_layout import OutputLayout
from ms_exporter.core.sample import StepSample
from ms_exporter.core.store import MetricStore
from ms_exporter.sinks.tensorboard import TensorBoardWriter
from tests.support.sinks import sinks_of
from tests.support.transfers import count_transfers


def test_rank_0_writes_by_default_and_every_rank_with_all_ranks(tmp_path: Path) -> None:
    assert sinks_of(0, tmp_path) == ["tensorboard"]
    assert sinks_of(1, tmp_path) == []
    assert sinks_of(1, tmp_path, tensorboard={"all_ranks": True}) == ["tensorboard"]
    assert (tmp_path / "tensorboard" / "default" / "rank1").is_dir()


def test_without_tensorboardx_the_config_error_names_the_extra(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "tensorboardX", None)  # what an install without the extra looks like
    with pytest.raises(ConfigError, match=r"pip install 'ms-exporter\[tensorboard\]'"):
        sinks_of(0, tmp_path)


def test_a_writer_that_fails_costs_its_records_never_the_training(tmp_path: Path) -> None:
    store = MetricStore()
    errors = ErrorSink(store, ("callback", "tensorboard"))
    writer = TensorBoardWriter(store, tmp_path, 30.0, errors.absorb, Breaker(errors, store))

    def full_disk(*args: object, **kwargs: object) -> None:
        raise OSError(28, "No space left on device")

    writer._append = full_disk  # type: ignore[method-assign]
    for step in range(1, 4):
        writer.on_step(StepSample(step, 1, 1, 0.5, 0.01, 0.0, 8, 64, 1e9 + step, float(step)))
        writer.flush()  # raises nothing
    dropped = store.series_of(c.DROPPED_RECORDS)[0]
    assert dropped.value == 3
    writer.on_step(StepSample(4, 1, 1, 0.5, 0.01, 0.0, 8, 64, 1e9 + 4, 4.0))  # switched off after 3 failures
    writer.close()
    counted = {dict(series.labels)["component"]: series.value for series in store.series_of(c.ERRORS)}
    assert counted["tensorboard"] == 3
    disabled = {dict(series.labels)["component"]: series.value for series in store.series_of(c.COMPONENT_DISABLED)}
    assert disabled["tensorboard"] == 1


def test_a_stuck_writer_is_given_up_within_the_bound(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A write that never returns (a disk that does not answer): train end, a signal and close each come back
    within WAIT_SECONDS, the records are counted as lost and the backend is off."""
    import threading
    import time

    from ms_exporter.sinks.shared import queued_writer

    monkeypatch.setattr(queued_writer, "WAIT_SECONDS", 0.5)
    store = MetricStore()
    errors = ErrorSink(store, ("callback", "tensorboard"))
    writer = TensorBoardWriter(store, tmp_path, 3600.0, errors.absorb, Breaker(errors, store))
    release = threading.Event()
    writer._append = lambda data: release.wait()  # type: ignore[method-assign,assignment]
    try:
        writer.on_train_begin({"cur_step_num": 0})
        for step in range(1, 6):
            writer.on_step(StepSample(step, 1, 1, 0.5, 0.01, 0.0, 8, 64, 1e9 + step, float(step)))
        began = time.monotonic()
        writer.on_train_end(5, True)  # the writer thread takes the 5 records and hangs in the write
        writer.on_signal("SIGTERM", 5)
        writer.on_step(StepSample(6, 1, 1, 0.5, 0.01, 0.0, 8, 64, 1e9 + 6, 6.0))  # off: not queued
        writer.close()
        assert time.monotonic() - began < 2.0
    finally:
        release.set()
    assert store.series_of(c.DROPPED_RECORDS)[0].value == 5
    counted = {dict(series.labels)["component"]: series.value for series in store.series_of(c.ERRORS)}
    assert counted["tensorboard"] == 1
    disabled = {dict(series.labels)["component"]: series.value for series in store.series_of(c.COMPONENT_DISABLED)}
    assert disabled["tensorboard"] == 1


class _Network:
    def __init__(self, weights: list[ms.Parameter]) -> None:
        self.weights = weights


def _read(log_dir: Path) -> EventAccumulator:
    reader = EventAccumulator(str(log_dir), size_guidance={"scalars": 0, "histograms": 0})
    reader.Reload()
    return reader


def _as_tensorboardx_draws(values: np.ndarray) -> Any:
    """The histogram tensorboardX's summary.histogram makes of the values' finite part, 64 bins."""
    from tensorboardX.summary import make_histogram

    return make_histogram(values[np.isfinite(values)].astype(np.float64), bins=64)


def test_summary_collector_habits_histograms_and_prefixed_layer_tags_every_collect_freq_steps(tmp_path: Path) -> None:
    store = MetricStore()
    errors = ErrorSink(store, ("callback", "tensorboard"))
    grad = store.register(c.LAYER_GRAD_NORM)
    ratio = store.register(c.LAYER_UPDATE_RATIO)
    rng = np.random.default_rng(0)
    values = rng.normal(size=(8, 8)).astype(np.float32)
    dense = ms.Parameter(ms.Tensor(values), name="dense.weight")
    bias = ms.Parameter(ms.Tensor(np.zeros(8, np.float32)), name="dense.bias")
    one_value = np.full((4, 4), 0.25, np.float32)  # numpy's bins for it: [0.25 - 0.5, 0.25 + 0.5]
    constant = ms.Parameter(ms.Tensor(one_value), name="constant.weight")
    broken = ms.Parameter(ms.Tensor(np.full(4, np.nan, np.float32)), name="broken.weight")  # nothing to draw
    writer = TensorBoardWriter(store, tmp_path, 3600.0, errors.absorb, collect_freq=5, histogram_regular=".*weight.*")
    cb = {"cur_step_num": 0, "train_network": _Network([dense, bias, constant, broken])}
    writer.on_train_begin(cb)
    expected: dict[tuple[str, int], np.ndarray] = {}  # (tag, step): the parameter's values then
    for step in range(1, 13):
        values = values + np.float32(0.1)  # the optimizer's step
        if step == 10:
            values[0, 0] = np.nan  # a non-finite value is left out of the histogram
            values[1, 1] = np.inf
        dense.set_data(ms.Tensor(values))
        grad.series(layer="dense").value = float(step)
        ratio.series(layer="dense").value = step / 100
        writer.on_step_end(step, None)
        if step in (1, 5, 10):
            expected["weight/dense.weight", step] = values.copy()
            expected["weight/constant.weight", step] = one_value
        writer.on_step(StepSample(step, 1, 1, 0.5, 0.01, 0.0, 8, 64, 1e9 + step, float(step)))
    writer.close()
    reader = _read(tmp_path)
    # dense.bias does not match the expression; broken.weight has no finite value to draw
    drawn = {
        (tag, event.step): event.histogram_value
        for tag in reader.Tags()["histograms"]
        for event in reader.Histograms(tag)
    }
    assert sorted(drawn) == sorted(expected)
    for key, at_step in expected.items():
        finite = at_step[np.isfinite(at_step)].astype(np.float64)
        histogram = drawn[key]
        # numpy's of the parameter at that step (its finite values), to float32's precision
        assert histogram.num == finite.size
        assert (histogram.min, histogram.max) == (finite.min(), finite.max())
        assert histogram.sum == pytest.approx(finite.sum(), rel=1e-5)
        assert histogram.sum_squares == pytest.approx(finite.dot(finite), rel=1e-5)
        # the bins tensorboardX's summary.histogram drew from the values: occupied ones and one empty on the left
        reference = _as_tensorboardx_draws(at_step)
        assert list(histogram.bucket) == list(reference.bucket)
        assert list(histogram.bucket_limit) == pytest.approx(list(reference.bucket_limit))
    tags = {tag: {e.step: e.value for e in reader.Scalars(tag)} for tag in reader.Tags()["scalars"]}
    assert tags["grad/dense"] == {1: 1.0, 5: 5.0, 10: 10.0}  # the value /metrics held at that step
    assert tags["update_ratio/dense"] == pytest.approx({1: 0.01, 5: 0.05, 10: 0.10})
    assert sorted(tags["loss"]) == list(range(1, 13))  # the step scalars: every step


def test_histograms_of_a_million_values_reach_the_host_as_a_few_hundred_bytes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Weights and gradients are reduced where they live: what a sampled step reads to the host is one row per
    tensor, not the tensor (4 MB here)."""
    store = MetricStore()
    errors = ErrorSink(store, ("callback", "tensorboard"))
    rng = np.random.default_rng(1)
    weight = rng.normal(size=(1000, 1000)).astype(np.float32)
    gradient = rng.normal(0, 1e-3, size=(1000, 1000)).astype(np.float32)
    parameter = ms.Parameter(ms.Tensor(weight), name="big.weight")
    grads = {"big.weight": ms.Tensor(gradient)}
    writer = TensorBoardWriter(store, tmp_path, 3600.0, errors.absorb, collect_freq=10, histogram_regular=".*weight.*")
    writer.on_train_begin({"cur_step_num": 0, "train_network": _Network([parameter])})
    layout = OutputLayout(grads=1)
    transfers = count_transfers(monkeypatch)
    # The first sampled step compiles the reductions; the steady state is what every later sample costs.
    for step in (10, 20):
        transfers.clear()
        writer.on_step_end(step, None)
        writer.on_step(StepSample(step, 1, 1, 0.5, 0.01, 0.0, 8, 64, 1e9, 1.0, (ms.Tensor(0.5), grads), layout))
    assert transfers.calls == 2  # one read for the weights, one for the gradients
    assert transfers.bytes <= 2 * 4 * (5 + 64)  # a row of 69 float32 each
    writer.close()
    reader = _read(tmp_path)
    # Drawn from whole rows at fixed random places, scaled to the million.
    drawn = drawn_positions(weight.shape)
    assert 0 < drawn.size <= HISTOGRAM_SAMPLE and drawn.size % weight.shape[1] == 0
    for tag, values in (("weight/big.weight", weight), ("grad/big.weight", gradient)):
        histogram = reader.Histograms(tag)[-1].histogram_value
        sample = values.reshape(-1)[drawn].astype(np.float64)
        assert histogram.num == values.size
        assert (histogram.min, histogram.max) == (sample.min(), sample.max())
        scale = values.size / drawn.size
        assert histogram.sum == pytest.approx(sample.sum() * scale, abs=1e-5 * np.abs(sample).sum() * scale)
        assert sum(histogram.bucket) == pytest.approx(values.size)


def test_a_full_event_file_is_closed_and_the_next_begun(tmp_path: Path) -> None:
    store = MetricStore()
    errors = ErrorSink(store, ("callback", "tensorboard"))
    writer = TensorBoardWriter(store, tmp_path, 3600.0, errors.absorb, max_file_bytes=600)
    writer.on_train_begin({"cur_step_num": 0})
    for step in range(1, 41):
        writer.on_step(StepSample(step, 1, 1, 0.5, 0.01, 0.0, 8, 64, 1e9 + step, float(step)))
        if step % 5 == 0:
            writer.flush()
    writer.close()
    files = sorted(tmp_path.glob("events.out.tfevents.*"))
    assert len(files) > 2
    assert all(path.stat().st_size < 600 + 1000 for path in files)  # rotated after the write that crossed it
    loss = _read(tmp_path).Scalars("loss")
    assert [event.step for event in loss] == list(range(1, 41))  # one curve across the files, in order
