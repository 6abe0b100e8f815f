"""The HTTP/1.1 details of the relay (relay.py): a replica's content type, chunk framing
toward the client, and an aiohttp response whose head waits for its first body bytes."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from aiohttp import web


def content_type(value: bytes) -> tuple[str, str | None]:
    """A ``Content-Type`` header's media type and charset (None when it names none)."""
    kind, _, params = value.decode("latin-1").partition(";")
    charset = None
    for param in params.split(";"):
        key, _, val = param.strip().partition("=")
        if key.lower() == "charset" and val:
            charset = val.strip('"')
    return kind.strip(), charset


def taken(pieces: list[bytes]) -> bytes:
    """The pieces as one bytes object, the list emptied."""
    joined = pieces[0] if len(pieces) == 1 else b"".join(pieces)
    pieces.clear()
    return joined


def chunk_writer(client: asyncio.Transport) -> Callable[[bytes], None]:
    """A write of one HTTP/1.1 chunk to ``client`` per call."""
    raw = client.write

    def write(piece: bytes) -> None:
        raw(b"%x\r\n%b\r\n" % (len(piece), piece))

    return write


def head_with_body(response: web.StreamResponse) -> None:
    """Let ``response``'s head wait for its first body bytes and go out in one write with
    them (aiohttp's ``Response`` does this; a ``StreamResponse`` sends its head at once)."""
    response._send_headers_immediately = False
