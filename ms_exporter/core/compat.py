"""What the training side needs from Python 3.10 and later, spelled so that it also runs on 3.9 (the package's floor).

`@dataclass(frozen=True, **SLOTS)` keeps the slotted records of the step path slotted where Python can (3.10 on)
and leaves them plain dataclasses on 3.9; `zip_strict(a, b)` is `zip(a, b, strict=True)`, which 3.9 lacks;
`start_tls(writer, ...)` is StreamWriter.start_tls, which came in 3.11.
"""

from __future__ import annotations

import asyncio
import itertools
import ssl
import sys
from collections.abc import Iterable, Iterator
from typing import Any, TypeVar, overload

_A = TypeVar("_A")
_B = TypeVar("_B")
_C = TypeVar("_C")

# dataclass(slots=True) came in 3.10; a slotted record is smaller and faster to read, not different to use.
SLOTS: dict[str, bool] = {"slots": True} if sys.version_info >= (3, 10) else {}


@overload
def zip_strict(first: Iterable[_A], second: Iterable[_B], /) -> Iterator[tuple[_A, _B]]: ...


@overload
def zip_strict(first: Iterable[_A], second: Iterable[_B], third: Iterable[_C], /) -> Iterator[tuple[_A, _B, _C]]: ...


def zip_strict(*iterables: Iterable[Any]) -> Iterator[tuple[Any, ...]]:
    """zip(*iterables, strict=True): ValueError when one runs out before the others."""
    if sys.version_info >= (3, 10):
        return zip(*iterables, strict=True)
    return _zip_checked(iterables)


def _zip_checked(iterables: tuple[Iterable[Any], ...]) -> Iterator[tuple[Any, ...]]:
    missing = object()
    for values in itertools.zip_longest(*iterables, fillvalue=missing):
        if any(value is missing for value in values):
            raise ValueError("zip_strict: the iterables have different lengths")
        yield values


async def start_tls(writer: asyncio.StreamWriter, context: ssl.SSLContext, handshake_seconds: float) -> None:
    """Upgrade a server-side stream connection to TLS: `await writer.start_tls(context, ...)` of Python 3.11."""
    if sys.version_info >= (3, 11):
        await writer.start_tls(context, ssl_handshake_timeout=handshake_seconds)
        return
    # Before 3.11, what 3.11's StreamWriter.start_tls does (asyncio/streams.py): the loop wraps the transport in
    # TLS, and the writer and the stream's protocol are pointed at the new transport (3.9 and 3.10 name these
    # attributes as 3.11 does; their releases no longer change).
    stream: Any = writer
    protocol = stream._protocol
    await writer.drain()
    transport = await asyncio.get_running_loop().start_tls(
        writer.transport, protocol, context, server_side=True, ssl_handshake_timeout=handshake_seconds
    )
    stream._transport = transport
    protocol._stream_writer = writer
    protocol._transport = transport
    protocol._over_ssl = True
