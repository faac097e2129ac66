"""The MS_EXPORTER_<KEY> environment: the variables set, their values read, and names that are no key."""

from __future__ import annotations

import dataclasses
import os
from typing import Any

import yaml

from ms_exporter.config import part_sections
from ms_exporter.config.checks import _close
from ms_exporter.config.safe_yaml import _yaml_on_key, load_yaml
from ms_exporter.config.schema import KEYS, MonitorConfig

# A top-level key is read from MS_EXPORTER_<KEY>: port from MS_EXPORTER_PORT.
ENV_PREFIX = "MS_EXPORTER_"

# MS_EXPORTER_* variables that are not config keys: `ms-exporter top` reads its password from this one.
OTHER_ENV_NAMES = ("MS_EXPORTER_TOP_PASSWORD",)


def _unknown_env_names() -> list[str]:
    """A misspelt MS_EXPORTER_* variable is an error, as a misspelt key in the file is: silently ignored, it would
    leave the setting it meant at its default."""
    every = (*KEYS, *part_sections.names())
    known = [ENV_PREFIX + key.upper() for key in every]
    found = []
    for name in sorted(os.environ):
        if name.startswith(ENV_PREFIX) and name not in known and name not in OTHER_ENV_NAMES:
            close = _close(name, known)
            hint = f"did you mean {close}? " if close else ""
            found.append(
                f"environment variable {name}: not a monitor_config key; {hint}the variables are "
                f"{ENV_PREFIX}<KEY> for the top-level keys: {', '.join(k.upper() for k in every)}"
            )
    return found


def _env_values() -> dict[str, str]:
    values = {}
    for key in (*KEYS, *part_sections.names()):
        text = os.environ.get(ENV_PREFIX + key.upper())
        if text is not None:
            values[key] = text
    return values


# Environment values of these keys stay verbatim (a project named "1e3" stays a string); list keys take `a,b`.
_STRING_KEYS = tuple(f.name for f in dataclasses.fields(MonitorConfig) if f.type in ("str", "str | None"))
_LIST_KEYS = tuple(f.name for f in dataclasses.fields(MonitorConfig) if str(f.type).startswith("tuple["))


def _parse_env(key: str, text: str) -> Any:
    """Environment values are YAML scalars or flow collections; list keys also take `a,b`."""
    try:
        value = load_yaml(text)
    except yaml.YAMLError:
        return text
    if key in _LIST_KEYS and isinstance(value, str) and "," in value:
        return [part.strip() for part in value.split(",") if part.strip()]
    if key in _STRING_KEYS and value is not None:
        return text
    if key == "pushgateway":
        return _yaml_on_key(value)
    return value
