"""MindSpore Transformers' own monitor_config keys, and its run YAML as a config file."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from ms_exporter import mindformers
from ms_exporter.config import ConfigError, load_config, read_config
from ms_exporter.config.mindformers_keys import MINDFORMERS_KEYS, translate

RUN_YAML = Path(__file__).resolve().parents[1] / "integration" / "data" / "mindformers_llama2_tiny.yaml"


def test_overlapping_keys_are_read_as_ours_and_the_rest_named() -> None:
    raw = {
        "step_interval": 5,
        "global_norm_spike_threshold": 30.0,
        "dump_path": "./dump",
        "monitor_on": True,
        "project": "x",
    }
    done = translate(raw)
    assert raw == {"project": "x", "grad_norm": {"every_n_steps": 5, "threshold": 30.0}}
    assert done.read == {
        "step_interval": "grad_norm.every_n_steps",
        "global_norm_spike_threshold": "grad_norm.threshold",
    }
    assert done.left == ["dump_path", "monitor_on"]
    summary = done.summary()
    assert (
        summary is not None and "left to MindSpore Transformers' TrainingStateMonitor: dump_path, monitor_on" in summary
    )


def test_our_own_key_wins_over_its_counterpart() -> None:
    config, notes = read_config({"monitor_config": {"step_interval": 5, "grad_norm": {"every_n_steps": 7}}})
    assert config.grad_norm.every_n_steps == 7
    assert notes == [
        "monitor_config: MindSpore Transformers keys not read, ms_exporter's own key is set: "
        "step_interval (grad_norm.every_n_steps) (docs/mindformers.md)"
    ]


def test_a_block_without_its_keys_says_nothing() -> None:
    assert read_config({"project": "x"})[1] == []
    assert translate({"grad_norm": {"every_n_steps": 3}}).summary() is None


def test_a_read_key_is_checked_under_our_name() -> None:
    with pytest.raises(ConfigError) as error:
        load_config({"step_interval": 0})
    assert any(
        p.startswith("monitor_config.grad_norm.every_n_steps:")
        and p.endswith("(from monitor_config.step_interval, MindSpore Transformers' key read as ours)")
        for p in error.value.problems
    ), error.value.problems


def test_keywords_still_win_over_the_block(tmp_path: Path) -> None:
    path = tmp_path / "run.yaml"
    path.write_text(
        yaml.safe_dump(
            {
                "trainer": {"type": "CausalLanguageModelingTrainer"},
                "monitor_config": {"monitor_on": True, "step_interval": 4},
            }
        )
    )
    assert load_config(path).grad_norm.every_n_steps == 4
    assert load_config(path, grad_norm={"every_n_steps": 9}).grad_norm.every_n_steps == 9


def test_a_run_yaml_is_read_for_its_monitor_config_alone() -> None:
    config, notes = read_config(RUN_YAML)
    assert config.grad_norm.every_n_steps == 1 and config.grad_norm.threshold == 50.0
    assert len(notes) == 1 and "monitor_on, check_for_global_norm" in notes[0]


def test_a_run_yaml_without_a_block_gives_the_defaults(tmp_path: Path) -> None:
    path = tmp_path / "run.yaml"
    path.write_text(yaml.safe_dump({"trainer": {"type": "x"}, "runner_config": {"epochs": 1}}))
    assert load_config(path) == load_config(None)


def test_other_top_level_keys_are_still_a_mistake_elsewhere(tmp_path: Path) -> None:
    path = tmp_path / "monitor.yaml"
    path.write_text(yaml.safe_dump({"monitor_config": {"port": 0}, "model": {"hidden_size": 4}}))
    with pytest.raises(ConfigError, match=r"only the top-level key monitor_config is read; unexpected \['model'\]"):
        load_config(path)


def test_the_table_keys_are_not_ours() -> None:
    """A key of both vocabularies would be taken away from us."""
    ours = set(load_config(None).to_dict())
    assert MINDFORMERS_KEYS.isdisjoint(ours)


def test_check_config_prints_what_was_read(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "ms_exporter", "check-config", str(RUN_YAML)], capture_output=True, text=True, check=True
    )
    assert "# monitor_config: MindSpore Transformers keys read as ms_exporter's: step_interval" in done.stdout


def test_registration_matches_what_is_installed() -> None:
    """Without MindSpore Transformers nothing is registered; with it (the second venv), its registry builds ours."""
    if not mindformers.available():
        assert mindformers.register() is False
        return
    from mindformers.tools.register import MindFormerModuleType, MindFormerRegister

    from ms_exporter.monitor.callback import TrainingMonitor

    assert mindformers.register() is True
    assert MindFormerRegister.get_cls(MindFormerModuleType.CALLBACK, "TrainingMonitor") is TrainingMonitor


def test_the_register_path_holds_the_file_run_mindformer_loads() -> None:
    done = subprocess.run([sys.executable, "-m", "ms_exporter.mindformers"], capture_output=True, text=True, check=True)
    assert (Path(done.stdout.strip()) / "ms_exporter_callback.py").is_file()


def build_like_mindformers(entry: dict[str, Any]) -> Any:
    """MindSpore Transformers' registry when it is installed (the second venv), else what it does: build the class from
    the entry's keys and re-raise what construction raised as `type(e)(f"{cls.__name__}: {e}")` (its register.py)."""
    from ms_exporter.monitor.callback import TrainingMonitor

    if mindformers.available():
        from mindformers.tools.register import MindFormerModuleType, MindFormerRegister

        assert mindformers.register() is True
        return MindFormerRegister.get_instance_from_cfg(dict(entry), MindFormerModuleType.CALLBACK)
    arguments = {key: value for key, value in entry.items() if key != "type"}
    try:
        return TrainingMonitor(**arguments)
    except Exception as e:  # as MindSpore Transformers' registry does
        raise type(e)(f"{TrainingMonitor.__name__}: {e}") from None


def test_a_config_error_through_the_registry_names_each_problem_and_the_key_written() -> None:
    entry = {
        "type": "TrainingMonitor",
        "port": -1,
        "config": {"step_interval": 5, "global_norm_spike_threshold": -1, "dump_path": "./dump"},
    }
    with pytest.raises(ConfigError) as raised:
        build_like_mindformers(entry)
    error = raised.value
    assert str(error).startswith("TrainingMonitor: invalid monitor_config (2 problem(s)):\n  - "), str(error)
    (threshold,) = [p for p in error.problems if p.startswith("monitor_config.grad_norm.threshold:")]
    assert threshold.endswith(
        "(from monitor_config.global_norm_spike_threshold, MindSpore Transformers' key read as ours)"
    ), threshold
    (port,) = [p for p in error.problems if p.startswith("monitor_config.port:")]
    assert port.endswith("(from keyword argument port=)")


def test_each_read_key_is_named_for_its_own_value() -> None:
    with pytest.raises(ConfigError) as raised:
        load_config({"step_interval": 0, "global_norm_spike_threshold": 0, "grad_norm": {"top_k": 3}})
    assert sorted(raised.value.problems) == [
        "monitor_config.grad_norm.every_n_steps: must be an integer from 1 to 1000000, got 0 (from "
        "monitor_config.step_interval, MindSpore Transformers' key read as ours)",
        "monitor_config.grad_norm.threshold: must be a number greater than 0 and at most 1e+12, got 0 (from "
        "monitor_config.global_norm_spike_threshold, MindSpore Transformers' key read as ours)",
    ]
    # A later source that sets the key itself is named instead.
    with pytest.raises(ConfigError) as raised:
        load_config({"global_norm_spike_threshold": 2}, grad_norm={"threshold": -1})
    assert raised.value.problems[0].endswith("(from keyword argument grad_norm=)")
