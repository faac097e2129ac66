"""`top`'s table as text: rows to lines, the columns in the order a narrow terminal drops them (docs/top.md)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from ms_exporter.core.compat import zip_strict
from ms_exporter.tools.top.formats import age, duration, fit, integer, number, percent, printable, rate, size
from ms_exporter.tools.top.rows import SYNC_TOLERANCE, Row


@dataclass(frozen=True)
class Line:
    text: str
    style: str = "normal"  # "title", "header", "critical", "slowest", "down", "alert", "normal"
    dim: tuple[tuple[int, int], ...] = ()  # (start, end) of the cells drawn dimmed: a stalled rank's stale values


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
    of_last_step: bool = False  # a value of the last step: stale while the rank is stalled


def _up(cell: Callable[[Row], str]) -> Callable[[Row], str]:
    return lambda row: "-" if row.error is not None else cell(row)


def _memory(row: Row) -> str:
    return "-" if row.memory_bytes is None else f"{size(row.memory_bytes)} {row.memory_kind}"


def _temperature(row: Row) -> str:
    return "-" if row.temperature is None else f"{row.temperature[1]:.0f}C {row.temperature[0]}"


def _throttled(row: Row) -> str:
    return "-" if row.throttled is None else ",".join(row.throttled) or "no"


def _utilization(row: Row) -> str:
    return "-" if row.utilization is None else f"{percent(row.utilization[1])} {row.utilization[0]}"


def _alerts(row: Row) -> str:
    if row.error is not None:
        return f"DOWN: {row.error}"
    # An ended rank says so (not an error); one whose endpoint went already says "ended; endpoint gone".
    ended = ("ended",) if row.ended and not any(alert.startswith("ended") for alert in row.alerts) else ()
    return ", ".join((*ended, *row.alerts))


def _style(row: Row) -> str:
    if row.error is not None:
        return "down"
    if row.critical:
        return "critical"
    if row.slowest:
        return "slowest"
    return "alert" if row.alerts and not row.ended else "normal"


# Left to right in the order they are given up when the terminal is narrow (from the right); ALERTS, the reason
# to look, is never dropped: it is the last column and gets whatever width is left.
COLUMNS = (
    _Column("", lambda row: ">" if row.slowest else "", left=True),
    _Column("RANK", lambda row: row.rank if row.rank is not None else "?"),
    _Column("STEP", _up(lambda row: integer(row.step))),
    _Column("LOSS", _up(lambda row: number(row.loss)), of_last_step=True),
    _Column("SMOOTHED", _up(lambda row: number(row.loss_smoothed)), of_last_step=True),
    _Column("TOKENS/S", _up(lambda row: rate(row.tokens_per_second)), of_last_step=True),
    _Column("MFU", _up(lambda row: percent(row.mfu)), of_last_step=True),
    _Column("STEP TIME", _up(lambda row: duration(row.step_seconds)), of_last_step=True),
    _Column("DATA WAIT", _up(lambda row: duration(row.wait_seconds)), of_last_step=True),
    _Column("GRAD NORM", _up(lambda row: number(row.grad_norm, 4)), of_last_step=True),
    _Column("MEMORY", _up(_memory)),
    _Column("DEVICE TEMP", _up(_temperature)),
    _Column("THROTTLED", _up(_throttled)),
    _Column("LAST STEP", _up(lambda row: "-" if row.age_seconds is None else age(row.age_seconds) + " ago")),
    _Column("PHASE", _up(lambda row: row.phase or "-"), left=True),
    _Column("DEVICE UTIL", _up(_utilization)),
    _Column("PROJECT", lambda row: row.project or "-", left=True),
    _Column("TARGET", lambda row: row.target, left=True),
)
ALERTS_HEADER = "ALERTS"
# The alerts column keeps at least this many columns when others are dropped: an ended rank's "ended, straggler"
# (16) whole; 12 cut it to "ended, strag~" when the other columns happened to fill the rest.
_ALERTS_MIN_WIDTH = 18
_GAP = "  "


def render(rows: Sequence[Row], width: int | None = None, status: str = "") -> Screen:
    """The table for `rows` in `width` columns (None: as wide as it takes), `status` at the end of the title
    line. Pure: no terminal, no clock."""
    cells = [[_cell(column, row) for column in COLUMNS] for row in rows]
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
        return fit(text, width)

    def dimmed(row: Row, values: Sequence[str]) -> tuple[tuple[int, int], ...]:
        """Where the stale cells of a stalled rank are on its line (their padded width)."""
        if row.stall is None or row.error is not None:
            return ()
        spans, start = [], 0
        for i in range(keep):
            if COLUMNS[i].of_last_step and values[i] != "-":
                spans.append((start, start + widths[i]))
            start += widths[i] + len(_GAP)
        return tuple(spans)

    header = Line(line([column.header for column in COLUMNS], ALERTS_HEADER), "header")
    body = [
        Line(line(values, alert), _style(row), dimmed(row, values))
        for row, values, alert in zip_strict(rows, cells, alerts)
    ]

    ended = sum(1 for row in rows if row.error is None and row.ended)
    up = sum(1 for row in rows if row.error is None) - ended
    summary = (
        f"{up} up, " + (f"{ended} ended, " if ended else "") + f"{len(rows) - up - ended} down"
        if rows
        else "no targets yet"
    )
    title = Line(fit(f"ms-exporter top - {summary}" + (f" - {status}" if status else ""), width), "title")
    footer = [Line(fit(_slowest_text(row), width)) for row in rows if row.slowest]
    if footer:
        footer.append(
            Line(
                fit(
                    "> marks the rank the job waits for: the longest step cycle (step + data wait); "
                    f"among ranks within {SYNC_TOLERANCE:.0%} of it, the largest data-wait share",
                    width,
                )
            )
        )
    return Screen(title, header, body, footer)


def _cell(column: _Column, row: Row) -> str:
    """The column's text for the row; a value of the last step of a stalled rank in parentheses: stale (plain text
    has no grey; the live screen also dims it)."""
    text = printable(column.cell(row))
    if column.of_last_step and row.stall is not None and row.error is None and text != "-":
        return f"({text})"
    return text


def _slowest_text(row: Row) -> str:
    project = f" of {row.project}" if row.project else ""
    return (
        f"> slowest: rank {row.rank}{project}, step cycle {duration(row.cycle_seconds)} = step "
        f"{duration(row.step_seconds)} + data wait {duration(row.wait_seconds)}"
    )


def plain_text(screen: Screen) -> str:
    lines = [screen.title, screen.header, *screen.rows, *screen.footer]
    return "\n".join(line.text for line in lines) + "\n"
