"""How `top` prints a cell: numbers, rates, durations, ages and sizes; texts from the targets escaped, cut to width."""

from __future__ import annotations

import math


def printable(text: str) -> str:
    """Label values and error texts come from the targets: a control character (an escape sequence that would
    move the cursor, recolour or retitle the operator's terminal) is shown as its escape, never sent."""
    if text.isprintable():
        return text
    return "".join(c if c.isprintable() else c.encode("unicode_escape").decode("ascii") for c in text)


def fit(text: str, width: int | None) -> str:
    """`text` made printable and cut to `width` columns, a `~` where it was cut (None: not cut)."""
    text = printable(text)
    if width is None or len(text) <= width:
        return text
    return text[: max(0, width - 1)] + "~" if width > 0 else ""


def integer(value: float | None) -> str:
    return "-" if value is None or not math.isfinite(value) else str(int(value))


def number(value: float | None, digits: int = 5) -> str:
    if value is None:
        return "-"
    if math.isnan(value):
        return "NaN"
    if math.isinf(value):
        return "Inf" if value > 0 else "-Inf"
    return f"{value:.{digits}g}"


def percent(value: float | None) -> str:
    return "-" if value is None or not math.isfinite(value) else f"{100 * value:.1f}%"


def rate(value: float | None) -> str:
    if value is None or not math.isfinite(value):
        return number(value)
    for limit, suffix in ((1e9, "G"), (1e6, "M"), (1e3, "k")):
        if abs(value) >= limit:
            return f"{value / limit:.3g}{suffix}"
    return f"{value:.1f}"


def duration(value: float | None) -> str:
    if value is None or not math.isfinite(value):
        return number(value)
    if value < 1e-3:
        return f"{value * 1e6:.0f}us"
    if value < 1.0:
        return f"{value * 1e3:.1f}ms"
    if value < 60.0:
        return f"{value:.2f}s"
    return age(value)


def age(seconds: float) -> str:
    total = int(seconds)
    if total < 60:
        return f"{total}s"
    if total < 3600:
        return f"{total // 60}m{total % 60:02d}s"
    if total < 86400:
        return f"{total // 3600}h{total % 3600 // 60:02d}m"
    return f"{total // 86400}d{total % 86400 // 3600:02d}h"


def size(value: float) -> str:
    unit = "B"
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(value) < 1024 or unit == "TiB":
            break
        value /= 1024
    return f"{value:.0f}{unit}" if unit == "B" else f"{value:.1f}{unit}"
