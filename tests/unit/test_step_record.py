"""The step hook's record: named, immutable fields that the publisher turns into the probes' StepSample."""

from __future__ import annotations

import dataclasses

import pytest

from ms_exporter.core import catalogue
from ms_exporter.core.errors import Breaker, ErrorSink
from ms_exporter.core.sample import BatchCounter
from ms_exporter.core.store import MetricStore
from ms_exporter.features.breach_watch import ThresholdWatcher
from ms_exporter.monitor.publisher import StepPublisher, StepRecord
from tests.support.samples import RecordedSteps


def test_a_record_reaches_the_probes_field_by_field() -> None:
    store = MetricStore()
    errors = ErrorSink(store)
    probe = RecordedSteps()
    publisher = StepPublisher(
        [probe], ThresholdWatcher(store, {}, 0), None, [], BatchCounter("mask", "ids"), errors, Breaker(errors, store)
    )
    publisher.reset(4)
    outputs = (0.5, "overflow", "scale")
    publisher.pending.append(
        StepRecord(
            step=6,
            epoch=2,
            loss=0.5,
            began=10.0,
            ended=10.25,
            data_wait=0.125,
            kept=((3, 8), None, None),
            outputs=outputs,
        )
    )
    publisher.publish(None)
    [sample] = probe.samples
    assert (sample.step, sample.epoch, sample.steps, sample.loss) == (6, 2, 2, 0.5)  # a sink of 2 steps
    assert (sample.duration, sample.data_wait, sample.monotonic) == (0.25, 0.125, 10.25)
    assert (sample.samples, sample.outputs) == (2 * 3, outputs)  # 3 samples a step, from the kept shape
    assert not publisher.pending and publisher.last_step == 6
    assert not store.series_of(catalogue.ERRORS)  # nothing failed on the way


def test_a_record_cannot_change_once_kept() -> None:
    record = StepRecord(1, 1, None, 0.0, 0.1, None, None, None)
    with pytest.raises(dataclasses.FrozenInstanceError):
        record.step = 2  # type: ignore[misc]
