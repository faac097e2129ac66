"""The tensorboard backend's choices: which ranks write, a missing extra, a writer that fails."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

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
