"""In a job of several ranks the actions that read the loss must read the same loss on every rank: the action
runner asks the train cell to share it (GradNormTrainOneStepCell averages it over the replicas), and says once,
where nothing shares it, what a rank deciding alone would do (docs/rollback.md#in-a-job-of-several-ranks)."""

from __future__ import annotations

import logging
from typing import Any

import pytest
from mindspore import nn

from ms_exporter.actions.runner import ActionRunner
from ms_exporter.cells.train_cells import GradNormTrainOneStepCell
from ms_exporter.config import load_config
from ms_exporter.core.ranks import RankInfo
from ms_exporter.core.store import MetricStore

TWO_RANKS = RankInfo(0, 0, 2, "node")
EARLY_STOP = {"early_stop": {"enable": True}}


class SharingCell:
    """A train cell that can share its loss, recording that it was asked."""

    def __init__(self, shares: bool) -> None:
        self.asked = 0
        self._shares = shares

    def share_loss(self) -> bool:
        self.asked += 1
        return self._shares


def warnings_at_train_begin(
    caplog: pytest.LogCaptureFixture, actions: dict[str, Any], rank: RankInfo, cell: Any, calls: int = 1
) -> list[str]:
    runner = ActionRunner(load_config({"actions": actions}), MetricStore(), rank)
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="ms_exporter"):
        for _ in range(calls):  # Model.train called again on the same monitor
            runner.on_train_begin({"train_network": cell, "cur_step_num": 0})
    runner.close()
    return [r.getMessage() for r in caplog.records if "decide from the loss" in r.getMessage()]


def test_a_cell_that_shares_its_loss_is_asked_to_and_nothing_is_said(caplog: pytest.LogCaptureFixture) -> None:
    cell = SharingCell(shares=True)
    assert warnings_at_train_begin(caplog, EARLY_STOP, TWO_RANKS, cell, calls=2) == []
    assert cell.asked == 1  # shared once: the next training call's graphs share it already


def test_a_cell_that_cannot_share_it_is_said_once_naming_the_actions(caplog: pytest.LogCaptureFixture) -> None:
    actions = {**EARLY_STOP, "rollback": {"enable": True}, "snapshot": {"enable": True}}
    [said] = warnings_at_train_begin(caplog, actions, TWO_RANKS, SharingCell(shares=False), calls=2)
    assert "actions.early_stop, actions.rollback decide from the loss" in said  # not snapshot: it changes nothing
    assert "2 ranks" in said and "actions.shared_loss: true" in said and "GradNormTrainOneStepCell" in said
    [said] = warnings_at_train_begin(caplog, {"lr_backoff": {"enable": True}}, TWO_RANKS, nn.Dense(2, 2))
    assert said.startswith("ms_exporter: actions.lr_backoff decide")


def test_one_rank_a_loss_declared_shared_or_no_action_reading_it_asks_nothing(
    caplog: pytest.LogCaptureFixture,
) -> None:
    cell = SharingCell(shares=True)
    assert warnings_at_train_begin(caplog, EARLY_STOP, RankInfo(0, 0, 1, "node"), cell) == []
    assert warnings_at_train_begin(caplog, {**EARLY_STOP, "shared_loss": True}, TWO_RANKS, cell) == []
    assert warnings_at_train_begin(caplog, {"snapshot": {"enable": True}}, TWO_RANKS, cell) == []
    assert cell.asked == 0


def test_the_cell_shares_nothing_without_a_reducer() -> None:
    network = nn.WithLossCell(nn.Dense(2, 2), nn.MSELoss())
    cell = GradNormTrainOneStepCell(network, nn.SGD(network.trainable_params(), 0.1))
    assert cell.share_loss() is False and not cell.shares_loss  # one process: its loss is every replica's already
