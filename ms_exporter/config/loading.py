"""load_config and read_config: defaults < file or dict < MS_EXPORTER_* environment < keywords, checked."""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

import yaml

from ms_exporter.config import article_keys, mindformers_keys, part_sections
from ms_exporter.config.checks import ConfigError
from ms_exporter.config.environment import ENV_PREFIX, _env_values, _parse_env, _unknown_env_names
from ms_exporter.config.safe_yaml import _yaml_on_key, load_yaml, read_small_file
from ms_exporter.config.schema import KEYS, MonitorConfig
from ms_exporter.config.walker import _build, _is_section, _Problems

if TYPE_CHECKING:
    from _typeshed import DataclassInstance


def load_config(
    source: str | os.PathLike[str] | Mapping[str, Any] | MonitorConfig | None = None, **overrides: Any
) -> MonitorConfig:
    """Build the effective config: defaults < file/dict < MS_EXPORTER_* environment < keyword overrides."""
    return read_config(source, **overrides)[0]


def read_config(
    source: str | os.PathLike[str] | Mapping[str, Any] | MonitorConfig | None = None, **overrides: Any
) -> tuple[MonitorConfig, list[str]]:
    """load_config, and what the caller should tell the user about the block: MindSpore Transformers' own keys
    found in it, read as ours or left to it (ms_exporter.config.mindformers_keys)."""
    problems = _Problems()
    raw: dict[str, Any] = {}
    notes: list[str] = []
    if isinstance(source, MonitorConfig):
        raw = source.to_dict()
    elif isinstance(source, Mapping):
        raw = _unwrap(dict(source), "the given dict", problems.found)
    elif source is not None:
        raw = _read_file(Path(source), problems.found)
    if not isinstance(source, MonitorConfig):
        articles = article_keys.translate(raw)
        problems.found.extend(articles.problems)
        notes += articles.notes()
        for ours, theirs in articles.origins.items():  # an error then names the key the user wrote
            problems.set_origin(ours, f"{theirs}, read as {ours}")
        translation = mindformers_keys.translate(raw)
        notes += [summary] if (summary := translation.summary()) else []
        for its_key, ours in translation.read.items():  # an error then names the key the user wrote
            problems.set_origin(ours, f"monitor_config.{its_key}, MindSpore Transformers' key read as ours")
    for key, text in _env_values().items():
        value = _parse_env(key, text)
        _merge(raw, key, value)
        problems.set_origin(key, f"environment variable {ENV_PREFIX}{key.upper()}", value)
    problems.found.extend(_unknown_env_names())
    for key, value in overrides.items():
        _merge(raw, key, value)
        problems.set_origin(key, f"keyword argument {key}=", value)
    for name in [name for name in part_sections.names() if name in KEYS]:
        problems.add(name, f"a registered part named {name!r} declares a section under this built-in key; rename it")
    own, raw = part_sections.split(raw, KEYS)
    config = _build(MonitorConfig, raw, "", problems)
    sections = {key: _part_section(key, value, problems) for key, value in own.items()}
    if problems.found or config is None:
        raise ConfigError(problems.found)
    part_sections.attach(config, sections)
    return config, notes


def _part_section(key: str, value: Any, problems: _Problems) -> Any:
    """A part's own section, checked by its declarations as a built-in one is."""
    try:
        kind = part_sections.section_class(key)
    except ImportError as exc:  # its part's optional library: the error names what is missing
        problems.add(key, f"its part's module cannot be imported ({exc})")
        return None
    return _build(kind, value, key, problems)


def _merge(raw: dict[str, Any], key: Any, value: Any, kind: type[DataclassInstance] = MonitorConfig) -> None:
    """A later source replaces a key; in a section (also one inside a section) it replaces the sub-keys it names."""
    declared = {f.name: f.metadata["check"] for f in dataclasses.fields(kind)}.get(key)
    if kind is MonitorConfig and key in part_sections.names():
        raw[key] = part_sections.merged(raw.get(key), value)
    elif _is_section(declared) and isinstance(raw.get(key), Mapping) and isinstance(value, Mapping):
        raw[key] = dict(raw[key])
        for sub_key, sub_value in value.items():
            _merge(raw[key], sub_key, sub_value, declared)
    else:
        raw[key] = value


def _read_file(path: Path, problems: list[str]) -> dict[str, Any]:
    try:
        text = read_small_file(path)
    except (OSError, ValueError) as exc:  # ValueError: not UTF-8, or a NUL byte in the path
        problems.append(f"cannot read config file {str(path)!r}: {getattr(exc, 'strerror', None) or exc}")
        return {}
    try:
        data = load_yaml(text)
    except yaml.YAMLError as exc:
        problems.append(f"{path} is not valid YAML: {exc}")
        return {}
    if data is None:
        return {}
    raw = _unwrap(data, str(path), problems)
    if "pushgateway" in raw:
        raw["pushgateway"] = _yaml_on_key(raw["pushgateway"])
    return raw


def _unwrap(data: Any, where: str, problems: list[str]) -> dict[str, Any]:
    if not isinstance(data, Mapping):
        problems.append(
            f"{where}: expected a mapping with a monitor_config key (or a bare mapping of its keys), "
            f"got {type(data).__name__}"
        )
        return {}
    # A MindSpore Transformers run YAML: its other top-level keys are its own (docs/mindformers.md).
    run_config = bool(mindformers_keys.RUN_CONFIG_KEYS.intersection(map(str, data)))
    if "monitor_config" in data or run_config:
        extra = [k for k in data if k != "monitor_config"]
        if extra and not run_config:
            problems.append(
                f"{where}: only the top-level key monitor_config is read; unexpected {sorted(map(str, extra))}"
            )
        inner = data.get("monitor_config")
        if inner is None:
            return {}
        if not isinstance(inner, Mapping):
            problems.append(f"{where}: monitor_config must be a mapping, got {type(inner).__name__}")
            return {}
        if run_config:
            problems.extend(mindformers_keys.refused(inner, where))
        return {str(k): v for k, v in inner.items()}
    return {str(k): v for k, v in data.items()}
