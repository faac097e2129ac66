"""Odd values in cb_params: missing, None, non-finite, huge, negative, a Parameter LR, tuples with extra items.
None of them may raise into training; non-finite losses are counted; the scrape stays valid."""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pytest
from mindspore import Parameter, Tensor, nn
from mindspore.train.callback import RunContext, _InternalCallbackParam

from ms_exporter import TrainingMonitor
from tests.support.scrape import scrape

ODD_OUTPUTS: list[tuple[str, Any]] = [
    ("none", None),
    ("empty tuple", ()),
    ("a string", "loss"),
    ("nan", Tensor(np.float32("nan"))),
    ("inf", Tensor(np.float32("inf"))),
    ("-inf", float("-inf")),
    ("huge", Tensor(np.float64(1e308))),
    ("negative", Tensor(np.float32(-3.5))),
    ("a vector", Tensor(np.array([1.0, 2.0], np.float32))),
    ("an all-nan vector", Tensor(np.array([np.nan, np.nan], np.float32))),
    ("int", 7),
    ("a tuple with extra items", (Tensor(np.float32(0.5)), Tensor(False), Tensor(np.float32(1024)), "x", None, 3, [])),
    ("a dict", {"loss": Tensor(np.float32(0.5))}),
    ("nested tuple", ((Tensor(np.float32(0.5)),),)),
]


UNREADABLE = {"none", "empty tuple", "a string", "a dict"}


def run_context(step: int, outputs: Any, optimizer: Any = None, element: Any = None) -> RunContext:
    params = _InternalCallbackParam()
    params.cur_step_num = step
    params.cur_epoch_num = 1
    params.net_outputs = outputs
    params.optimizer = optimizer
    params.train_dataset_element = element
    return RunContext(params)


@pytest.mark.parametrize(("label", "outputs"), ODD_OUTPUTS, ids=[label for label, _ in ODD_OUTPUTS])
def test_odd_outputs_never_raise_and_the_scrape_stays_valid(label: str, outputs: Any) -> None:
    monitor = TrainingMonitor(port=0, warmup_steps=0, web={"cache_seconds": 0})
    try:
        monitor.on_train_begin(run_context(0, outputs))
        for step in range(1, 4):
            monitor.on_train_step_begin(run_context(step, outputs))
            monitor.on_train_step_end(run_context(step, outputs))
        monitor.on_train_end(run_context(3, outputs))
        monitor.publish()
        page = scrape(monitor.url)  # parses with prometheus_client: a broken value would fail here
        assert page.value("mindspore_train_steps_total") == 3
        assert page.value("mindspore_exporter_errors_total", component="callback") == 0
        nonfinite = page.value("mindspore_train_nonfinite_loss_total")
        if label in UNREADABLE:  # no loss was read: none is exported (a 0 would be a loss nobody measured)
            assert not page.has("mindspore_train_loss") and nonfinite == 0
            return
        loss = page.value("mindspore_train_loss")
        if label in ("nan", "inf", "-inf", "an all-nan vector"):
            assert nonfinite == 3 and not math.isfinite(loss)
        else:
            assert nonfinite == 0
        if label == "negative":
            assert loss == -3.5
        if label == "huge":
            assert loss == 1e308
    finally:
        monitor.close()


class Unreadable:
    """A loss that looks like a one-value tensor and fails when read (a device error, a foreign tensor type)."""

    size = 1
    dtype = np.float32

    def item(self) -> float:
        raise RuntimeError("the device is gone")

    def asnumpy(self) -> np.ndarray:
        raise RuntimeError("the device is gone")


def test_a_loss_that_cannot_be_read_still_counts_the_step() -> None:
    monitor = TrainingMonitor(port=0, warmup_steps=0, web={"cache_seconds": 0})
    try:
        monitor.on_train_begin(run_context(0, Unreadable()))
        for step in range(1, 4):
            monitor.on_train_step_begin(run_context(step, Unreadable()))
            monitor.on_train_step_end(run_context(step, (Unreadable(), Tensor(False))))
        monitor.publish()
        page = scrape(monitor.url)
        # The step, its heartbeat and its progress went on: a healthy job whose loss cannot be read is no stall.
        assert page.value("mindspore_train_steps_total") == 3 and page.value("mindspore_train_global_step") == 3
        assert page.value("mindspore_train_last_step_timestamp_seconds") > 0
        assert not page.has("mindspore_train_loss")  # and no loss is made up for it
        assert page.value("mindspore_exporter_errors_total", component="loss") == 3  # counted instead
    finally:
        monitor.close()


@pytest.mark.parametrize("kind", ["parameter", "tensor", "schedule", "list", "group"])
def test_learning_rate_in_every_form(kind: str) -> None:
    weights = [Parameter(Tensor(np.ones((2, 2), np.float32)), name=f"w{i}") for i in range(2)]
    learning_rate: Any = {
        "parameter": Parameter(Tensor(np.float32(0.01)), name="lr"),
        "tensor": Tensor(np.float32(0.01)),
        "schedule": nn.ExponentialDecayLR(0.01, 0.5, 1),
        "list": [0.01, 0.005, 0.0025, 0.001],
        "group": 0.01,
    }[kind]
    params: Any = (
        [{"params": weights[:1], "lr": 0.01}, {"params": weights[1:], "lr": 0.02}] if kind == "group" else weights
    )
    optimizer = nn.Momentum(params, learning_rate, 0.9)
    monitor = TrainingMonitor(port=0, web={"cache_seconds": 0})
    try:
        monitor.on_train_begin(run_context(0, 0.5, optimizer))
        for step in range(1, 3):
            monitor.on_train_step_begin(run_context(step, 0.5, optimizer))
            monitor.on_train_step_end(run_context(step, 0.5, optimizer))
        monitor.publish()
        page = scrape(monitor.url)
        rates = page.find("mindspore_train_learning_rate")
        assert rates and all(math.isfinite(r) and r > 0 for r in rates)
        assert page.value("mindspore_exporter_errors_total", component="learning_rate") == 0
    finally:
        monitor.close()


def test_odd_dataset_elements_do_not_count_tokens_or_raise() -> None:
    monitor = TrainingMonitor(port=0, web={"cache_seconds": 0})
    try:
        for step, element in enumerate(
            [
                None,
                [],
                ["text"],
                [Tensor(np.ones((0, 8), np.int32))],
                [np.ones((4, 8), np.int64), None],
                {"input_ids": 3},
            ],
            start=1,
        ):
            monitor.on_train_step_begin(run_context(step, 0.5, element=element))
            monitor.on_train_step_end(run_context(step, 0.5, element=element))
        monitor.publish()
        page = scrape(monitor.url)
        assert page.value("mindspore_train_steps_total") == 6
        assert page.value("mindspore_exporter_errors_total", component="callback") == 0
        assert page.value("mindspore_exporter_errors_total", component="throughput") == 0
    finally:
        monitor.close()
