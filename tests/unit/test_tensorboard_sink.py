"""The tensorboard backend's choices: which ranks write, a missing extra, a writer that fails, SummaryCollector's
habits (histograms, prefixed layer tags at collect_freq), event-file rotation."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from ms_exporter.config import ConfigError
from ms_exporter.core import catalogue as c
from ms_exporter.core.errors import Breaker, ErrorSink
from ms_exporter.core.sample import StepSample
from ms_exporter.core.store import MetricStore
from ms_exporter.sinks.tensorboard import TensorBoardWriter
from tests.support.sinks import sinks_of


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


def test_round2_finding_4_a_stuck_writer_is_given_up_within_the_bound(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A write that never returns (a disk that does not answer): train end, a signal and close each come back
    within WAIT_SECONDS, the records are counted as lost and the backend is off."""
    import threading
    import time

    from ms_exporter.sinks import queued_writer

    monkeypatch.setattr(queued_writer, "WAIT_SECONDS", 0.5)
    store = MetricStore()
    errors = ErrorSink(store, ("callback", "tensorboard"))
    writer = TensorBoardWriter(store, tmp_path, 3600.0, errors.absorb, Breaker(errors, store))
    release = threading.Event()
    writer._append = lambda data: release.wait()  # type: ignore[method-assign]
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


class _Param:
    def __init__(self, name: str, values: np.ndarray) -> None:
        self.name = name
        self.values = values

    def asnumpy(self) -> np.ndarray:
        return self.values  # shared, as a CPU Parameter's: the writer must copy at the step

    @property
    def dtype(self) -> str:
        return "Float32"


class _Network:
    def __init__(self, weights: list[_Param]) -> None:
        self.weights = weights


def _read(log_dir: Path) -> EventAccumulator:
    reader = EventAccumulator(str(log_dir), size_guidance={"scalars": 0, "histograms": 0})
    reader.Reload()
    return reader


def test_summary_collector_habits_histograms_and_prefixed_layer_tags_every_collect_freq_steps(tmp_path: Path) -> None:
    store = MetricStore()
    errors = ErrorSink(store, ("callback", "tensorboard"))
    grad = store.register(c.LAYER_GRAD_NORM)
    ratio = store.register(c.LAYER_UPDATE_RATIO)
    rng = np.random.default_rng(0)
    dense = _Param("dense.weight", rng.normal(size=(8, 8)).astype(np.float32))
    bias = _Param("dense.bias", np.zeros(8, np.float32))
    writer = TensorBoardWriter(store, tmp_path, 3600.0, errors.absorb, collect_freq=5, histogram_regular=".*weight.*")
    cb = {"cur_step_num": 0, "train_network": _Network([dense, bias])}
    writer.on_train_begin(cb)
    expected: dict[int, np.ndarray] = {}
    for step in range(1, 13):
        dense.values += np.float32(0.1)  # the optimizer, in place
        grad.series(layer="dense").value = float(step)
        ratio.series(layer="dense").value = step / 100
        if step == 10:
            dense.values[0, 0] = np.nan  # a non-finite value is left out of the histogram
        writer.on_step_end(step, None)
        if step in (1, 5, 10):
            expected[step] = dense.values[np.isfinite(dense.values)]
        writer.on_step(StepSample(step, 1, 1, 0.5, 0.01, 0.0, 8, 64, 1e9 + step, float(step)))
    writer.close()
    reader = _read(tmp_path)
    assert reader.Tags()["histograms"] == ["weight/dense.weight"]  # dense.bias does not match the expression
    drawn = {event.step: event.histogram_value for event in reader.Histograms("weight/dense.weight")}
    assert sorted(drawn) == [1, 5, 10]
    for step, values in expected.items():
        counts, edges = np.histogram(values, bins=64)
        histogram = drawn[step]
        assert histogram.num == values.size and histogram.min == pytest.approx(values.min())
        assert histogram.sum == pytest.approx(values.sum(), rel=1e-5)
        # TensorBoard keeps the occupied bins (and one empty bin on the left): the same counts, the same edges
        assert [count for count in histogram.bucket if count] == [count for count in counts if count]
        assert histogram.bucket_limit[-1] == pytest.approx(edges[-1])
    tags = {tag: {e.step: e.value for e in reader.Scalars(tag)} for tag in reader.Tags()["scalars"]}
    assert tags["grad/dense"] == {1: 1.0, 5: 5.0, 10: 10.0}  # the value /metrics held at that step
    assert tags["update_ratio/dense"] == pytest.approx({1: 0.01, 5: 0.05, 10: 0.10})
    assert sorted(tags["loss"]) == list(range(1, 13))  # the step scalars: every step


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
