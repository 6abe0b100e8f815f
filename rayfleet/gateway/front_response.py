"""A relayed answer to a request of the gateway's front, written straight to its connection.

The relay (relay.py) answers a front request (front.py) with a ``FrontResponse``: aiohttp's
``StreamResponse`` as the data path reads and fills it (status, headers, ``content_type``,
``enable_chunked_encoding``, ``content_length``, ``prepared``, ``keep_alive``,
``force_close``), whose ``prepare``, ``write`` and ``write_eof`` format the HTTP/1.1 head and
chunks here and hand them to the connection's transport. aiohttp's own lifecycle of a
response (``_start``, its ``StreamWriter``, header serialisation) cost about 8 us of the
gateway's ~200 a streamed request on one core; this one costs about 2 (``python
benchmarks/gateway_versions.py``).

What aiohttp's response does and this one keeps: ``prepare`` runs the app's
``on_response_prepare`` signal first (the request id, ``x-rayfleet-worker``); the head carries
``Date``, ``Server``, ``Transfer-Encoding: chunked`` or ``Content-Length``, and
``Connection: close`` when the connection will close; with ``_send_headers_immediately``
off (relay_wire.head_with_body) the head waits for the first body bytes and goes out in the
same write; writing to a closing connection raises ``ConnectionResetError``; a write, and the
end of the body, wait while the connection's writing is paused (the client reads slowly). A
header with a line break in it is refused with ``ValueError``, as aiohttp refuses it.

Only answers with a body come here (``relayable``): 204, 304 and 1xx answers, rare from a
replica, keep aiohttp's response.
"""

from __future__ import annotations

import time
from email.utils import formatdate
from http import HTTPStatus
from typing import TYPE_CHECKING, Any

from aiohttp import web
from aiohttp.http import SERVER_SOFTWARE

from rayfleet.gateway.relay_wire import chunk

if TYPE_CHECKING:
    from rayfleet.gateway.front import FrontRequest

_END = b"0\r\n\r\n"


def relayable(status: int) -> bool:
    """Whether an answer of ``status`` has a body, so a ``FrontResponse`` may carry it."""
    return status >= 200 and status not in (HTTPStatus.NO_CONTENT, HTTPStatus.NOT_MODIFIED)


class FrontResponse(web.StreamResponse):
    def __init__(self, request: FrontRequest, *, status: int) -> None:
        super().__init__(status=status)
        self._front_request = request
        self._head: bytes | None = None  # formatted by prepare, until it goes out
        self._started = False
        self._ended = False

    @property
    def prepared(self) -> bool:
        return self._started

    @property
    def keep_alive(self) -> bool | None:
        chosen = super().keep_alive  # False after force_close
        return self._front_request.keep_alive if chosen is None else chosen

    async def prepare(self, request: Any) -> None:
        """Run the prepare signal and format the head; it goes out now, or with the first
        body bytes when the relay asked it to wait for them."""
        if self._started:
            return
        await self._front_request._prepare_hook(self)
        self._started = True
        self._head = self._format_head()
        if self._send_headers_immediately:
            self._send(b"")

    async def write(self, data: bytes | bytearray | memoryview) -> None:
        if self._ended:
            raise RuntimeError("Cannot call write() after write_eof()")
        if not self._started:
            raise RuntimeError("Cannot call write() before prepare()")
        piece = bytes(data)
        self._send(chunk(piece) if self.chunked and piece else piece)
        await self._front_request.protocol.drained()

    async def write_eof(self, data: bytes = b"") -> None:
        if self._ended:
            return
        if not self._started:
            raise RuntimeError("Cannot call write_eof() before prepare()")
        if self.chunked:
            self._send((chunk(data) if data else b"") + _END)
        else:
            self._send(data)
        self._ended = True
        await self._front_request.protocol.drained()

    def _send(self, body: bytes) -> None:
        transport = self._front_request.transport
        if transport is None or transport.is_closing():
            raise ConnectionResetError("Cannot write to closing transport")
        head, self._head = self._head, None
        data = head + body if head is not None else body
        if data:
            transport.write(data)

    def _format_head(self) -> bytes:
        headers = self.headers
        if not self.chunked and self.content_length is None:
            self.enable_chunked_encoding()  # HTTP/1.1 without a length: chunks, as aiohttp
        if self.chunked:
            headers["Transfer-Encoding"] = "chunked"
        headers.setdefault("Content-Type", "application/octet-stream")
        if "Date" not in headers:
            headers["Date"] = http_date()
        headers.setdefault("Server", SERVER_SOFTWARE)
        if not self.keep_alive:
            headers["Connection"] = "close"
        lines = [f"HTTP/1.1 {self.status} {self.reason}"]
        for name, value in headers.items():
            line = f"{name}: {value}"
            if "\r" in line or "\n" in line:
                raise ValueError(f"a line break in the header {name!r} of a response")
            lines.append(line)
        lines.append("\r\n")
        return "\r\n".join(lines).encode()


_date_now: tuple[int, str] = (0, "")


def http_date() -> str:
    """Now as an HTTP ``Date`` value, formatted once a second."""
    global _date_now
    second = int(time.time())
    if _date_now[0] != second:
        _date_now = (second, formatdate(second, usegmt=True))
    return _date_now[1]
