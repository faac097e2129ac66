"""`ms-exporter top`: a live table of every rank's training health, polled from the ranks' own /metrics endpoints.

Three layers that know nothing of each other's insides: targets and polling (`Poller`: URLs and file_sd
directories, fetched in a thread pool), rows (`build_row`, `mark_slowest`: pure functions of parsed samples and
the previous poll), and rendering (`render`: rows to lines of text; `plain_text` for `--once`, curses for the
live screen). docs/top.md says what every column means.
"""

from __future__ import annotations

import argparse
import base64
import contextlib
import json
import math
import os
import re
import ssl
import statistics
import sys
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterable, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from concurrent.futures import wait as wait_for
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

from ms_exporter._version import __version__
from ms_exporter.core import catalogue
from ms_exporter.core.replicas import disagreeing
from ms_exporter.core.thresholds import DEFAULTS, is_straggler

PASSWORD_ENV = "MS_EXPORTER_TOP_PASSWORD"
STALE_SECONDS = 60.0
# A counter that went up (a threshold breach, a non-finite loss) stays in the alerts column this long, so that
# an episode is not a flash of one refresh.
ALERT_HOLD_SECONDS = 60.0
# Ranks of a synchronous job have step cycles within a few percent of each other; among the ranks this close to
# the longest cycle, the one with the largest data-wait share is the one the others wait for.
SYNC_TOLERANCE = 0.10
MAX_PAGE_BYTES = 16 * 1024 * 1024
TARGET_HELP = (
    "a URL (http[s]://host:port[/path], path default /metrics), host:port, a directory of file_sd "
    "*.json files or one such file"
)

_HOST_PORT = re.compile(r"^(\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9_.-]+):(\d{1,5})$")
_HOST_PORT_PATH = re.compile(r"^(\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9_.-]+):(\d{1,5})/")
# Preferred first: the device memory in use when the device reports it, else the process's resident set.
# The memory column's kind (catalogue.MEMORY_IN_USE_ORDER: in use on the device, else the host's) and its short name.
_MEMORY_SHORT = {
    catalogue.DEVICE_ALLOCATED: "dev",
    catalogue.DEVICE_RESERVED: "dev-res",
    catalogue.HOST_RSS: "rss",
    catalogue.DEVICE_PEAK: "dev-peak",
}


# -- targets ---------------------------------------------------------------------------------------------------


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


# -- rows ------------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Row:
    """What the table shows for one rank (or one unreachable target, with `error` set)."""

    target: str
    rank: str | None
    project: str | None
    step: float | None = None
    loss: float | None = None
    loss_smoothed: float | None = None
    tokens_per_second: float | None = None
    mfu: float | None = None  # model FLOPs utilisation, where the rank knows its device's peak
    step_seconds: float | None = None
    wait_seconds: float | None = None  # data wait per step, as the straggler rule counts it
    grad_norm: float | None = None
    memory_bytes: float | None = None
    memory_kind: str | None = None
    age_seconds: float | None = None
    alerts: tuple[str, ...] = ()
    error: str | None = None
    slowest: bool = False
    phase: str | None = None  # mindspore_train_phase: compile, step, data_wait, eval, ..., ended
    fingerprint: tuple[str, float, float] | None = None  # (replica group, step, value) of the last fingerprint

    @property
    def ended(self) -> bool:
        """The rank said its training ended normally (its endpoint may be gone since)."""
        return self.phase == catalogue.ENDED

    @property
    def cycle_seconds(self) -> float | None:
        """Step time plus data wait: the rank's whole time per step."""
        if self.step_seconds is None:
            return None
        return self.step_seconds + (self.wait_seconds or 0.0)


@dataclass(frozen=True)
class History:
    """What one rank's previous poll left behind for the next: counters for deltas, and held alerts."""

    duration: tuple[float, float] | None = None  # step duration (_sum, _count)
    wait_sum: float | None = None
    step_seconds: float | None = None
    wait_seconds: float | None = None
    counters: dict[str, float] = field(default_factory=dict)
    held: dict[str, float] = field(default_factory=dict)  # alert -> shown until (unix seconds)
    row: Row | None = None  # what this poll showed: an ended rank keeps its last row once its endpoint goes


class RankSamples:
    """The samples of one rank (one `project`, `rank` pair) of one scrape, by name."""

    def __init__(self, samples: Iterable[Any]) -> None:
        self._by_name: dict[str, list[tuple[dict[str, str], float]]] = {}
        for sample in samples:
            self._by_name.setdefault(sample.name, []).append((sample.labels, float(sample.value)))

    def value(self, name: str, **labels: str) -> float | None:
        for found, value in self._by_name.get(name, ()):
            if all(found.get(k) == v for k, v in labels.items()):
                return value
        return None

    def by_label(self, name: str, label: str) -> dict[str, float]:
        return {found[label]: value for found, value in self._by_name.get(name, ()) if label in found}


def parse_ranks(text: str) -> dict[tuple[str, str], RankSamples]:
    """The samples of a /metrics page grouped by (project, rank); series without a `rank` label are left out.

    Raises ValueError when the page is not the Prometheus text format.
    """
    groups: dict[tuple[str, str], list[Any]] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            rank = sample.labels.get("rank")
            if rank is not None:
                groups.setdefault((sample.labels.get("project", ""), rank), []).append(sample)
    return {key: RankSamples(samples) for key, samples in groups.items()}


def build_row(
    target: str,
    project: str,
    rank: str,
    samples: RankSamples,
    history: History | None,
    now: float,
    stale_seconds: float = STALE_SECONDS,
    hold_seconds: float = ALERT_HOLD_SECONDS,
) -> tuple[Row, History]:
    """One rank's row from its samples and its previous poll (None on the first), and the history for the next.

    Step time and data wait are means over the steps since the previous poll (from the histograms' _sum and
    _count), the last such mean when no step ended in between, and the mean over the whole run on the first poll
    or after the counters went back (a restarted rank).
    """
    duration_sum = samples.value(catalogue.STEP_DURATION.sum)
    duration_count = samples.value(catalogue.STEP_DURATION.count)
    duration = None if duration_sum is None or duration_count is None else (duration_sum, duration_count)
    wait_sum = samples.value(catalogue.DATA_WAIT.sum)
    step_seconds, wait_seconds = _step_means(duration, wait_sum, history)

    counters = {
        f"breach {metric}": value for metric, value in samples.by_label(catalogue.BREACHES.name, "metric").items()
    }
    nonfinite = samples.value(catalogue.NONFINITE_LOSS.name)
    if nonfinite is not None:
        counters["non-finite loss"] = nonfinite
    held = {alert: until for alert, until in (history.held.items() if history else ()) if until > now}
    if history is not None:  # on the first poll a counter above 0 is history, not news
        for alert, value in counters.items():
            if value > history.counters.get(alert, 0.0):
                held[alert] = now + hold_seconds

    loss = samples.value(catalogue.LOSS.name)
    timestamp = samples.value(catalogue.LAST_STEP_TIMESTAMP.name)
    age = max(0.0, now - timestamp) if timestamp is not None else None
    alerts: list[str] = []
    if loss is not None and not math.isfinite(loss):
        alerts.append(f"loss {_number(loss)}")
    elif "non-finite loss" in held:
        alerts.append("non-finite loss")
    alerts.extend(sorted(alert for alert in held if alert.startswith("breach ")))
    phases = samples.by_label(catalogue.PHASE.name, "phase")
    phase = next((name for name, value in phases.items() if value == 1), None)
    if phase != catalogue.ENDED and age is not None and age > stale_seconds:  # an ended rank is not stalled
        alerts.append(f"no step for {_age(age)}")
    disabled = samples.by_label(catalogue.COMPONENT_DISABLED.name, "component")
    alerts.extend(f"{component} disabled" for component, value in sorted(disabled.items()) if value >= 1)

    memory = samples.by_label(catalogue.MEMORY_BYTES.name, "kind")
    memory_bytes = memory_kind = None
    for kind in catalogue.MEMORY_IN_USE_ORDER:
        if kind in memory:
            memory_bytes, memory_kind = memory[kind], _MEMORY_SHORT[kind]
            break
    alerts.extend(_memory_growth(samples))

    row = Row(
        target=target,
        rank=rank,
        project=project,
        step=samples.value(catalogue.GLOBAL_STEP.name),
        loss=loss,
        loss_smoothed=samples.value(catalogue.LOSS_SMOOTHED.name),
        tokens_per_second=samples.value(catalogue.TOKENS_PER_SECOND.name),
        mfu=samples.value(catalogue.MFU.name),
        step_seconds=step_seconds,
        wait_seconds=wait_seconds,
        grad_norm=samples.value(catalogue.GRAD_NORM.name),
        memory_bytes=memory_bytes,
        memory_kind=memory_kind,
        age_seconds=age,
        alerts=tuple(alerts),
        phase=phase,
        fingerprint=_fingerprint(samples),
    )
    return row, History(duration, wait_sum, step_seconds, wait_seconds, counters, held, row)


def _memory_growth(samples: RankSamples) -> list[str]:
    """MindSporeTrainingMemoryGrowth's condition, per memory kind, with its default thresholds: grown more than
    `memory_growth_ratio` over the post-warm-up baseline and still growing (faster than `memory_growth_rate`)."""
    ratios = samples.by_label(catalogue.MEMORY_GROWTH_RATIO.name, "kind")
    rates = samples.by_label(catalogue.MEMORY_GROWTH_RATE.name, "kind")
    return [
        f"memory +{ratio:.0%} {_MEMORY_SHORT.get(kind, kind)}"
        for kind, ratio in sorted(ratios.items())
        if ratio > DEFAULTS.memory_growth_ratio and rates.get(kind, 0) > DEFAULTS.memory_growth_rate
    ]


def _step_means(
    duration: tuple[float, float] | None, wait_sum: float | None, history: History | None
) -> tuple[float | None, float | None]:
    """(step time, data wait) per step; data wait is None when the rank does not export it."""
    if duration is None:
        return None, None
    total, count = duration
    if history is not None and history.duration is not None:
        before_total, before_count = history.duration
        if count > before_count:
            steps = count - before_count
            wait = None if wait_sum is None else max(0.0, wait_sum - (history.wait_sum or 0.0)) / steps
            return (total - before_total) / steps, wait
        if count == before_count and history.step_seconds is not None:
            return history.step_seconds, history.wait_seconds
    if count > 0:
        return total / count, None if wait_sum is None else wait_sum / count
    return None, None


def down_row(target: Target, error: str) -> Row:
    return Row(target=target.url, rank=target.rank, project=target.project, error=error)


def gone_rows(url: str, histories: Mapping[tuple[str, str, str], History], error: str) -> list[Row] | None:
    """The rows of a target that no longer answers, when every rank it served had ended normally: their last
    rows, marked as ended with the endpoint gone. None when it did not end (the target is down)."""
    last = [history.row for key, history in histories.items() if key[0] == url and history.row is not None]
    if not last or not all(row.ended for row in last):
        return None
    return [replace(row, alerts=(f"ended; endpoint gone ({error})",), age_seconds=None) for row in last]


def _fingerprint(samples: RankSamples) -> tuple[str, float, float] | None:
    values = samples.by_label(catalogue.PARAM_FINGERPRINT.name, "replica_group")
    steps = samples.by_label(catalogue.PARAM_FINGERPRINT_STEP.name, "replica_group")
    group = next(iter(values), None)
    return None if group is None or group not in steps else (group, steps[group], values[group])


def mark_diverged(rows: Sequence[Row]) -> list[Row]:
    """Adds "diverged" to the alerts of the ranks MindSporeTrainingReplicaDivergence names: per project and replica
    group, at a step every rank of the group reports (`replicas.disagreeing`, the alert's rule)."""
    groups: dict[tuple[str | None, str], dict[int, tuple[float, float]]] = {}
    for index, row in enumerate(rows):
        if row.error is None and row.fingerprint is not None:
            group, step, value = row.fingerprint
            groups.setdefault((row.project, group), {})[index] = (step, value)
    named = set().union(*(disagreeing(members) for members in groups.values()))
    return [replace(row, alerts=(*row.alerts, "diverged")) if index in named else row for index, row in enumerate(rows)]


def mark_slowest(rows: Sequence[Row], tolerance: float = SYNC_TOLERANCE) -> list[Row]:
    """Marks, per project, the rank the job waits for (with at least two ranks that report a step time).

    That is the rank with the longest step cycle (step time + data wait); among ranks whose cycle is within
    `tolerance` of the longest, the one with the largest data-wait share. Ranks that do not synchronise run at
    their own pace, and the slow one has the longest cycle. Ranks that meet in a collective every step all have
    the same cycle: the slow one arrives late because of work between steps, so its step is short and its data
    wait long, while the others' steps grow by the time they wait for it. This picks one rank even when none is
    far off; a rank that MindSporeTrainingStraggler would page for (`thresholds.is_straggler`, the same rule and
    thresholds as the alert) also gets "straggler" in its alerts.
    """
    by_project: dict[str | None, list[int]] = {}
    for index, row in enumerate(rows):
        if row.error is None and row.cycle_seconds is not None:
            by_project.setdefault(row.project, []).append(index)
    chosen: set[int] = set()
    stragglers: set[int] = set()
    for indices in by_project.values():
        if len(indices) < 2:
            continue
        cycles = {i: rows[i].cycle_seconds or 0.0 for i in indices}
        waits = {i: rows[i].wait_seconds or 0.0 for i in indices}
        longest = max(cycles.values())
        candidates = [i for i in indices if cycles[i] >= (1.0 - tolerance) * longest]
        chosen.add(max(candidates, key=lambda i: (_wait_share(rows[i]), cycles[i])))
        median_wait, median_cycle = statistics.median(waits.values()), statistics.median(cycles.values())
        stragglers.update(i for i in indices if is_straggler(waits[i], cycles[i], median_wait, median_cycle))
    return [
        replace(row, slowest=index in chosen, alerts=(*row.alerts, "straggler") if index in stragglers else row.alerts)
        for index, row in enumerate(rows)
    ]


def _wait_share(row: Row) -> float:
    cycle = row.cycle_seconds
    return (row.wait_seconds or 0.0) / cycle if cycle else 0.0


def _sort_key(row: Row) -> tuple[bool, str, int, str, str]:
    """By project and rank; targets that never said which rank they are (down URLs) last."""
    rank = row.rank if row.rank is not None else ""
    return (row.rank is None, row.project or "", int(rank) if rank.isdigit() else sys.maxsize, rank, row.target)


# -- rendering -------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Line:
    text: str
    style: str = "normal"  # "title", "header", "slowest", "down", "alert", "normal"


@dataclass(frozen=True)
class Screen:
    """The rendered table: the title and header stay put, the rows scroll, the footer explains the marker."""

    title: Line
    header: Line
    rows: list[Line]
    footer: list[Line]


@dataclass(frozen=True)
class _Column:
    header: str
    cell: Callable[[Row], str]
    left: bool = False


def _up(cell: Callable[[Row], str]) -> Callable[[Row], str]:
    return lambda row: "-" if row.error is not None else cell(row)


def _memory(row: Row) -> str:
    return "-" if row.memory_bytes is None else f"{_bytes(row.memory_bytes)} {row.memory_kind}"


def _alerts(row: Row) -> str:
    return f"DOWN: {row.error}" if row.error is not None else ", ".join(row.alerts)


# Left to right in the order they are given up when the terminal is narrow (from the right); ALERTS, the reason
# to look, is never dropped: it is the last column and gets whatever width is left.
COLUMNS = (
    _Column("", lambda row: ">" if row.slowest else "", left=True),
    _Column("RANK", lambda row: row.rank if row.rank is not None else "?"),
    _Column("STEP", _up(lambda row: _integer(row.step))),
    _Column("LOSS", _up(lambda row: _number(row.loss))),
    _Column("SMOOTHED", _up(lambda row: _number(row.loss_smoothed))),
    _Column("TOKENS/S", _up(lambda row: _rate(row.tokens_per_second))),
    _Column("MFU", _up(lambda row: _percent(row.mfu))),
    _Column("STEP TIME", _up(lambda row: _duration(row.step_seconds))),
    _Column("DATA WAIT", _up(lambda row: _duration(row.wait_seconds))),
    _Column("GRAD NORM", _up(lambda row: _number(row.grad_norm, 4))),
    _Column("MEMORY", _up(_memory)),
    _Column("LAST STEP", _up(lambda row: "-" if row.age_seconds is None else _age(row.age_seconds) + " ago")),
    _Column("PHASE", _up(lambda row: row.phase or "-"), left=True),
    _Column("PROJECT", lambda row: row.project or "-", left=True),
    _Column("TARGET", lambda row: row.target, left=True),
)
ALERTS_HEADER = "ALERTS"
_ALERTS_MIN_WIDTH = 12
_GAP = "  "


def render(rows: Sequence[Row], width: int | None = None, status: str = "") -> Screen:
    """The table for `rows` in `width` columns (None: as wide as it takes), `status` at the end of the title
    line. Pure: no terminal, no clock."""
    cells = [[printable(column.cell(row)) for column in COLUMNS] for row in rows]
    alerts = [printable(_alerts(row)) for row in rows]
    widths = [max([len(column.header), *(len(line[i]) for line in cells)]) for i, column in enumerate(COLUMNS)]
    keep = len(COLUMNS)
    if width is not None:
        alerts_need = min(max([len(ALERTS_HEADER), *map(len, alerts)]), _ALERTS_MIN_WIDTH)
        while keep > 2 and sum(widths[:keep]) + len(_GAP) * keep + alerts_need > width:
            keep -= 1

    def line(values: Sequence[str], tail: str) -> str:
        parts = [
            value.ljust(widths[i]) if COLUMNS[i].left else value.rjust(widths[i])
            for i, value in enumerate(values[:keep])
        ]
        text = _GAP.join([*parts, tail]).rstrip()
        return _fit(text, width)

    header = Line(line([column.header for column in COLUMNS], ALERTS_HEADER), "header")
    body = []
    for row, values, alert in zip(rows, cells, alerts, strict=True):
        style = (
            "slowest"
            if row.slowest
            else "down"
            if row.error is not None
            else "alert"
            if row.alerts and not row.ended
            else "normal"
        )
        body.append(Line(line(values, alert), style))

    ended = sum(1 for row in rows if row.error is None and row.ended)
    up = sum(1 for row in rows if row.error is None) - ended
    summary = (
        f"{up} up, " + (f"{ended} ended, " if ended else "") + f"{len(rows) - up - ended} down"
        if rows
        else "no targets yet"
    )
    title = Line(_fit(f"ms-exporter top - {summary}" + (f" - {status}" if status else ""), width), "title")
    footer = [Line(_fit(_slowest_text(row), width)) for row in rows if row.slowest]
    if footer:
        footer.append(
            Line(
                _fit(
                    "> marks the rank the job waits for: the longest step cycle (step + data wait); "
                    f"among ranks within {SYNC_TOLERANCE:.0%} of it, the largest data-wait share",
                    width,
                )
            )
        )
    return Screen(title, header, body, footer)


def _slowest_text(row: Row) -> str:
    project = f" of {row.project}" if row.project else ""
    return (
        f"> slowest: rank {row.rank}{project}, step cycle {_duration(row.cycle_seconds)} = step "
        f"{_duration(row.step_seconds)} + data wait {_duration(row.wait_seconds)}"
    )


def plain_text(screen: Screen) -> str:
    lines = [screen.title, screen.header, *screen.rows, *screen.footer]
    return "\n".join(line.text for line in lines) + "\n"


def printable(text: str) -> str:
    """Label values and error texts come from the targets: a control character (an escape sequence that would
    move the cursor, recolour or retitle the operator's terminal) is shown as its escape, never sent."""
    if text.isprintable():
        return text
    return "".join(c if c.isprintable() else c.encode("unicode_escape").decode("ascii") for c in text)


def _fit(text: str, width: int | None) -> str:
    text = printable(text)
    if width is None or len(text) <= width:
        return text
    return text[: max(0, width - 1)] + "~" if width > 0 else ""


def _integer(value: float | None) -> str:
    return "-" if value is None or not math.isfinite(value) else str(int(value))


def _number(value: float | None, digits: int = 5) -> str:
    if value is None:
        return "-"
    if math.isnan(value):
        return "NaN"
    if math.isinf(value):
        return "Inf" if value > 0 else "-Inf"
    return f"{value:.{digits}g}"


def _percent(value: float | None) -> str:
    return "-" if value is None or not math.isfinite(value) else f"{100 * value:.1f}%"


def _rate(value: float | None) -> str:
    if value is None or not math.isfinite(value):
        return _number(value)
    for limit, suffix in ((1e9, "G"), (1e6, "M"), (1e3, "k")):
        if abs(value) >= limit:
            return f"{value / limit:.3g}{suffix}"
    return f"{value:.1f}"


def _duration(value: float | None) -> str:
    if value is None or not math.isfinite(value):
        return _number(value)
    if value < 1e-3:
        return f"{value * 1e6:.0f}us"
    if value < 1.0:
        return f"{value * 1e3:.1f}ms"
    if value < 60.0:
        return f"{value:.2f}s"
    return _age(value)


def _age(seconds: float) -> str:
    total = int(seconds)
    if total < 60:
        return f"{total}s"
    if total < 3600:
        return f"{total // 60}m{total % 60:02d}s"
    if total < 86400:
        return f"{total // 3600}h{total % 3600 // 60:02d}m"
    return f"{total // 86400}d{total % 86400 // 3600:02d}h"


def _bytes(value: float) -> str:
    unit = "B"
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(value) < 1024 or unit == "TiB":
            break
        value /= 1024
    return f"{value:.0f}{unit}" if unit == "B" else f"{value:.1f}{unit}"


# -- polling ---------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Access:
    """How to reach the endpoints: basic auth, TLS and the per-request timeout."""

    timeout: float = 2.0
    user: str | None = None
    password: str | None = None
    context: ssl.SSLContext | None = None


class FetchError(Exception):
    """A target that did not give a page: the message is what the DOWN row shows."""


def fetch(url: str, access: Access) -> str:
    """GET one /metrics page. Proxies from the environment are not used: ranks are dialled directly."""
    request = urllib.request.Request(
        url, headers={"Accept": "text/plain; version=0.0.4", "User-Agent": f"ms-exporter-top/{__version__}"}
    )
    if access.user is not None:
        token = base64.b64encode(f"{access.user}:{access.password or ''}".encode()).decode()
        request.add_header("Authorization", f"Basic {token}")
    opener = urllib.request.build_opener(
        urllib.request.ProxyHandler({}), urllib.request.HTTPSHandler(context=access.context)
    )
    try:
        with opener.open(request, timeout=access.timeout) as response:
            body: bytes = response.read(MAX_PAGE_BYTES + 1)
    except urllib.error.HTTPError as exc:
        hint = " (check --user and the password)" if exc.code == 401 else ""
        raise FetchError(f"HTTP {exc.code} {exc.reason}{hint}") from None
    except urllib.error.URLError as exc:
        reason = exc.reason
        if isinstance(reason, ssl.SSLCertVerificationError):
            raise FetchError(f"TLS: {reason.verify_message} (--cafile, or --insecure)") from None
        if isinstance(reason, TimeoutError):
            raise FetchError(f"timed out after {access.timeout:g}s") from None
        raise FetchError(
            str(reason.strerror) if isinstance(reason, OSError) and reason.strerror else str(reason)
        ) from None
    except TimeoutError:
        raise FetchError(f"timed out after {access.timeout:g}s") from None
    except (OSError, ValueError) as exc:  # a connection reset mid-read, a malformed response
        raise FetchError(str(exc) or type(exc).__name__) from None
    if len(body) > MAX_PAGE_BYTES:
        raise FetchError(f"page larger than {MAX_PAGE_BYTES // 2**20} MiB")
    return body.decode("utf-8", errors="replace")


class Poller:
    """Polls every target at once in a thread pool: a rank that hangs costs one slot and shows DOWN, and is not
    asked again until its request ends, while the others are shown as usual."""

    def __init__(
        self,
        specs: Sequence[TargetSpec],
        access: Access | None = None,
        scheme: str = "http",
        stale_seconds: float = STALE_SECONDS,
        fetcher: Callable[[str, Access], str] = fetch,
        clock: Callable[[], float] = time.time,
        max_workers: int = 32,
    ) -> None:
        self._specs = list(specs)
        self._access = access or Access()
        self._scheme = scheme
        self._stale_seconds = stale_seconds
        self._fetch = fetcher
        self._clock = clock
        self._executor = ThreadPoolExecutor(max_workers=max_workers, thread_name_prefix="ms-exporter-top")
        self._pending: dict[str, Future[str]] = {}
        self._histories: dict[tuple[str, str, str], History] = {}
        # Ranks whose target left discovery (a file_sd file removed) before they said they ended: shown DOWN until
        # the same project and rank report again.
        self._vanished: dict[tuple[str, str], Row] = {}

    def poll(self) -> list[Row]:
        targets = expand_targets(self._specs, self._scheme)
        for target in targets:
            if target.problem is None and target.url not in self._pending:
                self._pending[target.url] = self._executor.submit(self._fetch, target.url, self._access)
        waiting = [self._pending[t.url] for t in targets if t.problem is None]
        # urllib's timeout is per socket operation: a page that trickles in could take longer; the poll does not.
        wait_for(waiting, timeout=self._access.timeout + 0.5)
        now = self._clock()
        rows: list[Row] = []
        for target in targets:
            if target.problem is not None:
                rows.append(down_row(target, target.problem))
                continue
            future = self._pending[target.url]
            if not future.done():
                rows.append(down_row(target, f"no answer within {self._access.timeout:g}s"))
                continue
            del self._pending[target.url]
            try:
                groups = parse_ranks(future.result())
            except FetchError as exc:
                rows.extend(gone_rows(target.url, self._histories, str(exc)) or [down_row(target, str(exc))])
                continue
            except Exception as exc:  # the parser's errors are ValueErrors and worse: all mean "not our page"
                rows.append(down_row(target, f"not the Prometheus text format: {exc}"))
                continue
            if not groups:
                rows.append(down_row(target, "no series with a rank label: not an ms_exporter endpoint?"))
                continue
            for (project, rank), samples in groups.items():
                key = (target.url, project, rank)
                row, self._histories[key] = build_row(
                    target.url, project, rank, samples, self._histories.get(key), now, self._stale_seconds
                )
                rows.append(row)
        urls = {target.url for target in targets}
        for key, history in self._histories.items():
            if key[0] not in urls and history.row is not None and not history.row.ended:
                self._vanished[key[1:]] = replace(history.row, error="left discovery without ending")
        self._histories = {key: value for key, value in self._histories.items() if key[0] in urls}
        reporting = {(row.project, row.rank) for row in rows if row.error is None}
        self._vanished = {key: row for key, row in self._vanished.items() if key not in reporting}
        rows.extend(self._vanished.values())
        return mark_diverged(mark_slowest(sorted(rows, key=_sort_key)))

    def close(self) -> None:
        self._executor.shutdown(wait=False, cancel_futures=True)


# -- the command -----------------------------------------------------------------------------------------------


def run_top(args: argparse.Namespace, error: Callable[[str], Any]) -> int:
    """`ms-exporter top`, with arguments declared in cli.py; `error` is the subcommand parser's (exits 2)."""
    if not args.interval > 0:
        error(f"--interval must be a number of seconds > 0, not {args.interval:g}")
    if not args.timeout > 0:
        error(f"--timeout must be a number of seconds > 0, not {args.timeout:g}")
    if not args.stale_seconds > 0:
        error(f"--stale-seconds must be > 0, not {args.stale_seconds:g}")
    specs = []
    for text in args.targets:
        try:
            specs.append(parse_target_argument(text, args.scheme))
        except ValueError as exc:
            error(str(exc))
    password = args.password if args.password is not None else os.environ.get(PASSWORD_ENV)
    if args.user is None and password is not None:
        error(f"a password (--password or {PASSWORD_ENV}) needs --user")
    if args.user is not None and password is None:
        error(f"--user needs a password: --password, or the {PASSWORD_ENV} environment variable")
    if args.insecure and args.cafile:
        error("--cafile and --insecure exclude each other: verify against a CA, or do not verify")
    if (args.cert is None) != (args.key is None):
        error("--cert and --key go together: a client certificate and its private key")
    try:
        context = _tls_context(args)
    except (OSError, ssl.SSLError) as exc:
        error(f"TLS files: {exc}")
    if not args.once and not (sys.stdin.isatty() and sys.stdout.isatty()):
        error("the live view needs a terminal; use --once for plain text")
    poller = Poller(specs, Access(args.timeout, args.user, password, context), args.scheme, args.stale_seconds)
    try:
        if args.once:
            return _run_once(poller)
        return _run_live(poller, args.interval)
    finally:
        poller.close()


def _tls_context(args: argparse.Namespace) -> ssl.SSLContext:
    context = ssl.create_default_context(cafile=args.cafile)
    if args.insecure:
        context.check_hostname = False
        context.verify_mode = ssl.CERT_NONE
    if args.cert:
        context.load_cert_chain(args.cert, args.key)
    return context


def _run_once(poller: Poller) -> int:
    """One poll as plain text; exit status 1 when a target is down or there is none."""
    rows = poller.poll()
    width = os.get_terminal_size().columns if sys.stdout.isatty() else None
    sys.stdout.write(plain_text(render(rows, width, time.strftime("%H:%M:%S"))))
    return 0 if rows and all(row.error is None for row in rows) else 1


class _Latest:
    """The newest poll, handed from the polling thread to the screen."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.changed = threading.Event()
        self.rows: list[Row] | None = None
        self.failure: str | None = None
        self.stamp = ""


def _poll_forever(poller: Poller, interval: float, latest: _Latest, stop: threading.Event) -> None:
    while not stop.is_set():
        started = time.monotonic()
        try:
            rows, failure = poller.poll(), None
        except Exception as exc:  # a bug here must not freeze the screen on old numbers without saying so
            rows, failure = [], f"polling failed: {exc!r}"
        with latest.lock:
            latest.rows, latest.failure, latest.stamp = rows, failure, time.strftime("%H:%M:%S")
        latest.changed.set()
        stop.wait(max(0.0, interval - (time.monotonic() - started)))


def _run_live(poller: Poller, interval: float) -> int:
    import curses

    latest = _Latest()
    stop = threading.Event()
    thread = threading.Thread(
        target=_poll_forever, args=(poller, interval, latest, stop), name="ms-exporter-top-poll", daemon=True
    )
    thread.start()
    try:
        curses.wrapper(_screen_loop, latest, interval)
    except KeyboardInterrupt:
        pass
    except curses.error as exc:  # a terminal curses cannot drive (an unknown TERM)
        print(f"ms-exporter top: cannot drive this terminal ({exc}); --once prints plain text", file=sys.stderr)
        return 1
    finally:
        stop.set()
    return 0


def _screen_loop(stdscr: Any, latest: _Latest, interval: float) -> None:
    import curses

    with contextlib.suppress(curses.error):
        curses.curs_set(0)
    styles = _curses_styles()
    stdscr.timeout(200)  # keys and resizes are answered within 0.2 s, whatever the polls do
    offset = 0
    redraw = True
    while True:
        if latest.changed.is_set():
            latest.changed.clear()
            redraw = True
        if redraw:
            offset = _draw(stdscr, latest, interval, offset, styles)
            redraw = False
        key = stdscr.getch()
        if key in (ord("q"), ord("Q")):
            return
        if key == -1:
            continue
        redraw = True
        height = stdscr.getmaxyx()[0]
        page = max(1, height - 4)
        if key in (curses.KEY_DOWN, ord("j")):
            offset += 1
        elif key in (curses.KEY_UP, ord("k")):
            offset -= 1
        elif key == curses.KEY_NPAGE:
            offset += page
        elif key == curses.KEY_PPAGE:
            offset -= page
        elif key in (curses.KEY_HOME, ord("g")):
            offset = 0
        elif key in (curses.KEY_END, ord("G")):
            offset = sys.maxsize
        # KEY_RESIZE and anything else: just draw again at the new size


def _draw(stdscr: Any, latest: _Latest, interval: float, offset: int, styles: dict[str, int]) -> int:
    import curses

    height, width = stdscr.getmaxyx()
    with latest.lock:
        rows, failure, stamp = latest.rows, latest.failure, latest.stamp
    status = f"{stamp} - every {interval:g}s - q quits, arrows scroll"
    if failure:
        status = f"{status} - {failure}"
    screen = render(rows or [], width, status)
    if rows is None:
        screen = replace(screen, title=Line(_fit("ms-exporter top - polling... - q quits", width), "title"))
    fixed = [screen.title, screen.header]
    footer = screen.footer
    if len(fixed) + len(screen.rows) + len(footer) > height:
        footer = footer[:-1]  # rows before the legend
    room = max(0, height - len(fixed) - len(footer))
    offset = max(0, min(offset, len(screen.rows) - room))
    visible = screen.rows[offset : offset + room]
    if offset + room < len(screen.rows) and visible:
        visible[-1] = Line(_fit(f"... {len(screen.rows) - offset - room + 1} more rows (arrows scroll)", width))
    stdscr.erase()
    for y, line in enumerate([*fixed, *visible, *footer][:height]):
        # Writing the bottom-right cell moves the cursor off the screen, which curses reports; harmless.
        with contextlib.suppress(curses.error):
            stdscr.addnstr(y, 0, line.text, width, styles.get(line.style, 0))
    stdscr.refresh()
    return offset


def _curses_styles() -> dict[str, int]:
    import curses

    styles = {
        "title": curses.A_BOLD,
        "header": curses.A_BOLD | curses.A_UNDERLINE,
        "slowest": curses.A_REVERSE,
        "down": curses.A_BOLD,
        "alert": curses.A_BOLD,
    }
    with contextlib.suppress(curses.error):
        if curses.has_colors():
            curses.start_color()
            curses.use_default_colors()
            curses.init_pair(1, curses.COLOR_RED, -1)
            curses.init_pair(2, curses.COLOR_YELLOW, -1)
            styles["down"] |= curses.color_pair(1)
            styles["alert"] |= curses.color_pair(2)
    return styles
