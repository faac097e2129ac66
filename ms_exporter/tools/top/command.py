"""`ms-exporter top`: its arguments checked, then one poll as plain text (`--once`) or the live screen."""

from __future__ import annotations

import argparse
import os
import ssl
import sys
import time
from collections.abc import Callable
from typing import Any

from ms_exporter.tools.scrape import Access, tls_context
from ms_exporter.tools.targets import parse_target_argument
from ms_exporter.tools.top.poller import Poller
from ms_exporter.tools.top.render import plain_text, render
from ms_exporter.tools.top.screen import run_live

PASSWORD_ENV = "MS_EXPORTER_TOP_PASSWORD"


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
        context = tls_context(args)
    except (OSError, ssl.SSLError) as exc:
        error(f"TLS files: {exc}")
    if not args.once and not (sys.stdin.isatty() and sys.stdout.isatty()):
        error("the live view needs a terminal; use --once for plain text")
    poller = Poller(specs, Access(args.timeout, args.user, password, context), args.scheme, args.stale_seconds)
    try:
        if args.once:
            return _run_once(poller)
        return run_live(poller, args.interval)
    finally:
        poller.close()


def _run_once(poller: Poller) -> int:
    """One poll as plain text; exit status 1 when a target is down or there is none."""
    rows = poller.poll()
    width = os.get_terminal_size().columns if sys.stdout.isatty() else None
    sys.stdout.write(plain_text(render(rows, width, time.strftime("%H:%M:%S"))))
    return 0 if rows and all(row.error is None for row in rows) else 1
