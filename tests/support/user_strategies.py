"""Strategies of a user's own, for tests (monitor_config.strategies names them by import path)."""

from __future__ import annotations

from typing import Any

from ms_exporter.core.catalogue import MetricFamily
from ms_exporter.probes.strategies import Strategy

LOSS_TWICE = MetricFamily("mindspore_train_loss_twice", "gauge", "The loss, doubled (a declared family).", "1")


class LossSpreadStrategy:
    """Written as the strategy-container article writes one: no base class, a config dict in, a record out."""

    def __init__(self, config: dict[str, Any]) -> None:
        self.scale = float(config.get("scale", 1.0))
        self.seen: list[int] = []

    def on_step_end(self, metrics: dict[str, Any], cb_params: Any) -> dict[str, Any]:
        self.seen.append(metrics["step"])
        return {"scaled_loss": metrics["loss"] * self.scale, "lr_seen": metrics["lr"], "note": "not a number"}


class Doubled(Strategy):
    """Our base class, with a declared family."""

    name = "doubled"
    families = (LOSS_TWICE,)

    def on_step_end(self, metrics: dict[str, Any], cb_params: Any) -> dict[str, Any]:
        return {LOSS_TWICE.name: 2 * metrics["loss"], "epoch": metrics["epoch"]}


class AlwaysFailsStrategy(Strategy):
    def on_step_end(self, metrics: dict[str, Any], cb_params: Any) -> dict[str, Any]:
        raise RuntimeError("a strategy's own bug")


class RefusesItsConfig:
    def __init__(self, config: dict[str, Any]) -> None:
        raise ValueError(f"cannot use {config}")

    def on_step_end(self, metrics: dict[str, Any], cb_params: Any) -> None:
        return None
