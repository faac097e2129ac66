"""How a field declares its constraint (`setting`, `section`), the checks it may name, and ConfigError."""

from __future__ import annotations

import dataclasses
import difflib
import math
import os
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import field
from typing import Any

from ms_exporter.core.redaction import CONTROL_CHARACTERS, REDACTED, hide_url_passwords

# Upper bounds: past them a value is a mistake, and some (an interval of 1e10 s) would break a thread's wait.
MAX_SECONDS = 7 * 24 * 3600  # intervals, timeouts and deadlines: a week
MAX_STEPS = 10**12  # step counts
MAX_RATIO = 1e12  # thresholds, factors and learning rates
MAX_FLOPS = 1e30  # FLOPs per token or per second (a 1e15-parameter model at a zettaFLOP/s is far below)

_MAX_LABEL_VALUE = 128  # characters of a label value: a tag, project, divergence.replica_group
_URL = re.compile(r"^[a-zA-Z][a-zA-Z0-9+.-]*://[^/\s]+")


_HEADER = re.compile(r"invalid monitor_config \(\d+ problem\(s\)\):\n  - ")


class ConfigError(ValueError):
    """Raised at construction with every problem found; `problems` holds them one per item.

    Built from one string it is one problem, or, when the string is a ConfigError's own text with something put in
    front (MindSpore Transformers' registry re-raises `type(e)(f"{cls}: {e}")`), the same problems under that
    prefix: never one problem per character."""

    def __init__(self, problems: str | Iterable[str]) -> None:
        prefix = ""
        if isinstance(problems, str):
            found = _HEADER.search(problems)
            if found is None:
                problems = [problems]
            else:
                prefix, problems = problems[: found.start()], problems[found.end() :].split("\n  - ")
        self.problems = [hide_url_passwords(str(problem)) for problem in problems]
        lines = "\n  - ".join(self.problems)
        super().__init__(
            f"{hide_url_passwords(prefix)}invalid monitor_config ({len(self.problems)} problem(s)):\n  - {lines}"
        )


# -- constraints: a check returns the clean value, or raises _Bad saying what is wrong and what is allowed -----
Check = Callable[[Any], Any]
# Reports a problem of a section: (sub-key, or "" for the section itself; message; value shown, if any).
Say = Callable[..., None]
_UNSHOWN = object()  # a problem that shows no value


class _Bad(Exception):
    """A rejected value: (message, value to show) pairs; a secret shows as REDACTED."""

    def __init__(self, message: str, value: Any = _UNSHOWN) -> None:
        super().__init__(message)
        self.problems = [(message, value)]


def setting(
    default: Any = dataclasses.MISSING,
    *,
    check: Check,
    factory: Any = dataclasses.MISSING,
    doc: str = "",
    allowed: str = "",
    shown: str | None = None,
) -> Any:
    """A dataclass field and the check every value given for it must pass, with its row of docs/configuration.md
    (`make generate` writes the tables from these): `doc` what it means, `allowed` what the check accepts in words,
    `shown` the default in words where it is not a literal (unset, derived). A setting with neither `doc` nor
    `allowed` shares the row of the one declared before it (a group of keys documented together)."""
    return field(
        default=default,
        default_factory=factory,
        metadata={"check": check, "doc": doc, "allowed": allowed, "shown": shown},
    )


def section(kind: type) -> Any:
    """A nested section: a mapping of its own fields, each checked by its own declaration."""
    return field(default_factory=kind, metadata={"check": kind})


def _rule(allowed: str, accepts: Callable[[Any], bool], clean: Callable[[Any], Any] = lambda value: value) -> Check:
    def check(value: Any) -> Any:
        if not accepts(value):
            raise _Bad(f"must be {allowed}", value)
        return clean(value)

    return check


def _is_number(value: Any) -> bool:
    if isinstance(value, bool):
        return False
    return isinstance(value, int) or (isinstance(value, float) and math.isfinite(value))  # an int of any size


def _upto(high: float | None) -> str:
    return "" if high is None else f" and at most {high:g}"


def boolean() -> Check:
    return _rule("true or false", lambda value: isinstance(value, bool))


def int_in(low: int, high: int) -> Check:
    return _rule(
        f"an integer from {low} to {high}",
        lambda value: isinstance(value, int) and not isinstance(value, bool) and low <= value <= high,
    )


def greater_than(low: int, high: float) -> Check:
    return _rule(
        f"a number greater than {low}{_upto(high)}", lambda value: _is_number(value) and low < value <= high, float
    )


def at_least(low: float, high: float) -> Check:
    return _rule(
        f"a number of at least {low:g}{_upto(high)}", lambda value: _is_number(value) and low <= value <= high, float
    )


def between(low: int, high: int) -> Check:
    return _rule(
        f"a number between {low} and {high} (exclusive)", lambda value: _is_number(value) and low < value < high, float
    )


def choice(*allowed: str, any_case: bool = False) -> Check:
    """One of `allowed`; with any_case, in any case and stored as written in `allowed` (upper case)."""
    fold: Callable[[Any], Any] = str.upper if any_case else lambda value: value
    return _rule(f"one of {list(allowed)}", lambda value: isinstance(value, str) and fold(value) in allowed, fold)


def text(*, label_value: bool = False) -> Check:
    """A non-empty string; a label value is also at most _MAX_LABEL_VALUE characters."""

    def check(value: Any) -> str:
        if not isinstance(value, str) or not value.strip():
            raise _Bad("must be a non-empty string", value)
        if label_value and len(value) > _MAX_LABEL_VALUE:
            raise _Bad(f"must be at most {_MAX_LABEL_VALUE} characters (it is a label value)", value)
        return value

    return check


def optional(check: Check) -> Check:
    """None (YAML null: leave it unset), or a value `check` accepts."""
    return lambda value: None if value is None else check(value)


def url() -> Check:
    return _rule("a URL such as http://host:port", lambda value: isinstance(value, str) and bool(_URL.match(value)))


MAX_PATH_CHARS = 4096  # Linux's PATH_MAX


def file_path() -> Check:
    """A file or directory path: non-empty, at most MAX_PATH_CHARS characters, no control character (a NUL cannot be
    in a path at all, and a newline or escape in one garbles every log line and dump name that shows it)."""

    def check(value: Any) -> str:
        if not isinstance(value, str) or not value.strip():
            raise _Bad("must be a non-empty path", value)
        if (bad := CONTROL_CHARACTERS.search(value)) is not None:
            raise _Bad(f"must be a path without control characters (it has {bad.group()!r} at {bad.start()})", value)
        if len(value) > MAX_PATH_CHARS:
            raise _Bad(f"must be a path of at most {MAX_PATH_CHARS} characters", value)
        return value

    return check


def readable_file() -> Check:
    def check(value: Any) -> str:
        clean: str = file_path()(value)
        if not (os.path.isfile(clean) and os.access(clean, os.R_OK)):
            raise _Bad("must be the path of a readable file", value)
        return clean

    return check


def _strings(value: Any) -> list[str] | None:
    """A string or a list of strings, as a list; None for anything else."""
    items = [value] if isinstance(value, str) else value
    if isinstance(items, (list, tuple)) and all(isinstance(item, str) for item in items):
        return list(items)
    return None


def _close(word: Any, allowed: Sequence[str]) -> str | None:
    close = difflib.get_close_matches(str(word), list(allowed), n=1)
    return close[0] if close else None


def names(allowed_names: Sequence[str] | Callable[[], Sequence[str]], *, at_least_one: bool = False) -> Check:
    """A name or a list of names from `allowed_names` (repeats dropped); a misspelt name gets a did-you-mean hint.
    A callable is asked at each check (a registry that a user's plug-in may have added to)."""

    def check(value: Any) -> tuple[str, ...]:
        allowed = allowed_names() if callable(allowed_names) else allowed_names
        items = _strings(value)
        if items is None:
            raise _Bad(f"must be a name or a list of names from {list(allowed)}", value)
        bad = [
            f"'{item}' (did you mean '{close}'?)" if (close := _close(item, allowed)) else f"'{item}'"
            for item in items
            if item not in allowed
        ]
        if bad:
            raise _Bad(f"unknown name(s) {', '.join(bad)}; allowed: {list(allowed)}", value)
        if at_least_one and not items:
            raise _Bad(f"needs at least one of {list(allowed)}", value)
        return tuple(dict.fromkeys(items))

    return check


def class_names() -> Check:
    """A Python class name or a list of them."""

    def check(value: Any) -> tuple[str, ...]:
        items = _strings(value)
        if items is None:
            raise _Bad("must be a class name or a list of class names", value)
        bad = [f"'{item}'" for item in items if not item.isidentifier()]
        if bad:
            raise _Bad(f"{', '.join(bad)} is not a class name (a Python identifier such as UploadCallback)", value)
        return tuple(dict.fromkeys(items))

    return check


def regexes() -> Check:
    """A regular expression or a list of them."""

    def check(value: Any) -> tuple[str, ...]:
        items = _strings(value)
        if items is None:
            raise _Bad("must be a regular expression or a list of them", value)
        for pattern in items:
            try:
                re.compile(pattern)
            except re.error as exc:
                raise _Bad(f"'{pattern}' is not a valid regular expression ({exc})", value) from None
        return tuple(items)

    return check


def regex() -> Check:
    """One regular expression."""

    def check(value: Any) -> str:
        if not isinstance(value, str):
            raise _Bad("must be one regular expression (a string)", value)
        try:
            re.compile(value)
        except re.error as exc:
            raise _Bad(f"'{value}' is not a valid regular expression ({exc})", value) from None
        return value

    return check


def mapping(what: str, entry: Callable[[Any, Any], tuple[Any, Any]], *, secret: bool = False) -> Check:
    """A mapping of `what`, checked entry by entry (`entry` returns the clean key and value); each bad entry is its
    own problem. None is the empty mapping; a secret mapping is never shown."""

    def check(value: Any) -> dict[Any, Any]:
        if value is None:
            return {}
        if not isinstance(value, Mapping):
            raise _Bad(f"must be a mapping of {what}", REDACTED if secret else value)
        out, problems = {}, []
        for key, item in value.items():
            try:
                clean_key, clean_item = entry(key, item)
                out[clean_key] = clean_item
            except _Bad as bad:
                problems += bad.problems
        if problems:
            combined = _Bad(*problems[0])
            combined.problems = problems
            raise combined
        return out

    return check
