"""A user's own strategies (probes/strategies.py): from YAML by import path, or handed to
TransformersMonitorCallback as objects; their numbers become gauges and step columns, their failures and time are
counted under their names."""

from __future__ import annotations

import asyncio
import json
import math
import os
import signal
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from ms_exporter import Strategy, TrainingMonitor, TransformersMonitorCallback
from ms_exporter.config import ConfigError, load_config
from ms_exporter.core.catalogue import MetricFamily
from ms_exporter.probes.strategies import MAX_KEY_LENGTH, MAX_KEYS, StrategyProbe, strategy_name
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
    # The strategy-container article's classes may carry it too.
    spread.every_n_steps = 2  # type: ignore[attr-defined]
    monitor = TransformersMonitorCallback([spread], port=0)
    try:
        _run(monitor, steps=5)
    finally:
        monitor.close()
    assert spread.seen == [2, 4]


@pytest.mark.parametrize(
    ("strategies", "message"),
    [
        ([{"name": f"{OWN}.NoSuchStrategy"}], r"strategies: item 0: '.*NoSuchStrategy': .* has no 'NoSuchStrategy'"),
        (
            [{"name": "no_such_package.Strategy"}],
            r"'no_such_package\.Strategy': cannot import no_such_package",
        ),
        (
            [{"name": f"{OWN}.LOSS_TWICE"}],
            r"MetricFamily 'LOSS_TWICE' of tests\.support\.user_strategies is not",
        ),
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
    with pytest.raises(ConfigError, match="no on_step_end"):
        StrategyProbe(object(), None)  # type: ignore[arg-type]


# -- what an import path may name, and what construction may raise ---------------------------------------------------

ADVERSARY = "benchmarks.adversary_strategies"


@pytest.mark.parametrize(
    ("name", "message"),
    [
        ("subprocess.Popen", r"class Popen has no on_step_end\(\)"),
        ("os.system", r"builtin_function_or_method 'system' of os is not a class"),
        (f"{OWN}.Strategy", r"Strategy is defined in ms_exporter\.probes\.strategies, not in tests\.support"),
    ],
)
def test_an_import_path_must_name_a_strategy_class_of_its_own_package(name: str, message: str, tmp_path: Path) -> None:
    pwned = tmp_path / "pwned"
    strategies = [{"name": name, "config": {"touch": 0, str(pwned): 0}}]  # Popen({...}) would run `touch pwned`
    with pytest.raises(ConfigError, match=message):
        load_config({"strategies": strategies})
    with pytest.raises(ConfigError, match=message):
        TrainingMonitor(port=0, strategies=strategies)
    assert not pwned.exists()


def test_a_module_that_exits_at_import_is_a_config_error_and_prints_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "argv_script.py").write_text(
        "import argparse\n"
        "parser = argparse.ArgumentParser()\n"
        "parser.add_argument('--epochs', required=True)\n"
        "parser.parse_args()\n"
        "class Own:\n"
        "    def on_step_end(self, metrics, cb_params):\n"
        "        return None\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(ConfigError, match=r"import argv_script \(SystemExit: 2; it printed .*--epochs.*is a script"):
        load_config({"strategies": [{"name": "argv_script.Own"}]})
    printed = capsys.readouterr()
    assert "usage:" not in printed.out + printed.err


@pytest.mark.parametrize(
    ("name", "message"),
    [
        ("NanEvery", r"NanEvery\.every_n_steps must be a whole number of steps from 1 to \d+, got nan"),
        ("ExitsInInit", r"ExitsInInit\(config\) failed: SystemExit: 2"),
        ("InterruptedInInit", r"InterruptedInInit\(config\) failed: KeyboardInterrupt"),
    ],
)
def test_a_strategy_class_that_breaks_at_construction_is_a_config_error(name: str, message: str) -> None:
    with pytest.raises(ConfigError, match=rf"strategies\[0\]: .*{message}"):
        TrainingMonitor(port=0, strategies=[{"name": f"{ADVERSARY}.{name}"}])


@pytest.mark.parametrize("every", [math.nan, math.inf, 0, -3, 2.5, "10", True, None])
def test_every_n_steps_must_be_a_whole_number_of_steps(every: object) -> None:
    spread = LossSpreadStrategy({})
    spread.every_n_steps = every  # type: ignore[attr-defined]
    if every is None:  # not set: every step
        TransformersMonitorCallback([spread], port=0).close()
        return
    with pytest.raises(ConfigError, match=r"every_n_steps must be a whole number of steps"):
        TransformersMonitorCallback([spread], port=0)


def test_a_strategy_class_attribute_that_raises_is_a_config_error() -> None:
    class Hostile(Strategy):
        @property
        def families(self) -> tuple[MetricFamily, ...]:  # type: ignore[override]
            raise SystemExit(1)

    with pytest.raises(ConfigError, match=r"Hostile cannot be read: SystemExit"):
        TransformersMonitorCallback([Hostile()], port=0)


# -- numbers only, and a bounded number of keys --------------------------------------------------------------------


def test_text_and_numbers_beyond_a_float_are_dropped_and_the_strategy_stays_on() -> None:
    class Mixed(Strategy):
        def on_step_end(self, metrics: dict[str, object], cb_params: object) -> dict[str, object]:
            return {
                "count": metrics["step"],
                "text": "1.5",
                "raw": b"2",
                "huge": 10**400,
                "words": np.array("3.5"),
                "complex": 1j,
                "flag": True,
                "small": np.int64(7),
            }

    monitor = TransformersMonitorCallback([Mixed()], port=0, web={"cache_seconds": 0}, warmup_steps=0)
    try:
        _run(monitor, steps=6)
        page = scrape(monitor.url)
    finally:
        monitor.close()
    assert page.value("mindspore_train_user_mixed_count") == 6  # still on after six steps of odd values
    assert page.value("mindspore_train_user_mixed_flag") == 1 and page.value("mindspore_train_user_mixed_small") == 7
    for dropped in ("text", "raw", "huge", "words", "complex"):
        assert not page.find(f"mindspore_train_user_mixed_{dropped}")
    assert page.value("mindspore_exporter_strategy_dropped_total", strategy="mixed", reason="value") == 6 * 5
    assert page.value("mindspore_exporter_errors_total", component="strategy.mixed") == 0


def test_a_strategy_whose_keys_change_gets_at_most_max_keys_series_and_columns(tmp_path: Path) -> None:
    class Changing(Strategy):
        families = (LOSS_TWICE,)

        def on_step_end(self, metrics: dict[str, object], cb_params: object) -> dict[str, object]:
            step = metrics["step"]
            return {
                "steady": step,
                **{f"key_{step}_{index}": index for index in range(20)},
                LOSS_TWICE.name: 2 * float(step),  # declared: always exported, whatever the bound
                "x" * (MAX_KEY_LENGTH + 1): 1,
            }

    monitor = TransformersMonitorCallback(
        [Changing()],
        port=0,
        web={"cache_seconds": 0},
        backend=["prometheus", "local"],
        save_dir=str(tmp_path),
        interval=0.05,
    )
    try:
        _run(monitor, steps=10)
        page = scrape(monitor.url)
    finally:
        monitor.close()
    own = [sample for sample in page.samples if sample.name.startswith("mindspore_train_user_changing_")]
    assert len(own) == MAX_KEYS
    assert page.value("mindspore_train_user_changing_steady") == 10  # the first key keeps its place
    assert page.value(LOSS_TWICE.name) == 20.0
    dropped = page.value("mindspore_exporter_strategy_dropped_total", strategy="changing", reason="keys")
    assert dropped == 10 * 21 - (MAX_KEYS - 1)  # every key past the bound, each time it is returned
    records = [json.loads(line) for line in (tmp_path / "metrics-rank0.jsonl").read_text().splitlines()]
    columns = {key for record in records if record["type"] == "step" for key in record if key.startswith("user_")}
    assert len(columns) == MAX_KEYS


# -- BaseExceptions: a strategy's own are its failure, a signal's reach the training ---------------------------------


class _Interrupting:
    def __float__(self) -> float:
        raise KeyboardInterrupt


def test_base_exceptions_a_strategy_raises_are_its_failures_and_close_raises_nothing() -> None:
    class Cancelled(Strategy):
        def on_step_end(self, metrics: dict[str, object], cb_params: object) -> None:
            raise asyncio.CancelledError

    class Exits(Strategy):
        def on_train_begin(self, cb_params: object) -> None:
            sys.exit(3)

        def on_train_end(self, cb_params: object) -> None:
            raise SystemExit(4)

    class FloatInterrupts(Strategy):
        def on_step_end(self, metrics: dict[str, object], cb_params: object) -> dict[str, object]:
            return {"value": _Interrupting()}

    monitor = TransformersMonitorCallback(
        [Cancelled(), Exits(), FloatInterrupts()], port=0, web={"cache_seconds": 0}, warmup_steps=0
    )
    try:
        _run(monitor, steps=4)
        for step in range(5, 9):  # records left for close() to publish
            monitor.on_train_step_end(context(step, float(step)))
        monitor.on_train_end(context(8, 8.0))
        page = scrape(monitor.url)
    finally:
        monitor.close()  # publishes what is pending through the strategies: must raise nothing
    for name in ("cancelled", "float_interrupts"):
        assert page.value("mindspore_exporter_errors_total", component=f"strategy.{name}") >= 3
        assert page.value("mindspore_exporter_component_disabled", component=f"strategy.{name}") == 1
    assert page.value("mindspore_exporter_errors_total", component="strategy.exits") == 2  # train begin and end
    assert page.value("mindspore_train_steps_total") == 8


def test_a_ctrl_c_while_a_strategy_runs_reaches_the_training() -> None:
    class PressesCtrlC(Strategy):
        finished = False

        def on_step_end(self, metrics: dict[str, object], cb_params: object) -> None:
            if metrics["step"] == 2:
                os.kill(os.getpid(), signal.SIGINT)  # a real SIGINT: Python runs its handler at the next bytecode
                deadline = time.monotonic() + 30
                while time.monotonic() < deadline:
                    sum(range(100))
                self.finished = True

    presses = PressesCtrlC()
    monitor = TransformersMonitorCallback([presses], port=0)  # prometheus: the relay fronts SIGINT
    try:
        monitor.on_train_begin(context(0, 0.0))
        monitor.on_train_step_end(context(1, 1.0))
        monitor.on_train_step_end(context(2, 2.0))
        with pytest.raises(KeyboardInterrupt):
            monitor.publish()
        assert not presses.finished  # interrupted inside the strategy, not waited out
    finally:
        monitor.close()


def test_a_keyboard_interrupt_is_passed_on_when_no_signal_record_can_tell() -> None:
    class Interrupts(Strategy):
        def on_step_end(self, metrics: dict[str, object], cb_params: object) -> None:
            raise KeyboardInterrupt

    monitor = TransformersMonitorCallback([Interrupts()], port=0)
    previous = signal.getsignal(signal.SIGINT)
    try:
        monitor.on_train_begin(context(0, 0.0))
        monitor.on_train_step_end(context(1, 1.0))
        monitor.publish()  # the relay fronts every handler: the strategy's own, absorbed
        signal.signal(signal.SIGINT, lambda signum, frame: None)  # a handler of the script's that does not chain
        monitor.on_train_step_end(context(2, 2.0))
        with pytest.raises(KeyboardInterrupt):  # it might be this handler's: passed on, never swallowed
            monitor.publish()
    finally:
        signal.signal(signal.SIGINT, previous)
        monitor.close()


def test_the_docs_state_the_bounds_the_code_holds() -> None:
    text = (Path(__file__).resolve().parents[2] / "docs" / "strategies.md").read_text(encoding="utf-8")
    assert f"the first {MAX_KEYS} keys of its own" in text
    assert f"each at\nmost {MAX_KEY_LENGTH} characters" in text
