"""Target discovery for the operator commands: URLs, host:port and Prometheus file_sd files, read into `Target`s."""

from __future__ import annotations

import json
import re
import urllib.parse
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

TARGET_HELP = (
    "a URL (http[s]://host:port[/path], path default /metrics), host:port, a directory of file_sd "
    "*.json files or one such file"
)

_HOST_PORT = re.compile(r"^(\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9_.-]+):(\d{1,5})$")
_HOST_PORT_PATH = re.compile(r"^(\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9_.-]+):(\d{1,5})/")


@dataclass(frozen=True)
class Target:
    """One endpoint to poll; `rank`/`project` come from file_sd labels and name the row while it is down."""

    url: str
    rank: str | None = None
    project: str | None = None
    problem: str | None = None  # set when the target could not even be read (a broken file_sd file)


@dataclass(frozen=True)
class TargetSpec:
    """One command-line target: a URL, or a file_sd directory or file that is re-read on every poll."""

    kind: str  # "url", "dir" or "file"
    value: str


def normalise_url(text: str, scheme: str = "http") -> str:
    """`http(s)://host[:port][/path]` (path default /metrics) or `host:port[/path]` (with `scheme`)."""
    if _HOST_PORT.match(text):
        return f"{scheme}://{text}/metrics"
    if _HOST_PORT_PATH.match(text):
        text = f"{scheme}://{text}"
    parts = urllib.parse.urlsplit(text)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ValueError(f"{text!r} is not {TARGET_HELP}")
    try:
        parts.port  # noqa: B018 -- raises on a port that is not a number in range
    except ValueError as exc:
        raise ValueError(f"{text!r}: {exc}; a target is {TARGET_HELP}") from None
    path = parts.path if parts.path not in ("", "/") else "/metrics"
    return urllib.parse.urlunsplit((parts.scheme, parts.netloc, path, parts.query, ""))


def parse_target_argument(text: str, scheme: str = "http") -> TargetSpec:
    """A command-line target, checked now so that a typo is an error before anything is polled."""
    path = Path(text)
    if path.is_dir():
        return TargetSpec("dir", text)
    if path.is_file():
        if path.suffix != ".json":
            raise ValueError(f"{text!r} is a file but not a file_sd .json file; a target is {TARGET_HELP}")
        return TargetSpec("file", text)
    looks_like_address = _HOST_PORT.match(text) or _HOST_PORT_PATH.match(text)
    if "://" not in text and not looks_like_address and ("/" in text or text.endswith(".json")):
        raise ValueError(f"{text!r}: no such file or directory; a target is {TARGET_HELP}")
    return TargetSpec("url", normalise_url(text, scheme))


def read_file_sd(path: Path, scheme: str = "http") -> list[Target]:
    """Targets of one Prometheus file_sd file (JSON: [{targets: [host:port], labels: {...}}]).

    `__scheme__` and `__metrics_path__` labels are honoured as Prometheus does; the rank and project come from
    ms_exporter's `__meta_ms_exporter_*` labels (or plain `rank`/`project` labels).
    """
    try:
        groups = json.loads(path.read_text(encoding="utf-8"))
        if not isinstance(groups, list):
            raise ValueError("not a JSON list of target groups")
        targets: list[Target] = []
        for group in groups:
            if not isinstance(group, dict) or not isinstance(group.get("targets"), list):
                raise ValueError("a target group without a 'targets' list")
            labels = group.get("labels") or {}
            if not isinstance(labels, dict):
                raise ValueError("'labels' is not a mapping")
            for address in group["targets"]:
                if not isinstance(address, str) or not _HOST_PORT.match(address):
                    raise ValueError(f"target {address!r} is not host:port")
                metrics_path = str(labels.get("__metrics_path__", "/metrics"))
                url = f"{labels.get('__scheme__', scheme)}://{address}{metrics_path}"
                targets.append(Target(url, _label(labels, "rank"), _label(labels, "project")))
        return targets
    except FileNotFoundError:
        return []  # the rank left between listing the directory and reading its file
    except (OSError, ValueError) as exc:  # json.JSONDecodeError is a ValueError
        return [Target(str(path), problem=f"bad file_sd file: {exc}")]


def _label(labels: dict[str, Any], name: str) -> str | None:
    value = labels.get(f"__meta_ms_exporter_{name}", labels.get(name))
    return None if value is None else str(value)


def expand_targets(specs: Iterable[TargetSpec], scheme: str = "http") -> list[Target]:
    """Every target of every argument, directories listed afresh (ranks come and go); each URL once."""
    seen: dict[str, Target] = {}
    for spec in specs:
        if spec.kind == "url":
            found = [Target(spec.value)]
        elif spec.kind == "file":
            found = read_file_sd(Path(spec.value), scheme)
        else:
            try:
                files = sorted(Path(spec.value).glob("*.json"))
            except OSError as exc:
                files, found = [], [Target(spec.value, problem=f"cannot list the directory: {exc}")]
            else:
                found = []
            for path in files:
                found.extend(read_file_sd(path, scheme))
        for target in found:
            seen.setdefault(target.url, target)
    return list(seen.values())
