"""Random YAML and dicts into the loader: only ConfigError ever comes out, and it names a key."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from prometheus_client.parser import text_string_to_metric_families

from ms_exporter.config import KEYS, SECTIONS, ConfigError, MonitorConfig, _Bad, hide_url_passwords, load_config
from ms_exporter.core.compat import zip_strict
from tests.support.config_fields import leaves

SUB_KEYS = {name: [f for f in kind.__dataclass_fields__] for name, kind in SECTIONS.items()}
scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(10**6), 10**6),
    st.floats(allow_nan=True),
    # sizes: numbers far past any bound (a 400-digit integer, 1e308) and long strings
    st.integers(-(10**400), 10**400),
    st.sampled_from([1e308, -1e308, 1e10, 2**63, 2**64 + 1]),
    st.text(max_size=20),
    st.text(min_size=1000, max_size=5000),
    st.sampled_from(
        ["prometheus", "otlp", "loss", "grpc", "train_end", "$2b$", "sha256:", "0.0.0.0", "1e3", "on", "http://u:p@h:1"]
    ),
    # control characters in paths (a ConfigError at the key), intervals at and past their lower bounds
    st.sampled_from(["runs\x00x", "runs\n", "\x1b[2J", "a\x7f", "x" * 4097]),
    st.sampled_from([1e-9, 0.0499, 0.05, 0.0999, 0.1, 5e-324]),
)
values = st.recursive(
    scalars,
    lambda inner: st.one_of(st.lists(inner, max_size=4), st.dictionaries(st.text(max_size=8), inner, max_size=4)),
    max_leaves=8,
)


@st.composite
def configs(draw: Any) -> dict[str, Any]:
    """Mostly real keys (with real sub-keys for sections), some typos, values of any shape."""
    keys = draw(st.lists(st.one_of(st.sampled_from(KEYS), st.text(max_size=10)), max_size=6))
    out: dict[str, Any] = {}
    for key in keys:
        if key in SUB_KEYS and draw(st.booleans()):
            out[key] = draw(st.dictionaries(st.sampled_from(SUB_KEYS[key]), values, max_size=4))
        else:
            out[key] = draw(values)
    return out


def check(source: Any) -> None:
    try:
        load_config(source)
    except ConfigError as exc:
        assert exc.problems and all("monitor_config" in p or "config file" in p or "YAML" in p for p in exc.problems)
        assert len(str(exc)) < 20_000  # an error message says what is wrong, it does not echo a huge value


@st.composite
def aliased_yaml(draw: Any) -> str:
    """YAML whose anchors and aliases nest: `levels` of `fanout` aliases each stand for fanout**levels values (a
    billion laughs at the top), sometimes a recursive alias, under a real key or a section."""
    levels, fanout = draw(st.integers(1, 12)), draw(st.integers(1, 12))
    key = draw(st.sampled_from([*KEYS, "grad_norm.layers", "web.basic_auth_users", "tags"]))
    lines = ["anchors:", "  - &a0 [x, y]"]
    for level in range(1, levels + 1):
        lines.append(f"  - &a{level} [{', '.join([f'*a{level - 1}'] * fanout)}]")
    top = f"*a{levels}"
    if draw(st.booleans()):
        lines.append("  - &loop [1, *loop]")  # PyYAML builds recursive objects from this
        top = draw(st.sampled_from([top, "*loop"]))
    section, _, sub = key.partition(".")
    body = f"  {section}:\n    {sub}: {top}" if sub else f"  {section}: {top}"
    return "\n".join(lines) + "\nmonitor_config:\n" + body + "\n"


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(aliased_yaml())
def test_yaml_aliases_and_sizes_give_a_config_or_a_config_error(tmp_path: Path, text: str) -> None:
    path = tmp_path / "monitor.yaml"
    path.write_text(text, encoding="utf-8")
    check(path)


@settings(max_examples=400, deadline=None)
@given(configs())
def test_random_dicts_give_a_config_or_a_config_error(raw: dict[str, Any]) -> None:
    check(raw)
    check({"monitor_config": raw})


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    st.one_of(
        configs().map(lambda raw: yaml.safe_dump({"monitor_config": raw}, allow_unicode=True)), st.text(max_size=200)
    )
)
def test_random_yaml_files_give_a_config_or_a_config_error(tmp_path: Path, text: str) -> None:
    path = tmp_path / "monitor.yaml"
    path.write_text(text, encoding="utf-8")
    check(path)


# Keys that a rule tying fields together (or the file web.config_file names) may still object to.
CROSS_FIELD = {
    "grad_norm.top_k",
    "grad_norm.max_series",
    "update_ratio.top_k",
    "update_ratio.max_series",
    "web.config_file",
    "web.client_ca_file",
    "web.client_auth_type",
    "web.tls_cert_file",
    "web.tls_key_file",
    "flops.alert_below",
    "divergence.check_every_n_steps",  # must divide divergence.every_n_steps
    # one key of a model description needs the others
    *(
        f"flops.model.{key}"
        for key in (
            "num_layers",
            "hidden_size",
            "num_heads",
            "ffn_hidden_size",
            "vocab_size",
            "num_kv_heads",
            "head_dim",
        )
    ),
}
near_valid = st.one_of(
    values,
    st.integers(-3, 70000),
    st.floats(-2, 5),
    st.floats(0, 0.2),
    st.sampled_from(
        [
            "http://h:1",
            "grpc",
            "interval",
            "DEBUG",
            "epoch",
            "127.0.0.1",
            "::",
            "x",
            ["loss"],
            {"loss": 3},
            {"a": "b"},
            "runs/x\x00",
            "run\ts",
            "./runs",
        ]
    ),
)


@settings(max_examples=600, deadline=None)
@given(st.sampled_from(leaves(MonitorConfig)), near_valid)
def test_each_key_is_judged_by_the_constraint_declared_beside_it(leaf: tuple[str, Any], value: Any) -> None:
    """What a field's declared check says about a value is what load_config says, at that key."""
    path, check = leaf
    *outer, last = path.split(".")
    raw: dict[str, Any] = {last: value}
    for key in reversed(outer):
        raw = {key: raw}
    try:
        clean = check(value)
    except _Bad as bad:
        try:
            load_config(raw)
        except ConfigError as exc:
            said = [problem for problem in exc.problems if problem.startswith(f"monitor_config.{path}: ")]
            assert len(said) == len(bad.problems)
            for problem, (message, _) in zip_strict(said, bad.problems):
                # Errors hide anything shaped like a URL's password (`:x@`), the value's echo in them too.
                assert problem.startswith(f"monitor_config.{path}: {hide_url_passwords(message)}")
            return
        raise AssertionError(f"{path}={value!r} was refused by its check but accepted by load_config") from None
    try:
        config: Any = load_config(raw)
    except ConfigError:
        assert path in CROSS_FIELD
        return
    for key in path.split("."):
        config = getattr(config, key)
    assert config == clean


@settings(max_examples=200, deadline=None)
@given(st.text(min_size=1, max_size=128).filter(str.strip), st.text(max_size=128))
def test_any_project_and_tag_value_renders_as_valid_exposition(project: str, tag: str) -> None:
    """Quotes, backslashes, newlines and any Unicode in label values are escaped, never break a scrape."""
    from prometheus_client import CollectorRegistry, generate_latest

    from ms_exporter.core.ranks import RankInfo
    from ms_exporter.core.store import MetricStore
    from ms_exporter.probes.identity import publish_identity
    from ms_exporter.sinks.prometheus import StoreCollector

    store = MetricStore((("rank", "0"), ("project", project)))
    publish_identity(store, RankInfo(0, 0, 1, "host"), "CPU", "2.10", {"team": tag})
    registry = CollectorRegistry(auto_describe=False)
    registry.register(StoreCollector(store, lambda component, exc: (_ for _ in ()).throw(exc)))
    families = list(text_string_to_metric_families(generate_latest(registry).decode("utf-8")))
    (sample,) = [s for f in families for s in f.samples if s.name == "mindspore_train_info"]
    assert sample.labels["project"] == project and sample.labels["team"] == tag
    assert not math.isnan(sample.value)


PATH_KEYS = (
    "save_dir",
    "file_sd_dir",
    "web.config_file",
    "web.tls_cert_file",
    "web.tls_key_file",
    "web.client_ca_file",
)


@settings(max_examples=300, deadline=None)
@given(st.sampled_from(PATH_KEYS), st.text(max_size=40))
def test_any_text_as_a_path_is_a_config_or_a_config_error(key: str, text: str) -> None:
    """A path key takes a path without control characters (NUL, newline, escape, DEL) or says why not, at that key."""
    section, _, sub = key.rpartition(".")
    raw: dict[str, Any] = {section: {sub: text}} if section else {sub: text}
    try:
        config: Any = load_config(raw)
    except ConfigError as exc:
        if any(ord(c) < 32 or ord(c) == 127 for c in text):
            assert any(p.startswith(f"monitor_config.{key}") for p in exc.problems), exc.problems
        else:  # a usable path may still break a rule between keys (a certificate without its key): named there
            assert any(
                p.startswith(f"monitor_config.{key}")
                or (section and p.startswith(f"monitor_config.{section}:") and sub in p)
                for p in exc.problems
            ), exc.problems
        return
    for part in key.split("."):
        config = getattr(config, part)
    assert not any(ord(c) < 32 or ord(c) == 127 for c in config)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.text(max_size=60).filter(lambda p: "\n  - " not in p), min_size=1, max_size=5), st.text(max_size=30))
def test_a_config_error_rebuilt_from_its_text_keeps_its_problems(problems: list[str], prefix: str) -> None:
    """MindSpore Transformers' registry re-raises `type(e)(f"{cls}: {e}")`; the problems survive it."""
    error = ConfigError(problems)
    again = type(error)(f"{prefix}: {error}")
    assert again.problems == error.problems
    assert ConfigError(prefix).problems == [hide_url_passwords(prefix)]
