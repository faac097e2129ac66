"""backend: console: one progress line through logging at most every `interval` seconds."""

from __future__ import annotations

import logging

import pytest

from ms_exporter import TrainingMonitor
from tests.support.cb_params import context


def test_the_console_line_comes_at_the_interval_through_logging(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="ms_exporter")
    monitor = TrainingMonitor(port=0, backend=["console"], interval=3600)
    try:
        monitor.on_train_begin(context(0, 0.0))
        for step in (1, 2, 3):
            monitor.on_train_step_end(context(step, 2.5))
            monitor.publish()
    finally:
        monitor.close()
    lines = [record.getMessage() for record in caplog.records if "ms_exporter: step " in record.getMessage()]
    assert len(lines) == 1, lines  # the first step, then not again within the hour's interval
    assert lines[0].startswith("ms_exporter: step 1 epoch 1 loss 2.5 ") and lines[0].endswith(" ms")
    assert " lr " not in lines[0]  # no optimizer here: no learning rate, and no made-up one
