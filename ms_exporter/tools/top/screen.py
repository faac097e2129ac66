"""`top`'s live screen: a polling thread hands each poll to a curses loop that draws, scrolls and quits."""

from __future__ import annotations

import contextlib
import sys
import threading
import time
from dataclasses import replace
from typing import Any

from ms_exporter.tools.top.formats import fit
from ms_exporter.tools.top.poller import Poller
from ms_exporter.tools.top.render import Line, render
from ms_exporter.tools.top.rows import Row


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


def run_live(poller: Poller, interval: float) -> int:
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
        screen = replace(screen, title=Line(fit("ms-exporter top - polling... - q quits", width), "title"))
    fixed = [screen.title, screen.header]
    footer = screen.footer
    if len(fixed) + len(screen.rows) + len(footer) > height:
        footer = footer[:-1]  # rows before the legend
    room = max(0, height - len(fixed) - len(footer))
    offset = max(0, min(offset, len(screen.rows) - room))
    visible = screen.rows[offset : offset + room]
    if offset + room < len(screen.rows) and visible:
        visible[-1] = Line(fit(f"... {len(screen.rows) - offset - room + 1} more rows (arrows scroll)", width))
    stdscr.erase()
    for y, line in enumerate([*fixed, *visible, *footer][:height]):
        # Writing the bottom-right cell moves the cursor off the screen, which curses reports; harmless.
        with contextlib.suppress(curses.error):
            stdscr.addnstr(y, 0, line.text, width, styles.get(line.style, 0))
        for start, end in line.dim:  # a stalled rank's stale values, greyed
            if start < width:
                with contextlib.suppress(curses.error):
                    stdscr.chgat(y, start, min(end, width) - start, styles.get(line.style, 0) | curses.A_DIM)
    stdscr.refresh()
    return offset


def _curses_styles() -> dict[str, int]:
    import curses

    styles = {
        "title": curses.A_BOLD,
        "header": curses.A_BOLD | curses.A_UNDERLINE,
        "slowest": curses.A_REVERSE,
        "down": curses.A_BOLD,
        "critical": curses.A_BOLD,
        "alert": curses.A_BOLD,
    }
    with contextlib.suppress(curses.error):
        if curses.has_colors():
            curses.start_color()
            curses.use_default_colors()
            curses.init_pair(1, curses.COLOR_RED, -1)
            curses.init_pair(2, curses.COLOR_YELLOW, -1)
            styles["down"] |= curses.color_pair(1)
            styles["critical"] |= curses.color_pair(1)  # a non-finite loss, a stall past its deadline: red
            styles["alert"] |= curses.color_pair(2)
    return styles
