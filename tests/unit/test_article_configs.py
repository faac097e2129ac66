"""The articles' configuration blocks, verbatim, read as what they mean (ms_exporter/config/article_keys.py);
their real mistakes stay ConfigErrors that name the key the user wrote."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from ms_exporter.config import ConfigError, load_config, read_config

ARTICLES = Path(__file__).resolve().parents[1] / "integration" / "data" / "articles"
FIRST = ARTICLES / "first_article_monitor_config.yaml"
THIRD = ARTICLES / "third_article_monitor_config.yaml"


def test_the_third_articles_block_verbatim() -> None:
    config, notes = read_config(THIRD)
    assert config.backend == ("local", "tensorboard")  # backend: local, and `tensorboard: true`
    assert config.project == "bert-large-wwm-pretrain" and config.interval == 30
    assert config.log_level == "INFO"  # from callback.params
    loss, tokens = config.warn_on_value["loss"], config.warn_on_value["tokens_per_second"]
    assert (loss.direction, loss.value, tokens.direction, tokens.value) == ("max", 50.0, "min", 1000.0)
    assert any("callback.params -> monitor_config" in note for note in notes)
    assert any("tensorboard: true -> backend += tensorboard" in note for note in notes)


def test_the_first_articles_file_verbatim() -> None:
    config, notes = read_config(FIRST)
    assert "local" in config.backend and config.save_dir == "./logs" and config.jsonl_name == "transformers_monitor"
    assert config.hardware.enable
    assert config.loss_window == 50
    assert config.grad_norm.layers == ("encoder.layer.11", "decoder.final_layernorm")
    assert config.grad_norm.threshold == 10.0
    early = config.actions.early_stop
    assert (early.enable, early.patience, early.min_delta, early.unit) == (True, 10, 0.001, "step")
    assert [note.split(": ", 1)[1].split(" ->")[0] for note in notes] == [
        "enable_hardware_monitor",
        "log_path ./logs/transformers_monitor.jsonl",
        "strategies[0] LossMonitorStrategy",
        "strategies[1] GradNormStrategy",
        "strategies[2] EarlyStoppingStrategy",
    ]


@pytest.mark.parametrize(
    ("block", "message"),
    [
        ({"tensorboard": False, "backend": ["tensorboard"]}, r"tensorboard: false, but monitor_config.backend"),
        ({"callback": {"type": "LossMonitor"}}, r"callback\.type: 'LossMonitor' is not a monitor class"),
        ({"callback": {"type": "TrainingMonitor", "args": {}}}, r"callback: unknown key\(s\) args"),
        ({"callback": {"params": {"interval": 5}}, "interval": 30}, r"interval: given both as .*params\.interval"),
        ({"strategies": [{"name": "LossStrategy"}]}, r"item 0: 'LossStrategy' is neither a built-in strategy"),
        (
            {"strategies": [{"name": "GradNormStrategy", "config": {"layers": ["a"]}}]},
            r"strategies\[0\]\.config: unknown key\(s\) layers; allowed: monitor_layers, threshold",
        ),
        ({"log_path": "./a/x.jsonl", "save_dir": "./b"}, r"save_dir: given both as monitor_config\.log_path"),
        ({"enable_hardware_monitor": True, "hardware": {"enable": False}}, r"hardware\.enable: given both"),
        ({"enable_hardware_monitor": "yes please"}, r"monitor_config\.enable_hardware_monitor, read as hardware"),
        (
            {"strategies": [{"name": "GradNormStrategy", "config": {"threshold": -1}}]},
            r"strategies\[0\]\.config\.threshold, read as grad_norm\.threshold",
        ),
    ],
)
def test_a_real_mistake_in_an_articles_form_is_a_config_error(block: dict[str, Any], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        load_config(block)


def test_every_problem_is_listed_at_once() -> None:
    block = {"callback": {"type": "X"}, "strategies": [{"name": "Y"}], "tensorboard": False, "backend": "tensorboard"}
    with pytest.raises(ConfigError) as raised:
        load_config(block)
    assert len(raised.value.problems) == 3, raised.value.problems


def test_a_key_given_both_ways_with_the_same_value_is_fine() -> None:
    config = load_config(
        {"callback": {"type": "MindSporeTransformersMonitor", "params": {"interval": 5}}, "interval": 5}
    )
    assert config.interval == 5
    assert load_config({"tensorboard": True, "backend": ["prometheus", "tensorboard"]}).backend == (
        "prometheus",
        "tensorboard",
    )


def test_the_third_articles_class_name_is_the_monitor_itself() -> None:
    import ms_exporter

    assert ms_exporter.MindSporeTransformersMonitor is ms_exporter.TrainingMonitor
    assert "MindSporeTransformersMonitor" in ms_exporter.__all__


def test_the_first_articles_data_quality_strategy_is_the_data_quality_probe() -> None:
    block = {"strategies": [{"name": "DataQualityStrategy", "config": {"label_column": "label", "streak": 5}}]}
    config, notes = read_config(block)
    assert config.data_quality.enable and config.data_quality.label_column == "label"
    assert config.data_quality.streak == 5 and config.strategies == ()
    assert any("DataQualityStrategy -> data_quality.enable: true" in note for note in notes)
    with pytest.raises(
        ConfigError, match=r"strategies\[0\]\.config: unknown key\(s\) brightness; allowed: label_column"
    ):
        load_config({"strategies": [{"name": "DataQualityStrategy", "config": {"brightness": 1}}]})
