"""A user's strategy given by import path in YAML, in a real training: on /metrics, in JSON Lines and in TensorBoard
(read back with TensorBoard's EventAccumulator); one that raises at every step leaves the training and the other
probes untouched and is counted. The adversary cases of `make reliability` (benchmarks/adversary_strategies.py) run
here too: BaseExceptions out of strategies, a real Ctrl-C while one computes, import paths that name a script or a
command, and a strategy whose keys change every step."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from benchmarks import adversary_strategies
from ms_exporter.core.catalogue import STEPS as STEPS_TOTAL
from ms_exporter.probes.strategies import MAX_KEYS
from tests.support.writer_runs import STEPS, train

pytestmark = pytest.mark.integration
OWN = "tests.support.user_strategies"


def test_a_strategy_by_import_path_reaches_every_sink_and_a_failing_one_costs_nothing(tmp_path: Path) -> None:
    config = tmp_path / "monitor.yaml"
    config.write_text(
        yaml.safe_dump(
            {
                "monitor_config": {
                    "backend": ["prometheus", "local", "tensorboard"],
                    "save_dir": str(tmp_path / "out"),
                    "port": 0,
                    "interval": 1,
                    "strategies": [
                        {"name": f"{OWN}.LossSpreadStrategy", "config": {"scale": 2.0}},
                        {"name": f"{OWN}.AlwaysFailsStrategy"},
                    ],
                }
            }
        )
    )
    monitor = train(str(config))
    records = [json.loads(line) for line in (tmp_path / "out" / "metrics-rank0.jsonl").read_text().splitlines()]
    steps = {record["step"]: record for record in records if record["type"] == "step"}
    assert sorted(steps) == list(range(1, STEPS + 1))  # every step trained, every step recorded
    for record in steps.values():
        assert record["user_loss_spread_scaled_loss"] == pytest.approx(2 * record["loss"])
    reader = EventAccumulator(str(tmp_path / "out" / "tensorboard" / "default" / "rank0"), size_guidance={"scalars": 0})
    reader.Reload()
    scaled = {event.step: event.value for event in reader.Scalars("user_loss_spread_scaled_loss")}
    assert sorted(scaled) == list(range(1, STEPS + 1))
    assert scaled[STEPS] == pytest.approx(2 * steps[STEPS]["loss"], rel=1e-6)
    snapshot = [record for record in records if record["type"] == "snapshot"][-1]["metrics"]
    errors = "mindspore_exporter_errors_total{component=%s}"
    assert snapshot[errors % '"strategy.always_fails"'] >= 1  # counted, then switched off
    assert snapshot[errors % '"strategy.loss_spread"'] == 0
    assert monitor.store.value_of(STEPS_TOTAL) == STEPS  # the built-in probes went on


# -- the adversary cases (benchmarks/adversary_strategies.py), played for real --------------------------------------


def test_base_exceptions_from_strategies_cost_only_the_strategies_in_a_real_training(tmp_path: Path) -> None:
    facts = adversary_strategies.run_base_exceptions(tmp_path)
    assert adversary_strategies.holds_base_exceptions(facts), facts
    assert facts["counted"]["exits_at_train_begin"] == 1 and facts["counted"]["exits_at_train_end"] == 1
    assert set(facts["disabled"]) >= {"strategy.cancelled_from_step", "strategy.float_interrupts_from_step"}


def test_a_ctrl_c_while_a_strategy_computes_still_stops_the_training(tmp_path: Path) -> None:
    facts = adversary_strategies.run_ctrl_c(tmp_path)
    assert adversary_strategies.holds_ctrl_c(facts), facts


def test_import_paths_are_checked_without_running_a_script_or_a_command(tmp_path: Path) -> None:
    facts = adversary_strategies.run_construction(tmp_path)
    assert adversary_strategies.holds_construction(facts), facts


def test_a_strategy_whose_keys_change_stays_within_its_bound_of_series(tmp_path: Path) -> None:
    facts = adversary_strategies.run_keys(tmp_path)
    assert adversary_strategies.holds_keys(facts), facts
    assert facts["series"] == MAX_KEYS and facts["columns"] == MAX_KEYS  # the steady key and the first 31 new ones
    steps = adversary_strategies.KEYS_STEPS
    assert facts["dropped"]["value"] == 2 * steps  # the text and 10**400, every step
    new_keys = adversary_strategies.NEW_KEYS_PER_STEP * steps
    assert facts["dropped"]["keys"] == new_keys - (MAX_KEYS - 1)
