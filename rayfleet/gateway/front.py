"""The gateway's own HTTP/1.1 front end for its API routes, with aiohttp's server behind it.

aiohttp's server costs about 45 us of the gateway's ~200 a streamed request on one core
(README, "What aiohttp's server costs of that"): its connection loop, request object,
router and middleware. Every connection of the gateway's TCP port comes here first::

    FrontProtocol.data_received
        no whole head yet          kept; a connection without a whole request within
                                   ``idle_timeout_s`` of its start or its last answer
                                   is closed (as aiohttp's keep-alive timer does)
        a plain API request        POST to a route of INPUT_FIELDS, HTTP/1.1, a
                                   Content-Length within the body limit, no
                                   Transfer-Encoding, Expect or Upgrade, within the
                                   parser's limits (httptools checks the head)
            -> FrontRequest, and a task that runs the route's handler (the access log
               around Gateway._proxy) and sends its aiohttp response; the body still
               coming goes to the request, which the gateway awaits within
               ``body_timeout_s`` (a 408 that closes the connection)
        anything else              the connection is handed to aiohttp's protocol with
                                   exactly the bytes received since that request began,
                                   and is aiohttp's from then on: its errors (400, 404,
                                   405, 413, 414, 431) and every other endpoint

Answers are aiohttp's own ``StreamResponse`` and ``Response`` objects, unchanged: the
request gives them a ``StreamWriter`` over the connection and runs the app's
``on_response_prepare`` signal before a head goes out (the request id,
``x-rayfleet-worker``). A client that closes cancels its request's task, as aiohttp's
``handler_cancellation`` does, and the upstream request is aborted. A request sent before
the answer to the one before it (pipelining) waits for that answer. On shutdown
(``FrontSite.stop``) idle connections close at once and busy ones after their answer,
within ``shutdown_s``.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from typing import Any, cast

import httptools
from aiohttp import web
from aiohttp.base_protocol import BaseProtocol
from aiohttp.http_writer import HttpVersion11, StreamWriter
from multidict import CIMultiDict, CIMultiDictProxy

from rayfleet.gateway.errors import openai_error
from rayfleet.gateway.http_errors import (
    MAX_HEADER_BYTES,
    MAX_HEADERS,
    MAX_REQUEST_LINE_BYTES,
    body_timeout,
)

log = logging.getLogger("rayfleet.gateway")

FrontHandler = Callable[["FrontRequest"], Awaitable[web.StreamResponse]]

_MAX_HEAD_BYTES = MAX_REQUEST_LINE_BYTES + 2 * MAX_HEADER_BYTES  # more: aiohttp's to refuse
_MAX_PIPELINED_BYTES = 1024**2  # kept while an answer is under way; more pauses reading
_HANDED_OFF_HEADERS = frozenset({b"transfer-encoding", b"expect", b"upgrade"})


class FrontRequest(dict[Any, Any]):
    """A request as the data path reads it, under ``web.Request``'s names: ``headers``,
    ``path``, ``method``, ``version``, ``keep_alive``, ``transport``; items hold what
    handlers attach to it (the access log's record). ``_payload_writer`` and
    ``_prepare_hook`` are what aiohttp's responses ask of a request they are prepared
    for."""

    __slots__ = (
        "_arrived",
        "_body_left",
        "_front",
        "_parts",
        "_payload_writer",
        "headers",
        "keep_alive",
        "path",
        "transport",
    )
    method = "POST"
    version = HttpVersion11

    def __init__(
        self,
        protocol: FrontProtocol,
        path: str,
        headers: CIMultiDict[str],
        content_length: int,
        keep_alive: bool,
    ):
        super().__init__()
        self.headers = CIMultiDictProxy(headers)
        self.path = path
        self.keep_alive = keep_alive
        self.transport = protocol.transport
        self._payload_writer = StreamWriter(protocol, protocol.front.loop)
        self._front = protocol.front
        self._parts: list[bytes] = []
        self._body_left = content_length
        self._arrived: asyncio.Future[None] | None = None

    def as_aiohttp(self) -> web.Request:
        """This request where aiohttp's type is asked for: it has what the data path
        and aiohttp's responses read of one (the class docstring)."""
        return cast(web.Request, self)

    async def _prepare_hook(self, response: web.StreamResponse) -> None:
        await self._front.on_response_prepare.send(self.as_aiohttp(), response)

    def receive(self, data: bytes) -> bytes:
        """Take what belongs to the body out of ``data``; returns the rest."""
        piece, rest = data[: self._body_left], data[self._body_left :]
        self._parts.append(piece)
        self._body_left -= len(piece)
        if not self._body_left and self._arrived is not None and not self._arrived.done():
            self._arrived.set_result(None)
        return rest

    @property
    def body_complete(self) -> bool:
        return not self._body_left

    async def body_within(self, timeout_s: float) -> bytes:
        """The whole body, or a 408 that closes the connection when it takes over
        ``timeout_s`` (http_errors.read_body's contract for aiohttp's requests)."""
        if self._body_left:
            self._arrived = asyncio.get_running_loop().create_future()
            try:
                async with asyncio.timeout(timeout_s):
                    await self._arrived
            except TimeoutError:
                raise body_timeout(timeout_s) from None
        return self._parts[0] if len(self._parts) == 1 else b"".join(self._parts)


class Front:
    """What every connection of the front shares: the routes it serves itself, aiohttp's
    server for the rest, the limits, and the connections open now."""

    def __init__(
        self,
        routes: dict[str, FrontHandler],
        runner: web.AppRunner,
        *,
        idle_timeout_s: float,
        max_body_bytes: int,
    ):
        server = runner.server
        assert server is not None, "the runner is set up before the front"
        self.routes = {path.encode(): handler for path, handler in routes.items()}
        self.aiohttp_protocol = server  # a factory of aiohttp's protocol, one a connection
        self.on_response_prepare = runner.app.on_response_prepare
        self.idle_timeout_s = idle_timeout_s
        self.max_body_bytes = max_body_bytes
        self.loop = asyncio.get_running_loop()
        self.connections: set[FrontProtocol] = set()
        self.closing = False

    def protocol(self) -> FrontProtocol:
        return FrontProtocol(self)

    async def shutdown(self, timeout_s: float) -> None:
        """Close idle connections now and busy ones after their answer; cancel what is
        still running after ``timeout_s``."""
        self.closing = True
        busy = []
        for connection in list(self.connections):
            if connection.task is None:
                connection.close()
            else:
                busy.append(connection.task)
        if busy:
            await asyncio.wait(busy, timeout=timeout_s)
        for connection in list(self.connections):
            if connection.task is not None:
                connection.task.cancel()
            connection.close()


class FrontProtocol(BaseProtocol):
    """One client connection, until it is closed or handed to aiohttp."""

    def __init__(self, front: Front):
        super().__init__(front.loop)
        self.front = front
        self.task: asyncio.Task[None] | None = None  # the request being answered
        self._request: FrontRequest | None = None  # its body may still be coming
        self._buffer = bytearray()  # bytes of requests not taken yet
        self._idle: asyncio.TimerHandle | None = None
        self._quiet_since = 0.0  # loop time of the connection's start or its last answer
        # the head being parsed (httptools' callbacks)
        self._url = b""
        self._headers: CIMultiDict[str] = CIMultiDict()
        self._content_length: int | None = None
        self._plain = True  # nothing seen yet that is aiohttp's to handle

    # -- asyncio's protocol -----------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        super().connection_made(transport)
        self.front.connections.add(self)
        self._arm_idle()

    def connection_lost(self, exc: BaseException | None) -> None:
        super().connection_lost(exc)
        self.front.connections.discard(self)
        if self._idle is not None:
            self._idle.cancel()
        if self.task is not None and not self.task.done():
            self.task.cancel()  # the client left: the upstream request is aborted

    def data_received(self, data: bytes) -> None:
        request = self._request
        if request is not None and not request.body_complete:
            data = request.receive(data)
        if data:
            self._buffer += data
        if self.task is None:
            if request is None or request.body_complete:
                self._request = None
                self._next()
        elif len(self._buffer) > _MAX_PIPELINED_BYTES and self.transport is not None:
            self.transport.pause_reading()  # resumed after the answer under way

    def close(self) -> None:
        if self.transport is not None:
            self.transport.close()

    # -- httptools' callbacks ---------------------------------------------------------

    def on_url(self, url: bytes) -> None:
        self._url += url

    def on_header(self, name: bytes, value: bytes) -> None:
        lowered = name.lower()
        if lowered == b"content-length":
            if self._content_length is not None or not value.isdigit():
                self._plain = False
            else:
                self._content_length = int(value)
        elif lowered in _HANDED_OFF_HEADERS:
            self._plain = False
        if len(name) > MAX_HEADER_BYTES or len(value) > MAX_HEADER_BYTES:
            self._plain = False
        self._headers.add(name.decode("latin-1"), value.decode("utf-8", "surrogateescape"))

    # -- requests ---------------------------------------------------------------------

    def _next(self) -> None:
        """Take the next whole head in the buffer: answer it, or hand the connection to
        aiohttp."""
        buffer = self._buffer
        end = buffer.find(b"\r\n\r\n")
        if end < 0:
            if len(buffer) > _MAX_HEAD_BYTES or b"\n\n" in buffer:  # aiohttp's to judge
                self._hand_off()
            return
        head_end = end + 4
        parsed = self._parse(bytes(buffer[:head_end]))
        if parsed is None:
            self._hand_off()
            return
        path, headers, content_length, keep_alive = parsed
        request = FrontRequest(self, path.decode("ascii"), headers, content_length, keep_alive)
        rest = request.receive(bytes(buffer[head_end:]))
        self._buffer = bytearray(rest)
        self._request = request
        handler = self.front.routes[path]
        self.task = self.front.loop.create_task(self._answer(request, handler))

    def _parse(self, head: bytes) -> tuple[bytes, CIMultiDict[str], int, bool] | None:
        """The head of a request the front answers itself; None for any other."""
        self._url = b""
        self._headers = CIMultiDict()
        self._content_length = None
        self._plain = True
        parser = httptools.HttpRequestParser(self)
        try:
            parser.feed_data(head)
        except httptools.HttpParserError:
            return None
        if (
            not self._plain
            or parser.get_method() != b"POST"
            or parser.get_http_version() != "1.1"
            or self._url not in self.front.routes
            or len(self._headers) > MAX_HEADERS
            or self._content_length is None
            or self._content_length > self.front.max_body_bytes
        ):
            return None
        return (
            self._url,
            self._headers,
            self._content_length,
            parser.should_keep_alive(),
        )

    async def _answer(self, request: FrontRequest, handler: FrontHandler) -> None:
        response: web.StreamResponse | None = None
        try:
            response = await handler(request)
            await response.prepare(request.as_aiohttp())
            await response.write_eof()
        except asyncio.CancelledError:
            self.close()
            raise
        except ConnectionError:  # the client is gone
            self.close()
            return
        except Exception as exc:  # a bug, answered as aiohttp answers it: a 500
            log.error("error handling POST %s", request.path, exc_info=exc)
            await self._fail(request, response)
            return
        if not (request.keep_alive and response.keep_alive) or self.front.closing:
            self.close()
            return
        self._done()

    async def _fail(self, request: FrontRequest, response: web.StreamResponse | None) -> None:
        """A 500 in error JSON when nothing of the answer went out yet; then close."""
        if response is None or not response.prepared:
            answer = openai_error(500, "The gateway failed to handle the request.")
            answer.force_close()
            try:
                await answer.prepare(request.as_aiohttp())
                await answer.write_eof()
            except ConnectionError:
                pass
        self.close()

    def _done(self) -> None:
        """The answer is out: wait for the next request, once the rest of this one's body
        (answered without it: a 401, a 429) has come and gone."""
        self.task = None
        if self.transport is None:
            return
        self._arm_idle()
        if self._request is not None and not self._request.body_complete:
            return
        self._request = None
        if self._buffer:
            self.transport.resume_reading()
            self._next()

    def _hand_off(self) -> None:
        """Give the connection to aiohttp's protocol with the bytes it has not seen.
        Writing is never paused here: every answer ends with aiohttp's ``write_eof``,
        which waits for the transport to drain."""
        if self._idle is not None:
            self._idle.cancel()
            self._idle = None
        transport = self.transport
        if transport is None:
            return
        self.front.connections.discard(self)
        data = bytes(self._buffer)
        self._buffer.clear()
        protocol = self.front.aiohttp_protocol()
        transport.set_protocol(protocol)
        protocol.connection_made(transport)
        if data:
            protocol.data_received(data)

    def _arm_idle(self) -> None:
        # One timer a connection, moved on only when it fires: re-arming it at every
        # answer cost ~1% of the gateway's CPU at 1,500 req/s (py-spy, 2 cores).
        loop = self.front.loop
        self._quiet_since = loop.time()
        if self._idle is None:
            self._idle = loop.call_at(self._quiet_since + self.front.idle_timeout_s, self._idle_out)

    def _idle_out(self) -> None:
        self._idle = None
        if self.task is not None:
            return  # answering: armed again when the answer is out
        left = self._quiet_since + self.front.idle_timeout_s - self.front.loop.time()
        if left > 0:
            self._idle = self.front.loop.call_later(left, self._idle_out)
        else:
            self.close()


class FrontSite(web.SockSite):
    """aiohttp's ``SockSite`` whose connections come to the front first."""

    def __init__(
        self, runner: web.AppRunner, sock: Any, front: Front, *, backlog: int, shutdown_s: float
    ):
        super().__init__(runner, sock, backlog=backlog)
        self.front = front
        self.shutdown_s = shutdown_s

    async def start(self) -> None:
        self._runner._reg_site(self)
        loop = asyncio.get_running_loop()
        self._server = await loop.create_server(
            self.front.protocol, sock=self._sock, backlog=self._backlog
        )

    async def stop(self) -> None:
        await super().stop()  # no new connections
        await self.front.shutdown(self.shutdown_s)
