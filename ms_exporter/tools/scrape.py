"""The HTTP(S) client of the operator commands: one /metrics page from a rank, with basic auth and TLS."""

from __future__ import annotations

import argparse
import base64
import ssl
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass

from ms_exporter._version import __version__

MAX_PAGE_BYTES = 16 * 1024 * 1024


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


def beside(metrics_url: str, path: str) -> str:
    """Another page of the endpoint that serves `metrics_url` (its /debug/ pages)."""
    parts = urllib.parse.urlsplit(metrics_url)
    return urllib.parse.urlunsplit((parts.scheme, parts.netloc, path, "", ""))


def tls_context(args: argparse.Namespace) -> ssl.SSLContext:
    """The TLS context of `--cafile`, `--insecure`, `--cert` and `--key`; raises OSError or ssl.SSLError."""
    context = ssl.create_default_context(cafile=args.cafile)
    if args.insecure:
        context.check_hostname = False
        context.verify_mode = ssl.CERT_NONE
    if args.cert:
        context.load_cert_chain(args.cert, args.key)
    return context
