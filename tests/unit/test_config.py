"""The monitor_config loader: every pinned key, the sources and their precedence, and every error path."""

from __future__ import annotations

import dataclasses
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from ms_exporter import ConfigError, MonitorConfig, load_config
from ms_exporter.config import (
    ACTION_SECTIONS,
    DEFAULT_PORT,
    MAX_FLOPS,
    METRIC_GROUPS,
    SECTIONS,
    Bound,
    FlopsModelConfig,
    _Bad,
    at_least,
    between,
    choice,
    greater_than,
    int_in,
    names,
    optional,
    regexes,
    text,
    url,
)
from ms_exporter.core.compat import zip_strict
from tests.support.config_fields import leaves

PINNED_EXAMPLE = """
monitor_config:
  enable: true
  backend: [prometheus, local]
  project: bert-large-wwm-pretrain
  interval: 30
  save_dir: ./monitor_output
  port: 19500
  bind_address: 127.0.0.1
  metrics: [loss, lr, tokens_per_second, memory_usage, global_rank]
  loss_window: 50
  warn_on_value: {loss: 50.0, tokens_per_second: 1000}
  tags: {dataset: wiki-v3, model_size: 340M}
  log_level: INFO
"""


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "monitor.yaml"
    path.write_text(text)
    return path


def test_pinned_example_loads_every_key(tmp_path: Path) -> None:
    config = load_config(write(tmp_path, PINNED_EXAMPLE))
    assert config.enable is True
    assert config.backend == ("prometheus", "local")
    assert config.project == "bert-large-wwm-pretrain"
    assert config.interval == 30.0
    assert config.save_dir == "./monitor_output"
    assert config.port == 19500
    assert config.bind_address == "127.0.0.1"
    assert config.metrics == ("loss", "lr", "tokens_per_second", "memory_usage", "global_rank")
    assert config.loss_window == 50
    # A bare number is an upper bound for loss and a lower bound for throughput.
    assert config.warn_on_value == {"loss": Bound("max", 50.0), "tokens_per_second": Bound("min", 1000.0)}
    assert config.tags == {"dataset": "wiki-v3", "model_size": "340M"}
    assert config.log_level == "INFO"


def test_defaults_and_bare_mapping(tmp_path: Path) -> None:
    assert load_config(None) == MonitorConfig()
    assert load_config(None).port == DEFAULT_PORT
    assert load_config(None).metrics == METRIC_GROUPS
    bare = load_config(write(tmp_path, "project: x\nport: 0\n"))
    assert (bare.project, bare.port) == ("x", 0)
    assert load_config(write(tmp_path, "")) == MonitorConfig()


def test_single_string_backend_and_explicit_bounds() -> None:
    bounds = {"loss": {"min": 0.001}, "samples_per_second": {"max": 5}}
    config = load_config({"backend": "local", "warn_on_value": bounds})
    assert config.backend == ("local",)
    assert config.warn_on_value["loss"] == Bound("min", 0.001)
    assert config.warn_on_value["samples_per_second"] == Bound("max", 5.0)


def test_precedence_file_env_keyword(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = write(tmp_path, "monitor_config: {port: 19500, project: from-file, interval: 5}")
    monkeypatch.setenv("MS_EXPORTER_PORT", "19600")
    monkeypatch.setenv("MS_EXPORTER_PROJECT", "from-env")
    monkeypatch.setenv("MS_EXPORTER_BACKEND", "prometheus,local")
    monkeypatch.setenv("MS_EXPORTER_WARN_ON_VALUE", "{loss: 7}")
    monkeypatch.setenv("MS_EXPORTER_ENABLE", "false")
    config = load_config(path, project="from-keyword")
    assert config.port == 19600  # env beats the file
    assert config.project == "from-keyword"  # keywords beat env
    assert config.interval == 5.0  # untouched file value stays
    assert config.backend == ("prometheus", "local")
    assert config.warn_on_value == {"loss": Bound("max", 7.0)}
    assert config.enable is False


def test_env_strings_stay_strings(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MS_EXPORTER_PROJECT", "1e3")
    assert load_config(None).project == "1e3"


def test_every_problem_is_reported_at_once() -> None:
    with pytest.raises(ConfigError) as info:
        load_config(
            {
                "prot": 1,
                "port": -1,
                "interval": "soon",
                "backend": ["prometheus", "grafana"],
                "metrics": ["loss", "los"],
                "loss_window": 0,
                "log_level": "LOUD",
                "enable": "yes",
                "bind_address": "my host",
                "warn_on_value": {"accuracy": 1},
                "tags": {"rank": "0"},
            }
        )
    problems = info.value.problems
    text = str(info.value)
    assert len(problems) == 11, problems
    assert "prot: unknown key" in text and "did you mean 'port'" in text
    assert "port: must be an integer from 0 to 65535, got -1" in text
    assert "interval: must be a number of at least 0.05" in text
    assert "'grafana'" in text and "allowed: ['prometheus', 'otlp', 'local', 'tensorboard', 'wandb', 'console']" in text
    assert "'los' (did you mean 'loss'?)" in text
    assert "loss_window: must be an integer from 1" in text
    assert "log_level: must be one of" in text
    assert "enable: must be true or false" in text
    assert "bind_address: must be an IP address" in text
    assert "unknown metric 'accuracy'" in text
    assert "tag name 'rank' is set by the exporter itself" in text


@pytest.mark.parametrize(
    ("raw", "fragment"),
    [
        ({"port": True}, "port: must be an integer"),
        ({"port": 65535}, "leaves no room for base + local rank"),
        ({"interval": 0}, "interval: must be a number of at least 0.05"),
        ({"interval": float("nan")}, "interval: must be a number of at least 0.05"),
        ({"project": ""}, "project: must be a non-empty string"),
        ({"project": "x" * 200}, "at most 128 characters"),
        ({"save_dir": 3}, "save_dir: must be a non-empty path"),
        ({"backend": []}, "needs at least one of"),
        ({"otlp": {"protocol": "udp"}}, "otlp.protocol: must be one of ['grpc', 'http/protobuf']"),
        ({"otlp": {"endpoint": "collector:4317"}}, "otlp.endpoint: must be a URL"),
        ({"otlp": {"timeout": 0}}, "otlp.timeout: must be a number greater than 0"),
        ({"otlp": {"insecure": "no"}}, "otlp.insecure: must be true or false"),
        ({"otlp": {"endpont": "http://c:4317"}}, "did you mean 'endpoint'"),
        ({"pushgateway": {"url": "pushgateway:9091"}}, "pushgateway.url: must be a URL"),
        ({"pushgateway": {"on": ["train_end", "every_step"]}}, "unknown name(s) 'every_step'"),
        ({"pushgateway": {"interval": -1}}, "pushgateway.interval: must be a number of at least 0.1"),
        ({"metrics": "loss,lr"}, "unknown name(s)"),
        ({"warn_on_value": [1]}, "must be a mapping of metric to bound"),
        ({"warn_on_value": {"loss": "high"}}, "bound for 'loss' must be a number"),
        ({"warn_on_value": {"loss": {"above": 3}}}, "bound for 'loss' must be a number"),
        ({"warn_on_value": {"tokens_per_second": 10}, "metrics": ["loss"]}, "add 'tokens_per_second' to"),
        ({"tags": {"9bad": "x"}}, "not a valid Prometheus label name"),
        ({"tags": {"ok": ["list"]}}, "must be a string or number"),
        ({"max_files": 0}, "max_files: must be an integer from 1"),
        ({"max_file_mb": -1}, "max_file_mb: must be a number greater than 0"),
        ({"warmup_steps": -1}, "warmup_steps: must be an integer from 0 to 1000000000000"),
    ],
)
def test_each_error_path(raw: dict, fragment: str) -> None:
    with pytest.raises(ConfigError) as info:
        load_config(raw)
    assert fragment in str(info.value)


def test_file_errors_are_config_errors(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="cannot read config file"):
        load_config(tmp_path / "missing.yaml")
    with pytest.raises(ConfigError, match="not valid YAML"):
        load_config(write(tmp_path, "monitor_config: [unclosed"))
    with pytest.raises(ConfigError, match="monitor_config must be a mapping"):
        load_config(write(tmp_path, "monitor_config: 3"))
    with pytest.raises(ConfigError, match="expected a mapping"):
        load_config(write(tmp_path, "- a\n- b\n"))
    latin1 = tmp_path / "latin1.yaml"
    latin1.write_bytes("monitor_config: {project: caf\u00e9}\n".encode("latin-1"))
    with pytest.raises(ConfigError, match="cannot read config file .*utf-8"):
        load_config(latin1)
    with pytest.raises(ConfigError, match="web.config_file: must be a path without control characters"):
        load_config({"web": {"config_file": "web\x00.yml"}})  # found by the fuzz test: a NUL byte in the path
    with pytest.raises(ConfigError, match="web.config_file: cannot read"):
        load_config({"web": {"config_file": str(tmp_path / "missing-web.yml")}})


def test_env_error_names_the_variable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MS_EXPORTER_PORT", "eighty")
    with pytest.raises(ConfigError, match="MS_EXPORTER_PORT"):
        load_config(None)


def test_otlp_and_pushgateway_sections() -> None:
    config = load_config(
        {
            "backend": ["prometheus", "otlp"],
            "otlp": {
                "endpoint": "http://collector:4317",
                "protocol": "grpc",
                "interval": 5,
                "headers": "authorization=Bearer abc, x-tenant=ml",
            },
            "pushgateway": {"url": "http://pushgateway:9091", "on": ["train_end", "interval"]},
        }
    )
    assert config.backend == ("prometheus", "otlp")
    assert config.otlp.headers == {"authorization": "Bearer abc", "x-tenant": "ml"}
    assert config.otlp.interval == 5.0 and config.otlp.insecure is None
    assert config.pushgateway.on == ("train_end", "interval") and config.pushgateway.job == "mindspore_training"
    assert load_config(config.to_dict()) == config


def test_secrets_never_printed(tmp_path: Path) -> None:
    config = load_config({"otlp": {"headers": {"authorization": "Bearer s3cret"}}})
    assert "s3cret" not in repr(config.redacted())
    with pytest.raises(ConfigError) as info:
        load_config({"otlp": {"headers": {"authorization": ["s3cret"]}}})
    assert "s3cret" not in str(info.value) and "otlp.headers" in str(info.value)
    path = write(tmp_path, "monitor_config:\n  otlp:\n    headers: {authorization: Bearer s3cret}\n")
    run = subprocess.run(
        [sys.executable, "-m", "ms_exporter", "check-config", str(path)], capture_output=True, text=True, check=False
    )
    assert run.returncode == 0, run.stderr
    assert "s3cret" not in run.stdout and "authorization: <redacted>" in run.stdout


def test_sections_from_environment_merge_per_key(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MS_EXPORTER_PUSHGATEWAY", "{url: 'http://pg:9091'}")
    config = load_config({"pushgateway": {"on": ["interval"], "interval": 2}})
    assert config.pushgateway.url == "http://pg:9091" and config.pushgateway.on == ("interval",)


def test_config_round_trips_through_its_dict() -> None:
    config = load_config({"warn_on_value": {"loss": 3, "tokens_per_second": 5}, "tags": {"a": 1}})
    assert load_config(config.to_dict()) == config
    assert load_config(config) == config


def test_check_config_cli(tmp_path: Path) -> None:
    good = write(tmp_path, PINNED_EXAMPLE)
    run = subprocess.run(
        [sys.executable, "-m", "ms_exporter", "check-config", str(good)], capture_output=True, text=True, check=False
    )
    assert run.returncode == 0, run.stderr
    printed = yaml.safe_load(run.stdout)["monitor_config"]
    assert printed["project"] == "bert-large-wwm-pretrain"
    assert printed["warn_on_value"] == {"loss": {"max": 50.0}, "tokens_per_second": {"min": 1000.0}}
    bad = tmp_path / "bad.yaml"
    bad.write_text("monitor_config: {port: -5, colour: red}")
    run = subprocess.run(
        [sys.executable, "-m", "ms_exporter", "check-config", str(bad)], capture_output=True, text=True, check=False
    )
    assert run.returncode == 1
    assert "port: must be an integer" in run.stderr and "colour: unknown key" in run.stderr


def test_gradient_sections_defaults_merge_and_errors(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from ms_exporter.config import GradNormConfig, LayerNormConfig

    assert load_config(None).grad_norm == GradNormConfig()
    assert load_config(None).layernorm == LayerNormConfig(window=100, drift_threshold=0.3)
    path = write(
        tmp_path,
        "monitor_config:\n  grad_norm: {layers: ['encoder.layers.11.*'], clip: 1.0}\n"
        "  layernorm: {window: 20}\n  weight_norm: true\n",
    )
    monkeypatch.setenv("MS_EXPORTER_GRAD_NORM", "{every_n_steps: 5}")
    config = load_config(path, layernorm={"drift_threshold": None})
    assert config.grad_norm.layers == ("encoder.layers.11.*",)  # the file's sub-key survives the env's
    assert config.grad_norm.every_n_steps == 5 and config.grad_norm.clip == 1.0
    assert config.layernorm == LayerNormConfig(window=20, drift_threshold=None)
    assert config.weight_norm is True
    assert set(config.all_bounds()) == {"grad_norm"}  # drift threshold switched off
    monkeypatch.delenv("MS_EXPORTER_GRAD_NORM")
    with pytest.raises(ConfigError) as info:
        load_config(
            {
                "grad_norm": {"evry_n_steps": 2, "layers": ["("], "top_k": -1, "threshold": 0},
                "layernorm": "on",
                "weight_norm": 1,
            }
        )
    text = str(info.value)
    assert "grad_norm.evry_n_steps: unknown key" in text and "did you mean 'every_n_steps'" in text
    assert "grad_norm.layers: '(' is not a valid regular expression" in text
    assert "grad_norm.top_k: must be an integer from 0 to 1000" in text
    assert "grad_norm.threshold: must be a number greater than 0" in text
    assert "monitor_config.layernorm: must be a mapping" in text
    assert "weight_norm: must be true or false" in text
    with pytest.raises(ConfigError, match="top_k: must not exceed max_series"):
        load_config({"grad_norm": {"top_k": 8, "max_series": 4}})
    assert load_config({"layernorm": {"max_layers": 3}}).layernorm.max_layers == 3
    with pytest.raises(ConfigError, match="layernorm.max_layers: must be an integer from 1 to 10000"):
        load_config({"layernorm": {"max_layers": 0}})


# -- constraints declared beside their fields ----------------------------------------------------------------


def sections_of(kind: type) -> list[type]:
    """kind and every section nested in it, at any depth."""
    found = [kind]
    for f in dataclasses.fields(kind):
        if dataclasses.is_dataclass(f.metadata.get("check")):
            found += sections_of(f.metadata["check"])
    return found


def nested(path: str, value: Any) -> dict[str, Any]:
    *outer, last = path.split(".")
    raw: dict[str, Any] = {last: value}
    for key in reversed(outer):
        raw = {key: raw}
    return raw


def test_every_field_of_every_section_declares_its_constraint() -> None:
    kinds = sections_of(MonitorConfig)
    assert set(SECTIONS.values()) | set(ACTION_SECTIONS.values()) | {MonitorConfig, FlopsModelConfig} == set(kinds)
    for kind in kinds:
        for f in dataclasses.fields(kind):
            assert callable(f.metadata.get("check")), f"{kind.__name__}.{f.name} declares no constraint"


@pytest.mark.parametrize(("path", "check"), leaves(MonitorConfig), ids=[path for path, _ in leaves(MonitorConfig)])
def test_the_declared_constraint_is_what_rejects_a_bad_value(path: str, check: Any) -> None:
    bad = object()  # no check accepts it
    with pytest.raises(_Bad) as declared:
        check(bad)
    with pytest.raises(ConfigError) as info:
        load_config(nested(path, bad))
    assert len(info.value.problems) == len(declared.value.problems)
    for problem, (message, _) in zip_strict(info.value.problems, declared.value.problems):
        assert problem.startswith(f"monitor_config.{path}: {message}, got ")
        assert problem.endswith(" (from monitor_config)")


def test_the_constraint_vocabulary_says_what_is_allowed() -> None:
    def refusal(check: Any, value: Any) -> str:
        with pytest.raises(_Bad) as info:
            check(value)
        return info.value.problems[0][0]

    assert [int_in(1, 3)(1), int_in(1, 3)(3), int_in(0, 10**9)(10**9)] == [1, 3, 10**9]
    for value in (0, 4, True, 2.0, "2", 10**400):
        assert refusal(int_in(1, 3), value) == "must be an integer from 1 to 3"
    assert greater_than(0, 10)(2) == 2.0 and isinstance(greater_than(0, 10)(2), float)
    for value in (0, -1, float("inf"), float("nan"), False, "1", 11, 10**400):  # a huge int: no OverflowError
        assert refusal(greater_than(0, 10), value) == "must be a number greater than 0 and at most 10"
    assert at_least(0, 5)(0) == 0.0 and refusal(at_least(0, 5), -0.5) == "must be a number of at least 0 and at most 5"
    assert refusal(between(0, 1), 1) == "must be a number between 0 and 1 (exclusive)"
    assert choice("a", "B", any_case=True)("b") == "B" and refusal(choice("a"), "A") == "must be one of ['a']"
    assert optional(int_in(1, 3))(None) is None and refusal(optional(int_in(1, 3)), 5).startswith("must be an integer")
    assert refusal(text(), "  ") == "must be a non-empty string"
    assert names(("x", "y"))(["y", "x", "y"]) == ("y", "x")
    assert refusal(names(("x",), at_least_one=True), []) == "needs at least one of ['x']"
    assert refusal(regexes(), ["a", "("]).startswith("'(' is not a valid regular expression")
    assert refusal(url(), "host:80") == "must be a URL such as http://host:port"


def test_every_problem_in_every_section_at_once() -> None:
    with pytest.raises(ConfigError) as info:
        load_config(
            {
                "grad_norm": {"every_n_steps": 0},
                "otlp": {"protocol": "udp", "timout": 1},
                "actions": {
                    "early_stop": {"unit": "batch", "patience": 0},
                    "lr_backoff": {"factor": 1},
                    "snapshot": {"spike_factor": 1, "max_snapshots": 0},
                },
                "web": {"cache_seconds": -1},
                "layernorm": {"window": 0},
                "port": 65535,
            },
            pushgateway={"on": "never"},
        )
    text = str(info.value)
    assert len(info.value.problems) == 12, info.value.problems
    for fragment in (
        "grad_norm.every_n_steps: must be an integer from 1 to 1000000, got 0",
        "otlp.protocol: must be one of ['grpc', 'http/protobuf'], got 'udp'",
        "otlp.timout: unknown key (monitor_config); did you mean 'timeout'?",
        "actions.early_stop.unit: must be one of ['epoch', 'step'], got 'batch'",
        "actions.early_stop.patience: must be an integer from 1 to 10000000, got 0",
        "actions.lr_backoff.factor: must be a number between 0 and 1 (exclusive), got 1",
        "actions.snapshot.spike_factor: must be a number greater than 1 and at most 1e+12, got 1",
        "actions.snapshot.max_snapshots: must be an integer from 1 to 1000, got 0",
        "web.cache_seconds: must be a number of at least 0 and at most 3600, got -1",
        "layernorm.window: must be an integer from 1 to 10000000, got 0",
        "port: must be 0 (any free port) or a base port from 1 to 65528",
        "pushgateway.on: unknown name(s) 'never'; allowed: ['train_end', 'interval'], got 'never' "
        "(from keyword argument pushgateway=)",
    ):
        assert fragment in text, fragment


def test_cross_field_rules(tmp_path: Path) -> None:
    cert, key, ca = (tmp_path / name for name in ("server.crt", "server.key", "ca.crt"))
    for path in (cert, key, ca):
        path.write_text("not checked here: the endpoint loads it\n")
    tls = {"tls_cert_file": str(cert), "tls_key_file": str(key)}
    assert load_config({"web": {**tls, "client_ca_file": str(ca), "client_auth_type": "RequireAndVerifyClientCert"}})
    with pytest.raises(ConfigError) as info:
        load_config({"web": {"tls_cert_file": str(cert)}})
    assert info.value.problems == [
        f"monitor_config.web: tls_cert_file and tls_key_file go together: give both for TLS, or neither, got "
        f"{{'tls_cert_file': '{cert}', 'tls_key_file': None}} (from monitor_config)"
    ]
    with pytest.raises(ConfigError) as info:
        load_config(web={"client_auth_type": "VerifyClientCertIfGiven"})
    keys = [problem.split(":")[0] for problem in info.value.problems]
    assert keys == ["monitor_config.web", "monitor_config.web.client_auth_type"]
    assert "need TLS" in info.value.problems[0] and "needs client_ca_file" in info.value.problems[1]
    assert "(from keyword argument web=)" in info.value.problems[1]
    with pytest.raises(ConfigError, match=r"grad_norm.top_k: must not exceed max_series \(4\), got 5"):
        load_config({"grad_norm": {"max_series": 4}})  # the default top_k meets a smaller max_series
    with pytest.raises(ConfigError, match=r"warn_on_value.loss: watches a metric that is switched off; add 'loss'"):
        load_config({"warn_on_value": {"loss": 3}}, metrics=["lr"])


def test_nested_sections_merge_per_sub_key_across_sources(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = write(
        tmp_path, "monitor_config:\n  actions:\n    snapshot: {max_snapshots: 2}\n    early_stop: {patience: 9}\n"
    )
    monkeypatch.setenv("MS_EXPORTER_ACTIONS", "{snapshot: {enable: true}}")
    config = load_config(path, actions={"early_stop": {"enable": True}})
    assert (config.actions.snapshot.enable, config.actions.snapshot.max_snapshots) == (True, 2)
    assert (config.actions.early_stop.enable, config.actions.early_stop.patience) == (True, 9)
    monkeypatch.setenv("MS_EXPORTER_ACTIONS", "{snapshot: {spike_factor: 0.5}}")
    with pytest.raises(
        ConfigError,
        match=r"actions.snapshot.spike_factor: must be a number greater than 1 and at "
        r"most 1e\+12, got 0.5 \(from environment variable MS_EXPORTER_ACTIONS\)",
    ):
        load_config(path)


def test_password_hashes_every_bad_user_and_never_the_hash() -> None:
    good = "sha256:" + "0" * 64
    assert load_config({"web": {"basic_auth_users": {"grafana": good}}}).web.basic_auth_users == {"grafana": good}
    with pytest.raises(ConfigError) as info:
        load_config({"web": {"basic_auth_users": {"a:b": good, "alice": "hunter2", "bob": "sha256:s3cret"}}})
    problems = info.value.problems
    assert len(problems) == 3 and "user names must be non-empty strings without ':', got 'a:b'" in problems[0]
    assert "the hash for user 'alice' must be a bcrypt hash" in problems[1] and "'bob'" in problems[2]
    assert "hunter2" not in str(info.value) and "s3cret" not in str(info.value)
    with pytest.raises(ConfigError, match="must be a mapping of user name to password hash, got '<redacted>'"):
        load_config({"web": {"basic_auth_users": ["hunter2"]}})


def test_web_config_file_problems(tmp_path: Path) -> None:
    web = tmp_path / "web.yml"
    web.write_text("tls_server_config: /etc/server.pem\n")  # dropped silently, it would serve plain HTTP
    with pytest.raises(
        ConfigError,
        match=r"web.config_file: .*web.yml: tls_server_config must be a mapping of cert_"
        r"file, key_file, client_ca_file, client_auth_type, got '/etc/server.pem'",
    ):
        load_config({"web": {"config_file": str(web)}})
    web.write_text("- a list\n")
    with pytest.raises(ConfigError, match=r"web.config_file: .*web.yml must hold a mapping"):
        load_config({"web": {"config_file": str(web)}})
    web.write_text(f"basic_auth_users:\n  grafana: 'sha256:{'0' * 64}'\n")
    config = load_config({"web": {"config_file": str(web), "cache_seconds": 0}})
    assert list(config.web.basic_auth_users) == ["grafana"] and config.web.cache_seconds == 0.0


# -- every input ends in the one ConfigError, quickly and with a short message --------------------------------
@pytest.mark.parametrize("value", [10**400, -(10**400), 1e308, 2**64])
def test_numbers_past_any_bound_are_config_errors(value: Any) -> None:
    for path, _ in leaves(MonitorConfig):
        try:
            config: Any = load_config(nested(path, value))
        except ConfigError as exc:
            assert len(str(exc)) < 1000, path
            continue
        for key in path.split("."):  # accepted: only where such a number means something (a loss threshold)
            config = getattr(config, key)
        # FLOPs per token or per second: up to MAX_FLOPS (a zettaFLOP/s is 1e21)
        assert isinstance(config, float) and config <= (MAX_FLOPS if path.startswith("flops.") else 1e12), (
            path,
            config,
        )


def test_an_interval_no_thread_can_wait_and_a_file_size_no_int_holds_are_refused() -> None:
    for raw in (
        {"interval": 1e10},
        {"max_file_mb": 1e308},
        {"hang": {"min_seconds": 1e10}},
        {"pushgateway": {"url": "http://h:1", "interval": 1e10}},
    ):
        with pytest.raises(ConfigError, match="at most"):
            load_config(raw)


def test_a_400_digit_environment_value_is_a_config_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MS_EXPORTER_INTERVAL", "9" * 400)
    with pytest.raises(
        ConfigError,
        match=r"interval: must be a number of at least 0.05 and at most 604800, got an "
        r"integer of 400 digits \(from environment variable MS_EXPORTER_INTERVAL\)",
    ):
        load_config()


def test_a_misspelt_environment_variable_is_a_config_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MS_EXPORTER_INTERVL", "5")
    with pytest.raises(
        ConfigError, match="MS_EXPORTER_INTERVL: not a monitor_config key; did you mean MS_EXPORTER_INTERVAL"
    ):
        load_config()
    monkeypatch.delenv("MS_EXPORTER_INTERVL")
    monkeypatch.setenv("MS_EXPORTER_TOP_PASSWORD", "x")  # ms-exporter top's: not a config key, and no error
    assert load_config().interval == 30


BOMB = (
    "a: &a [x, x, x, x, x, x, x, x, x, x]\n"
    + "".join(f"{chr(98 + i)}: &{chr(98 + i)} [{', '.join([f'*{chr(97 + i)}'] * 10)}]\n" for i in range(8))
    + "monitor_config:\n  tags: *i\n"
)


@pytest.mark.parametrize(
    ("text", "said"),
    [
        (BOMB, "more than 100,000 values"),  # a billion values in 10 lines
        ("monitor_config: &m\n  tags: *m\n", "recursive"),
        ("monitor_config:\n  tags: " + "[" * 500 + "]" * 500 + "\n", "nested deeper than 64"),
    ],
)
def test_yaml_alias_bombs_recursion_and_nesting_are_config_errors(tmp_path: Path, text: str, said: str) -> None:
    path = tmp_path / "monitor.yaml"
    path.write_text(text)
    with pytest.raises(ConfigError, match=said) as raised:
        load_config(path)
    assert len(str(raised.value)) < 1000


def test_a_fifo_a_device_and_a_huge_file_are_refused_without_reading_them(tmp_path: Path) -> None:
    fifo = tmp_path / "fifo.yaml"
    os.mkfifo(fifo)
    huge = tmp_path / "huge.yaml"
    with huge.open("wb") as out:
        out.truncate(50 * 1024 * 1024)  # 50 MB (sparse)
    for path, said in (
        (fifo, "not a regular file"),
        ("/dev/zero", "not a regular file"),
        (huge, "a config file is at most 1,048,576"),
    ):
        # In a child with a timeout: a loader that waits for a FIFO's writer would hang this test, not pass it.
        done = subprocess.run(
            [
                sys.executable,
                "-c",
                "import sys; from ms_exporter import load_config\n"
                "try:\n load_config(sys.argv[1])\nexcept Exception as e:\n print(type(e).__name__, e)",
                str(path),
            ],
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
        assert done.stdout.startswith("ConfigError") and said in done.stdout, (path, done.stdout, done.stderr)


def test_two_monitors_cannot_share_one_json_lines_file(tmp_path: Path) -> None:
    from ms_exporter import TrainingMonitor

    first = TrainingMonitor(port=0, backend=["prometheus", "local"], save_dir=str(tmp_path))
    try:
        with pytest.raises(ConfigError, match="already written by another TrainingMonitor of this process"):
            TrainingMonitor(port=0, backend=["local"], save_dir=str(tmp_path))
        TrainingMonitor(port=0, backend=["local"], save_dir=str(tmp_path / "other")).close()
    finally:
        first.close()
    TrainingMonitor(port=0, backend=["local"], save_dir=str(tmp_path)).close()  # free again once closed


def test_a_config_error_rebuilt_from_its_text_keeps_its_problems() -> None:
    """MindSpore Transformers' registry re-raises `type(e)(f"{cls}: {e}")`: that must read as the same problems under
    the class's name, not one problem per character; any other string is one problem."""
    with pytest.raises(ConfigError) as raised:
        load_config({"port": -1, "loss_window": 0})
    again = type(raised.value)(f"TrainingMonitor: {raised.value}")
    assert again.problems == raised.value.problems and len(again.problems) == 2
    assert str(again) == f"TrainingMonitor: {raised.value}"
    assert ConfigError("monitor_config.port: taken").problems == ["monitor_config.port: taken"]
    assert str(ConfigError("x")) == "invalid monitor_config (1 problem(s)):\n  - x"
    assert ConfigError(problem for problem in ("a", "b")).problems == ["a", "b"]
    secret = ConfigError("TrainingMonitor: invalid monitor_config (1 problem(s)):\n  - bad url http://u:pw@h:1")
    assert "pw" not in str(secret) and secret.problems == ["bad url http://u:<redacted>@h:1"]


@pytest.mark.parametrize("key", ["save_dir", "file_sd_dir", "web.config_file", "web.tls_cert_file"])
@pytest.mark.parametrize("bad", ["run\x00s", "runs\n", "runs\x1b[2J", "runs\x7f"])
def test_a_control_character_in_a_path_is_a_config_error(key: str, bad: str) -> None:
    with pytest.raises(ConfigError, match=rf"monitor_config\.{key}: must be a path without control characters"):
        load_config(nested(key, bad))


def test_a_nul_in_save_dir_fails_check_config_not_the_monitor(tmp_path: Path) -> None:
    from ms_exporter import TrainingMonitor

    path = write(tmp_path, 'monitor_config: {backend: [local], save_dir: "runs\\0x"}\n')
    done = subprocess.run(
        [sys.executable, "-m", "ms_exporter", "check-config", str(path)],
        capture_output=True,
        text=True,
        check=False,
        timeout=120,
    )
    assert done.returncode != 0 and "save_dir: must be a path without control characters" in done.stderr + done.stdout
    with pytest.raises(ConfigError, match="save_dir"):  # a plain ValueError (embedded null byte) before
        TrainingMonitor(port=0, backend=["local"], save_dir=f"{tmp_path}/runs\x00x")
    assert len(load_config(save_dir="a" * 4096).save_dir) == 4096
    with pytest.raises(ConfigError, match="at most 4096 characters"):
        load_config(save_dir="a" * 4097)


# Every key that sets how often something periodic runs; each has a lower bound, stated in docs/configuration.md.
INTERVAL_KEYS = ("interval", "otlp.interval", "pushgateway.interval", "goodput.save_seconds", "hardware.interval")


def lower_bound(key: str) -> float:
    """The least value the key's declared check accepts, as its refusal of 0 states it."""
    check = dict(leaves(MonitorConfig))[key]
    try:
        check(0)
    except _Bad as bad:
        message = str(bad)
    else:
        raise AssertionError(f"{key} accepts 0")
    assert message.startswith("must be a number of at least "), message
    return float(message.split("at least ")[1].split()[0])


def test_every_interval_has_a_documented_lower_bound() -> None:
    named = {path for path, _ in leaves(MonitorConfig) if path.rsplit(".", 1)[-1] in ("interval", "save_seconds")}
    assert named == set(INTERVAL_KEYS)
    rows = {
        line.split("|")[1].strip().strip("`"): line
        for line in (Path(__file__).parents[2] / "docs" / "configuration.md").read_text(encoding="utf-8").splitlines()
        if line.startswith("| `")
    }
    for key in INTERVAL_KEYS:
        low = lower_bound(key)
        assert 0 < low <= 1, key
        with pytest.raises(ConfigError, match=rf"{key}: must be a number of at least {low:g} "):
            load_config(nested(key, 1e-9))  # 1e-9 s: 8 MB/s of JSON Lines before
        config: Any = load_config(nested(key, low))
        for part in key.split("."):
            config = getattr(config, part)
        assert config == low
        assert f"at least {low:g} " in rows[key], (key, rows[key])


def test_check_config_hides_a_token_and_query_values_of_a_target() -> None:
    config = load_config(
        {
            "pushgateway": {"url": "https://tok3n@gateway:9091/?api_key=k3y&debug"},
            "otlp": {"endpoint": "http://ops:pw0rd@collector:4318/v1/metrics?token=t0k#x"},
        }
    )
    shown = config.redacted()
    assert shown["pushgateway"]["url"] == "https://<redacted>@gateway:9091/?api_key=<redacted>&debug"
    assert shown["otlp"]["endpoint"] == "http://ops:<redacted>@collector:4318/v1/metrics?token=<redacted>"
    assert not any(secret in repr(shown) for secret in ("tok3n", "k3y", "pw0rd", "t0k"))
