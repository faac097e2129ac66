"""A user's own strategies (probes/strategies.py): from YAML by import path, or handed to
TransformersMonitorCallback as objects; their numbers become gauges and step columns, their failures and time are
counted under their names."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from ms_exporter import Strategy, TrainingMonitor, TransformersMonitorCallback
from ms_exporter.config import ConfigError, load_config
from ms_exporter.probes.strategies import StrategyProbe, strategy_name
from tests.support.cb_params import context
from tests.support.scrape import scrape
from tests.support.user_strategies import LOSS_TWICE, LossSpreadStrategy

OWN = "tests.support.user_strategies"


def _run(monitor: TrainingMonitor, steps: int = 4) -> None:
    monitor.on_train_begin(context(0, 0.0))
    for step in range(1, steps + 1):
        monitor.on_train_step_end(context(step, float(step)))
    monitor.publish()


def test_a_strategy_is_named_after_its_class() -> None:
    class DataQualityStrategy(Strategy):
        pass

    class Named(Strategy):
        name = "Label Entropy!"

    assert strategy_name(DataQualityStrategy()) == "data_quality"
    assert strategy_name(Named()) == "label_entropy"
    assert strategy_name(LossSpreadStrategy({})) == "loss_spread"


def test_a_strategy_from_yaml_reaches_the_page_and_the_json_lines(tmp_path: Path) -> None:
    monitor = TrainingMonitor(
        port=0,
        web={"cache_seconds": 0},
        backend=["prometheus", "local"],
        save_dir=str(tmp_path),
        interval=0.05,
        strategies=[{"name": f"{OWN}.LossSpreadStrategy", "config": {"scale": 3}}, {"name": f"{OWN}:Doubled"}],
    )
    try:
        _run(monitor)
        page = scrape(monitor.url)
    finally:
        monitor.close()
    assert page.value("mindspore_train_user_loss_spread_scaled_loss") == 12.0  # step 4's loss, times 3
    assert page.value(LOSS_TWICE.name) == 8.0  # a declared family keeps its own name
    assert page.value("mindspore_train_user_doubled_epoch") == 1
    assert not page.find("mindspore_train_user_loss_spread_note")  # not a number: not exported
    assert page.value("mindspore_exporter_errors_total", component="strategy.loss_spread") == 0
    assert page.value("mindspore_exporter_strategy_seconds_total", strategy="doubled") > 0
    records = [json.loads(line) for line in (tmp_path / "metrics-rank0.jsonl").read_text().splitlines()]
    steps = [record for record in records if record["type"] == "step"]
    assert [record["user_loss_spread_scaled_loss"] for record in steps][-2:] == [9.0, 12.0]  # a step column


def test_a_failing_strategy_costs_only_itself() -> None:
    monitor = TrainingMonitor(
        port=0, web={"cache_seconds": 0}, strategies=[{"name": f"{OWN}.AlwaysFailsStrategy"}], warmup_steps=0
    )
    try:
        _run(monitor, steps=6)
        page = scrape(monitor.url)
    finally:
        monitor.close()
    assert page.value("mindspore_exporter_errors_total", component="strategy.always_fails") >= 1
    assert page.value("mindspore_exporter_component_disabled", component="strategy.always_fails") == 1
    assert page.value("mindspore_train_steps_total") == 6 and page.value("mindspore_train_loss") == 6.0


def test_the_article_container_runs_its_strategy_objects() -> None:
    spread = LossSpreadStrategy({"scale": 0.5})
    monitor = TransformersMonitorCallback([spread], {"port": 0, "web": {"cache_seconds": 0}})
    try:
        _run(monitor)
        page = scrape(monitor.url)
    finally:
        monitor.close()
    assert spread.seen == [1, 2, 3, 4]
    assert page.value("mindspore_train_user_loss_spread_scaled_loss") == 2.0
    assert not page.find("mindspore_train_user_loss_spread_lr_seen")  # no optimizer here: metrics["lr"] is None


def test_a_nan_a_strategy_returns_stays_nan() -> None:
    class Nan(Strategy):
        def on_step_end(self, metrics: dict[str, object], cb_params: object) -> dict[str, float]:
            return {"value": math.nan}

    monitor = TransformersMonitorCallback([Nan()], port=0, web={"cache_seconds": 0})
    try:
        _run(monitor, steps=1)
        assert math.isnan(scrape(monitor.url).value("mindspore_train_user_nan_value"))
    finally:
        monitor.close()


def test_every_n_steps_thins_the_calls() -> None:
    spread = LossSpreadStrategy({})
    spread.every_n_steps = 2  # type: ignore[attr-defined]  # the article's classes may carry it too
    monitor = TransformersMonitorCallback([spread], port=0)
    try:
        _run(monitor, steps=5)
    finally:
        monitor.close()
    assert spread.seen == [2, 4]


@pytest.mark.parametrize(
    ("strategies", "message"),
    [
        ([{"name": f"{OWN}.NoSuchStrategy"}], r"strategies: item 0: cannot import 'tests\.support\.user_strategies"),
        ([{"name": "no_such_package.Strategy"}], r"cannot import 'no_such_package\.Strategy' \(ModuleNotFoundError"),
        ([{"name": f"{OWN}.LOSS_TWICE"}], r"is not a class"),
        ([{"name": f"{OWN}.Doubled", "confg": {}}], r"unknown key\(s\) confg; allowed: name, config, every_n_steps"),
        ([{"name": f"{OWN}.Doubled", "config": [1]}], r"`config` must be a mapping"),
        ("Doubled", r"must be a list"),
    ],
)
def test_a_strategy_that_cannot_be_found_is_a_config_error(strategies: object, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        load_config({"strategies": strategies})


def test_a_strategy_whose_constructor_refuses_its_config_is_a_config_error() -> None:
    with pytest.raises(ConfigError, match=r"strategies\[0\]: .*RefusesItsConfig\(config\) failed: ValueError"):
        TrainingMonitor(port=0, strategies=[{"name": f"{OWN}.RefusesItsConfig", "config": {"a": 1}}])


def test_the_container_refuses_what_is_no_strategy() -> None:
    with pytest.raises(ConfigError, match=r"strategies: str has no on_step_end"):
        TransformersMonitorCallback(["LossMonitorStrategy"], port=0)
    with pytest.raises(ConfigError, match=r"must be a list of strategy objects"):
        TransformersMonitorCallback("LossMonitorStrategy", port=0)  # type: ignore[arg-type]


def test_a_probe_needs_on_step_end() -> None:
    with pytest.raises(TypeError, match="no on_step_end"):
        StrategyProbe(object(), None)  # type: ignore[arg-type]
