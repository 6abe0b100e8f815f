"""Streamed responses from a replica to the client without a coroutine step per chunk.

A streamed completion arrives as one small HTTP chunk per token. Read through aiohttp's
client, every chunk wakes a reader coroutine, resumes the handler's whole await chain
and passes through the server's writer: about 40 us of gateway CPU per token on the
benchmark machine, and on a machine whose cores the engine needs, that is throughput.
Here the upstream connection is an asyncio protocol whose HTTP parser (httptools) calls
back with each piece of body, and the piece goes straight to the client's transport in
HTTP/1.1 chunk framing: no task wake-up, no buffer in between.

    pool = RelayPool(connect_timeout_s=5)
    up = await pool.request("http://127.0.0.1:8001", "/v1/chat/completions", body, headers,
                            total_s=600, idle_s=None)       # the response head is in
    up.status, up.content_type, up.chunked
    outcome = await up.stream_to(response, request)    # "done", "broken", "timeout"
                                                       # or "client_gone"
    pool.release(up)                                   # back to the pool, or closed

Failures before the head raise ``UpstreamConnectError`` (nothing reached the replica, or
it went away before answering: safe to retry elsewhere) or ``asyncio.TimeoutError``.
Flow control: when the client reads slower than the replica writes and the client's
transport holds more than ``HIGH_WATER`` bytes, reading from the replica pauses until
it drains below ``LOW_WATER``. A client that goes away closes the upstream connection,
and vLLM aborts the request. Only plain ``http://`` upstreams use this path (the
replicas); fallback providers keep aiohttp's client.
"""

from __future__ import annotations

import asyncio
import time
from urllib.parse import urlsplit

import httptools
from aiohttp import web

HIGH_WATER = 256 * 1024
LOW_WATER = 64 * 1024
_DRAIN_POLL_S = 0.005
_IDLE_REUSE_S = 4.0  # uvicorn closes idle keep-alive connections after 5 s


class UpstreamConnectError(ConnectionError):
    """The request did not get a response head from the upstream: safe to retry."""


class Upstream(asyncio.Protocol):
    """One keep-alive HTTP/1.1 connection to a replica, carrying one request at a time."""

    def __init__(self, key: tuple[str, int]):
        self.key = key
        self.transport: asyncio.Transport | None = None
        self.idle_since = 0.0
        self.pauses = 0  # times reading was paused for a slow client, over its lifetime
        self._parser = httptools.HttpResponseParser(self)
        self._reset()

    def _reset(self) -> None:
        loop = asyncio.get_running_loop()
        self.status = 0
        self.content_type = "application/json"
        self.charset: str | None = None
        self.chunked = False
        self.last_piece = b""
        self.first_at = 0.0  # time.perf_counter() of the first piece of body
        self.got_bytes = False
        self._head = loop.create_future()
        self._head.add_done_callback(_retrieve)  # a failure nobody waits for is not news
        self._done = loop.create_future()
        self._first: asyncio.Future | None = None
        self._pieces: list[bytes] = []
        self._sink = None
        self._complete = False
        self._reusable = False
        self._last_data = 0.0
        self._timers: list[asyncio.TimerHandle] = []
        self._paused = False

    # -- asyncio protocol -------------------------------------------------------------

    def connection_made(self, transport) -> None:
        self.transport = transport

    def data_received(self, data: bytes) -> None:
        self.got_bytes = True
        self._last_data = time.monotonic()
        try:
            self._parser.feed_data(data)
        except httptools.HttpParserError as exc:
            self._fail(UpstreamConnectError(f"bad HTTP from upstream: {exc}"), "broken")

    def connection_lost(self, exc) -> None:
        self.transport = None
        self._fail(UpstreamConnectError(f"connection closed: {exc or 'EOF'}"), "broken")

    # -- httptools callbacks ----------------------------------------------------------

    def on_header(self, name: bytes, value: bytes) -> None:
        name = name.lower()
        if name == b"content-type":
            kind, _, params = value.decode("latin-1").partition(";")
            self.content_type = kind.strip()
            for param in params.split(";"):
                key, _, val = param.strip().partition("=")
                if key.lower() == "charset" and val:
                    self.charset = val.strip('"')
        elif name == b"transfer-encoding" and b"chunked" in value.lower():
            self.chunked = True

    def on_headers_complete(self) -> None:
        self.status = self._parser.get_status_code()
        self._reusable = self._parser.should_keep_alive()
        if not self._head.done():
            self._head.set_result(None)

    def on_body(self, piece: bytes) -> None:
        self.last_piece = piece
        sink = self._sink
        if sink is not None:
            sink(piece)
        else:
            if not self.first_at:
                self.first_at = time.perf_counter()
            self._pieces.append(piece)
            if not self._done.done() and self._first is not None and not self._first.done():
                self._first.set_result(None)

    def on_message_complete(self) -> None:
        self._complete = True
        self._settle("done")

    # -- what the gateway calls -------------------------------------------------------

    def send(self, head: bytes, body: bytes) -> None:
        self.transport.write(head + body)

    async def head(self) -> None:
        """Wait for the status line and headers (the timers armed by ``arm`` apply)."""
        await self._head

    async def body(self) -> tuple[bytes, str]:
        """The whole body, for a response that is not streamed."""
        outcome = await self._done
        return b"".join(self._pieces), outcome

    async def stream_to(self, response: web.StreamResponse, request: web.Request) -> str:
        """Relay the body as it arrives to ``response``, prepared; returns the outcome.

        The pieces are framed as HTTP/1.1 chunks when the response has chunked encoding
        enabled (``enable_chunked_encoding``, before ``prepare``), and written as they are
        otherwise (for an HTTP/1.0 client, whose response ends when the connection closes)."""
        if not self._pieces and not self._done.done():
            self._first = asyncio.get_running_loop().create_future()
            await asyncio.wait({self._first, self._done}, return_when=asyncio.FIRST_COMPLETED)
        if self._pieces:
            # The first write goes through aiohttp so that the headers go out with it.
            first = b"".join(self._pieces)
            self._pieces.clear()
            await response.write(first)
        transport = request.transport
        if transport is None or transport.is_closing():
            self.close()
            return "client_gone"
        raw = transport.write
        if response.chunked:

            def write(piece: bytes) -> None:
                raw(b"%x\r\n%b\r\n" % (len(piece), piece))
        else:
            write = raw
        for piece in self._pieces:  # what came while the first write waited
            write(piece)
        self._pieces.clear()
        if self._done.done():
            return self._done.result()

        def sink(piece: bytes) -> None:
            if transport.is_closing():
                self._settle("client_gone")
                self.close()
                return
            write(piece)
            if not self._paused and transport.get_write_buffer_size() > HIGH_WATER:
                self._pause(transport)

        self._sink = sink
        return await self._done

    def close(self) -> None:
        self._reusable = False
        if self.transport is not None:
            self.transport.close()
            self.transport = None

    # -- timers and flow control ------------------------------------------------------

    def arm(self, total_s: float | None, idle_s: float | None, started: float) -> None:
        """Time out the request ``total_s`` after ``started``, or after ``idle_s`` without
        a byte from the upstream (the head included, as aiohttp's sock_read)."""
        loop = asyncio.get_running_loop()
        if total_s is not None:
            left = max(0.0, total_s - (time.monotonic() - started))
            self._timers.append(loop.call_later(left, self._time_out))
        if idle_s is not None:
            self._last_data = time.monotonic()
            self._watch_idle(idle_s)

    def _watch_idle(self, idle_s: float) -> None:
        if self._done.done():
            return
        quiet = time.monotonic() - self._last_data
        if quiet >= idle_s and not self._paused:
            self._time_out()
            return
        wait = idle_s - quiet if not self._paused else idle_s
        self._timers.append(asyncio.get_running_loop().call_later(wait, self._watch_idle, idle_s))

    def _time_out(self) -> None:
        if not self._done.done():
            if not self._head.done():
                self._head.set_exception(TimeoutError())
            self._settle("timeout")
            self.close()

    def _pause(self, client: asyncio.Transport) -> None:
        if self.transport is None:
            return
        self._paused = True
        self.pauses += 1
        self.transport.pause_reading()
        loop = asyncio.get_running_loop()

        def check() -> None:
            if self._done.done() or self.transport is None:
                return
            if client.is_closing():
                self._settle("client_gone")
                self.close()
            elif client.get_write_buffer_size() <= LOW_WATER:
                self._paused = False
                self._last_data = time.monotonic()
                self.transport.resume_reading()
            else:
                loop.call_later(_DRAIN_POLL_S, check)

        loop.call_later(_DRAIN_POLL_S, check)

    def _fail(self, exc: Exception, outcome: str) -> None:
        if not self._head.done():
            self._head.set_exception(exc)
        self._settle(outcome)

    def _settle(self, outcome: str) -> None:
        for timer in self._timers:
            timer.cancel()
        self._timers.clear()
        if not self._done.done():
            self._done.set_result(outcome)
        if self._first is not None and not self._first.done():
            self._first.set_result(None)

    def reusable(self) -> bool:
        return (
            self._complete
            and self._reusable
            and self.transport is not None
            and not self.transport.is_closing()
        )


class RelayPool:
    """Keep-alive connections to the replicas, a stack of idle ones per host and port."""

    def __init__(self, connect_timeout_s: float | None):
        self.connect_timeout_s = connect_timeout_s
        self._idle: dict[tuple[str, int], list[Upstream]] = {}

    @staticmethod
    def handles(url: str) -> bool:
        return url.startswith("http://")

    async def request(
        self,
        base_url: str,
        path: str,
        body: bytes,
        headers: dict,
        *,
        total_s: float | None,
        idle_s: float | None,
    ) -> Upstream:
        """Send a POST and wait for the response head; see the module docstring."""
        started = time.monotonic()
        parts = urlsplit(base_url)
        key = (parts.hostname or "127.0.0.1", parts.port or 80)
        head = _request_head(key, path, headers, len(body))
        up = self._take_idle(key)
        if up is not None:
            up._reset()
            try:
                return await self._exchange(up, head, body, total_s, idle_s, started)
            except UpstreamConnectError:
                if up.got_bytes:
                    raise
                # The server closed it while idle: not the replica's fault; a new one.
        up = await self._connect(key, total_s, started)
        return await self._exchange(up, head, body, total_s, idle_s, started)

    @staticmethod
    async def _exchange(
        up: Upstream, head: bytes, body: bytes, total_s, idle_s, started
    ) -> Upstream:
        """Send the request on ``up`` and wait for the response head; close it on failure."""
        up.arm(total_s, idle_s, started)
        up.send(head, body)
        try:
            await up.head()
        except BaseException:
            up.close()
            raise
        return up

    async def _connect(self, key, total_s, started) -> Upstream:
        loop = asyncio.get_running_loop()
        limit = self.connect_timeout_s
        if total_s is not None:
            left = max(0.0, total_s - (time.monotonic() - started))
            limit = left if limit is None else min(limit, left)
        try:
            _, up = await asyncio.wait_for(
                loop.create_connection(lambda: Upstream(key), *key), limit
            )
        except TimeoutError:
            raise UpstreamConnectError(f"no connection to {key[0]}:{key[1]} within {limit:g} s")
        except OSError as exc:
            raise UpstreamConnectError(f"cannot connect to {key[0]}:{key[1]}: {exc}") from None
        return up

    def _take_idle(self, key) -> Upstream | None:
        stack = self._idle.get(key)
        now = time.monotonic()
        while stack:
            up = stack.pop()
            if up.transport is not None and now - up.idle_since < _IDLE_REUSE_S:
                return up
            up.close()
        return None

    def release(self, up: Upstream) -> None:
        """Keep ``up`` for the next request when its response ended cleanly, else close it."""
        if up.reusable():
            up.idle_since = time.monotonic()
            up._sink = None
            self._idle.setdefault(up.key, []).append(up)
        else:
            up.close()

    def idle(self) -> list[Upstream]:
        """The connections kept for reuse."""
        return [up for stack in self._idle.values() for up in stack]

    def close(self) -> None:
        for stack in self._idle.values():
            for up in stack:
                up.close()
        self._idle.clear()


def _retrieve(future: asyncio.Future) -> None:
    if not future.cancelled():
        future.exception()


def _request_head(key: tuple[str, int], path: str, headers: dict, length: int) -> bytes:
    lines = [f"POST {path} HTTP/1.1", f"Host: {key[0]}:{key[1]}", f"Content-Length: {length}"]
    lines += [f"{name}: {value}" for name, value in headers.items()]
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")
