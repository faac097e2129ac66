"""The articles' code, as they write it, does what their readers expect: the strategy-container article's strategy
classes build its container, the monitor_config article's callback.params handed over alone is named, `enable: false`
says so, and the monitor_config article's progress line shows without `backend: console`."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import pytest
import yaml

import ms_exporter
from ms_exporter import (
    ConfigError,
    EarlyStoppingStrategy,
    GradNormStrategy,
    HardwareHealthStrategy,
    LossMonitorStrategy,
    TrainingMonitor,
    TransformersMonitorCallback,
    load_config,
)
from ms_exporter.config import article_keys, article_strategies
from tests.support.cb_params import context

ARTICLES = Path(__file__).resolve().parents[1] / "integration" / "data" / "articles"
FIRST = ARTICLES / "first_article_monitor_config.yaml"
THIRD = ARTICLES / "third_article_monitor_config.yaml"


def _messages(caplog: pytest.LogCaptureFixture, level: int, text: str) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.levelno == level and text in r.getMessage()]


def test_every_builtin_strategy_name_has_a_class_importable_from_ms_exporter() -> None:
    assert {kind.__name__ for kind in article_strategies.CLASSES} == set(article_keys.STRATEGIES)
    for kind in article_strategies.CLASSES:
        assert getattr(ms_exporter, kind.__name__) is kind and kind.__name__ in ms_exporter.__all__


@pytest.mark.parametrize(
    "entry",
    [
        {"name": "LossMonitorStrategy", "config": {"window_size": 50}},
        {"name": "GradNormStrategy", "config": {"monitor_layers": ["encoder.layer.11"], "threshold": 10.0}},
        {"name": "EarlyStoppingStrategy", "config": {"patience": 10, "min_delta": 0.001}},
        {"name": "HardwareHealthStrategy", "config": {}},
        {"name": "DataQualityStrategy", "config": {"label_column": "label", "streak": 5}},
    ],
)
def test_a_strategy_object_means_what_its_yaml_entry_means(entry: dict[str, Any], tmp_path: Path) -> None:
    kind = getattr(ms_exporter, entry["name"])
    from_yaml = load_config({"strategies": [entry], "port": 0, "save_dir": str(tmp_path)})
    monitor = TransformersMonitorCallback([kind(entry["config"])], {"port": 0, "save_dir": str(tmp_path)})
    monitor.close()
    assert monitor.config == from_yaml


def test_the_first_articles_container_code_runs_as_written(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Its section 4.4: the strategies built from the file's own `config` entries, then the container."""
    monkeypatch.chdir(tmp_path)
    config = yaml.safe_load(FIRST.read_text())
    strategies = [
        LossMonitorStrategy(config["strategies"][0]["config"]),
        GradNormStrategy(config["strategies"][1]["config"]),
        EarlyStoppingStrategy(config["strategies"][2]["config"]),
        HardwareHealthStrategy(),
    ]
    monitor = TransformersMonitorCallback(strategies, config, port=0)
    try:
        read = monitor.config
        assert read.loss_window == 50 and read.hardware.enable
        assert read.grad_norm.layers == ("encoder.layer.11", "decoder.final_layernorm")
        assert read.grad_norm.threshold == 10.0
        early = read.actions.early_stop
        assert (early.enable, early.unit, early.patience, early.min_delta) == (True, "step", 10, 0.001)
        assert read.strategies == ()  # no strategy of the user's: none of them is run as a probe
    finally:
        monitor.close()


def test_a_strategy_object_wins_over_the_files_entry_as_the_articles_container_runs_its_objects(
    tmp_path: Path,
) -> None:
    config = yaml.safe_load(FIRST.read_text())
    monitor = TransformersMonitorCallback(
        [LossMonitorStrategy({"window_size": 20})], config, port=0, save_dir=str(tmp_path)
    )
    try:
        assert monitor.config.loss_window == 20
    finally:
        monitor.close()


def test_a_strategy_objects_mistake_is_a_config_error_naming_the_class() -> None:
    with pytest.raises(ConfigError, match=r"GradNormStrategy\.config: unknown key\(s\) layers; allowed: monitor"):
        GradNormStrategy({"layers": ["a"]})
    with pytest.raises(ConfigError, match=r"from GradNormStrategy\.config\.threshold"):
        GradNormStrategy({"threshold": -1})
    with pytest.raises(ConfigError, match=r"LossMonitorStrategy\(config\): must be a mapping"):
        LossMonitorStrategy(50)  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match=r"loss_window: given both by a strategy object \(50\) and as the keyword"):
        TransformersMonitorCallback([LossMonitorStrategy({"window_size": 50})], port=0, loss_window=10)
    with pytest.raises(ConfigError, match=r"loss_window: given both"):
        TransformersMonitorCallback(
            [LossMonitorStrategy({"window_size": 50}), LossMonitorStrategy({"window_size": 10})], port=0
        )


def test_callback_params_alone_warns_naming_the_blocks_keys_and_the_fix(
    caplog: pytest.LogCaptureFixture, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The monitor_config article's build_monitor_callbacks passes cfg["callback"]["params"] only."""
    monkeypatch.chdir(tmp_path)
    caplog.set_level(logging.INFO, logger="ms_exporter")
    block = yaml.safe_load(THIRD.read_text())["monitor_config"]
    TrainingMonitor(block["callback"]["params"], port=0).close()
    warned = _messages(caplog, logging.WARNING, "callback.params alone")
    assert len(warned) == 1, warned
    for named in ("enable", "backend", "project", "interval", "save_dir", "tensorboard", "metrics"):
        assert named in warned[0]
    assert "backend: prometheus" in warned[0] and "interval: 30 s" in warned[0]
    assert "MindSporeTransformersMonitor(cfg)" in warned[0]
    caplog.clear()
    monitor = ms_exporter.MindSporeTransformersMonitor(block, port=0)  # the whole block: read whole, no warning
    monitor.close()
    assert monitor.config.backend == ("local", "tensorboard") and monitor.config.interval == 30
    assert not _messages(caplog, logging.WARNING, "callback.params alone")


@pytest.mark.parametrize(
    ("given", "keywords", "env", "where"),
    [
        ({"enable": False}, {}, None, "enable: false in the settings given"),
        ({"callback": {"params": {"enable": False}}}, {}, None, "enable: false in the settings given"),
        ("FILE", {}, None, "enable: false in "),
        (None, {"enable": False}, None, "keyword argument enable=False"),
        (None, {}, "false", "environment variable MS_EXPORTER_ENABLE"),
    ],
)
def test_enable_false_says_once_that_the_monitor_is_off_and_where(
    given: Any,
    keywords: dict[str, Any],
    env: str | None,
    where: str,
    caplog: pytest.LogCaptureFixture,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    if env is not None:
        monkeypatch.setenv("MS_EXPORTER_ENABLE", env)
    if given == "FILE":
        given = tmp_path / "monitor.yaml"
        given.write_text("monitor_config:\n  enable: false\n")
        where += str(given)
    caplog.set_level(logging.INFO, logger="ms_exporter")
    monitor = TrainingMonitor(given, **keywords)
    monitor.on_train_begin(context(0, 0.0))
    monitor.on_train_step_end(context(1, 2.0))
    monitor.close()
    said = [r.getMessage() for r in caplog.records]
    assert said == [f"ms_exporter: the monitor is off ({where}): it serves, writes and watches nothing"], said
    assert monitor.url is None


def _steps(monitor: TrainingMonitor, count: int = 3) -> None:
    try:
        monitor.on_train_begin(context(0, 0.0))
        for step in range(1, count + 1):
            monitor.on_train_step_end(context(step, 2.5))
            monitor.publish()
    finally:
        monitor.close()


def _lines(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.getMessage().startswith("ms_exporter: step ")]


@pytest.mark.parametrize("backend", [["prometheus"], ["local"], ["prometheus", "tensorboard"]])
def test_the_progress_line_comes_at_the_interval_without_backend_console(
    backend: list[str], caplog: pytest.LogCaptureFixture, tmp_path: Path
) -> None:
    caplog.set_level(logging.INFO, logger="ms_exporter")
    _steps(TrainingMonitor(port=0, backend=backend, interval=3600, save_dir=str(tmp_path)))
    lines = _lines(caplog)
    assert len(lines) == 1, lines  # the first step, then not again within the hour
    assert lines[0].startswith("ms_exporter: step 1 epoch 1 loss 2.5 ")


def test_the_progress_line_comes_once_with_backend_console(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="ms_exporter")
    _steps(TrainingMonitor(port=0, backend=["prometheus", "console"], interval=3600))
    assert len(_lines(caplog)) == 1, _lines(caplog)


def test_no_progress_line_where_log_level_hides_it_or_on_another_rank(
    caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    caplog.set_level(logging.DEBUG, logger="ms_exporter")
    _steps(TrainingMonitor(port=0, interval=3600, log_level="WARNING"))
    monkeypatch.setenv("RANK_ID", "1")
    monkeypatch.setenv("RANK_SIZE", "2")
    caplog.set_level(logging.DEBUG, logger="ms_exporter")
    _steps(TrainingMonitor(port=0, interval=3600))
    assert _lines(caplog) == []


def test_the_third_articles_block_in_a_mindformers_run_yaml_says_where_it_goes(tmp_path: Path) -> None:
    """MindSpore Transformers refuses its monitor_config there before any callback exists (the integration test
    test_mindformers.py shows 1.8 doing so); check-config and the monitor say which keys and where they go."""
    block = yaml.safe_load(THIRD.read_text())["monitor_config"]
    run = tmp_path / "run.yaml"
    run.write_text(yaml.safe_dump({"trainer": {"type": "CausalLanguageModelingTrainer"}, "monitor_config": block}))
    with pytest.raises(ConfigError) as raised:
        load_config(run)
    (problem,) = raised.value.problems
    held = problem.split("holds ", 1)[1].split(", which", 1)[0].split(", ")
    # Every key of the monitor_config article's block: each one of ours, none of MindSpore Transformers' own.
    assert sorted(held) == sorted(block)
    assert f"unexpected key: {held[0]}" in problem and "config: monitor.yaml" in problem
    (tmp_path / "monitor.yaml").write_text(yaml.safe_dump({"monitor_config": block}))
    assert load_config(tmp_path / "monitor.yaml").backend == ("local", "tensorboard")  # where it goes: read whole
    own = {"trainer": {"type": "x"}, "monitor_config": {"monitor_on": True, "step_interval": 2}}
    run.write_text(yaml.safe_dump(own))
    assert load_config(run).grad_norm.every_n_steps == 2  # its own keys stay fine there


def test_a_dict_of_ones_own_with_only_a_log_level_is_no_article_params(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="ms_exporter")
    TrainingMonitor({"log_level": "INFO"}, port=0).close()
    TrainingMonitor({"log_level": "INFO", "warn_on_value": {"loss": 9.0}, "port": 0}).close()
    assert not _messages(caplog, logging.WARNING, "callback.params alone")
