"""Config files read with bounds: a regular file of limited size, YAML of limited depth and values."""

from __future__ import annotations

import os
import stat
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml

MAX_FILE_BYTES = 1024 * 1024  # a config file (a monitor_config is a few KiB)
MAX_YAML_VALUES = 100_000  # values a YAML document may stand for, aliases expanded
MAX_YAML_DEPTH = 64


def read_small_file(path: Path | str) -> str:
    """A config file's text: a regular file of at most MAX_FILE_BYTES (a FIFO or /dev/zero would hang or fill
    memory), UTF-8. OSError or ValueError with what is wrong."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))  # a FIFO: no wait for a writer
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise ValueError("not a regular file (a directory, FIFO or device cannot hold a config)")
        if info.st_size > MAX_FILE_BYTES:
            raise ValueError(f"{info.st_size:,} bytes; a config file is at most {MAX_FILE_BYTES:,}")
        chunks, size = [], 0
        while chunk := os.read(fd, 65536):
            chunks.append(chunk)
            size += len(chunk)
            if size > MAX_FILE_BYTES:  # it grew while read
                raise ValueError(f"more than {MAX_FILE_BYTES:,} bytes; a config file is at most that")
    finally:
        os.close(fd)
    return b"".join(chunks).decode("utf-8")


class YamlTooLarge(yaml.YAMLError):
    """A document whose aliases or nesting would make it far larger than any config."""


def load_yaml(text: str) -> Any:
    """yaml.safe_load, refusing documents that expand past MAX_YAML_VALUES values (aliases of aliases: a few lines
    can stand for billions of values) or nest deeper than MAX_YAML_DEPTH."""
    loader = yaml.SafeLoader(text)
    try:
        try:
            node = loader.get_single_node()
        except RecursionError:
            raise YamlTooLarge(f"nested deeper than {MAX_YAML_DEPTH} levels") from None
        if node is None:
            return None
        _count_values(node, {}, set(), 0)
        return loader.construct_document(node)
    finally:
        loader.dispose()


def _count_values(node: yaml.Node, counted: dict[int, int], open_nodes: set[int], depth: int) -> int:
    """How many values `node` stands for once every alias is expanded; each node is counted once (memo)."""
    key = id(node)
    if key in counted:
        return counted[key]
    if key in open_nodes:
        raise YamlTooLarge("an alias refers to a node that contains it (a recursive document)")
    if depth > MAX_YAML_DEPTH:
        raise YamlTooLarge(f"nested deeper than {MAX_YAML_DEPTH} levels")
    open_nodes.add(key)
    total = 1
    if isinstance(node, yaml.MappingNode):
        for name, value in node.value:
            total += _count_values(name, counted, open_nodes, depth + 1)
            total += _count_values(value, counted, open_nodes, depth + 1)
    elif isinstance(node, yaml.SequenceNode):
        for item in node.value:
            total += _count_values(item, counted, open_nodes, depth + 1)
    if total > MAX_YAML_VALUES:
        raise YamlTooLarge(f"stands for more than {MAX_YAML_VALUES:,} values once its aliases are expanded")
    open_nodes.discard(key)
    counted[key] = total
    return total


def _yaml_on_key(raw: Any) -> Any:
    """YAML 1.1 (PyYAML) reads a bare `on:` key as the boolean true: give pushgateway.on its name back."""
    if isinstance(raw, Mapping) and any(key is True for key in raw):
        return {"on" if key is True else key: value for key, value in raw.items()}
    return raw
