"""Streamed responses from a replica to the client without a coroutine step per chunk.

A streamed completion arrives as one small HTTP chunk per token. Read through aiohttp's
client, every chunk wakes a reader coroutine, resumes the handler's whole await chain
and passes through the server's writer: about 40 us of gateway CPU per token on the
benchmark machine, and on a machine whose cores the engine needs, that is throughput.
Here the upstream connection is an asyncio protocol whose HTTP parser (httptools) calls
back with each piece of body, and the pieces go straight to the client's transport in
HTTP/1.1 chunk framing (relay_wire.py): no task wake-up. The pieces of one read from the
replica (under load, several tokens wait in the socket) go out as one chunk in one write:
a system call per read, not per token (0.86x the gateway's CPU per request in alternating
rounds near saturation, 8 simulated replicas on a 2-core machine). The read that ends the
body goes out with the body's end (the last chunk and the terminator, through aiohttp's
``write_eof``) in one write, and so does a whole response that came in one read.

A stream's head goes out as soon as it came, unless its first piece came with it: the
client learns at once that the replica took the request (a request waiting in vLLM's
queue shows its 200 before its first token). Once the head is out, the protocol's
callback writes every read, the first token's too: a first token that comes after the
head does not wait for the handler's task to be woken and run (a turn of the event loop,
which under load is most of what the gateway adds to the time to first token).

``RelayConnection`` is one keep-alive connection to a replica and, while it carries a
request, the ``Exchange`` of upstream.py: ``RelayPool`` (relay_pool.py) calls ``start``
and waits for ``head``; the dispatcher calls ``relay``, which streams a chunked body
(``stream_to``) or sends a whole one, and returns an ``Outcome``; ``finish`` hands the
connection back to the pool.

Flow control: when the client reads slower than the replica writes and the client's
transport holds more than ``HIGH_WATER`` bytes, reading from the replica pauses until
it drains below ``LOW_WATER``.

A client that goes away closes the upstream connection, and vLLM aborts the request.
The handler is cancelled when the client's connection is lost (by the gateway's front,
front.py, or aiohttp's ``handler_cancellation``), whatever it awaits (the head, the first
piece, a whole body, a paused stream), and cancellation closes the connection (``finish``).
Besides, a piece that finds the client's transport closing ends the relay, and while
reading is paused the client's transport is polled, so a departed client is noticed
even where no cancellation comes.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import cast

import httptools
from aiohttp import HttpVersion11, web

from rayfleet.gateway.relay_wire import chunk_writer, content_type, head_with_body, taken
from rayfleet.gateway.upstream import Outcome, UpstreamConnectError

HIGH_WATER = 256 * 1024
LOW_WATER = 64 * 1024
_DRAIN_POLL_S = 0.005

Finisher = Callable[["RelayConnection", bool], None]


class RelayConnection(asyncio.Protocol):
    """One keep-alive HTTP/1.1 connection to a replica, carrying one request at a time."""

    def __init__(self, key: tuple[str, int], on_finish: Finisher):
        self.key = key
        self.transport: asyncio.Transport | None = None
        self.idle_since = 0.0
        self.pauses = 0  # times reading was paused for a slow client, over its lifetime
        self._on_finish = on_finish
        self._loop = asyncio.get_running_loop()  # each call of it costs a getpid() here
        self._parser = httptools.HttpResponseParser(self)
        self._reset()

    def _reset(self) -> None:
        loop = self._loop
        self.status = 0
        self.content_type = "application/json"
        self.charset: str | None = None
        self.chunked = False
        self.first_byte_at = 0.0
        self.got_bytes = False
        self.paused = False
        self._last_piece = b""
        self._piece_before = b""
        self._head: asyncio.Future[None] = loop.create_future()
        self._head.add_done_callback(_retrieve)  # a failure nobody waits for is not news
        self._done: asyncio.Future[Outcome] = loop.create_future()
        self._pieces: list[bytes] = []
        self._kept: list[bytes] | None = None  # the body's first pieces, when kept
        self._kept_room = 0  # bytes more it may keep
        self._sink: Callable[[bytes], None] | None = None
        self._out: list[bytes] = []  # pieces of this read, for the client in one write
        self._flush: Callable[[], None] | None = None
        self._complete = False
        self._keep_alive = False
        self._last_data = 0.0
        self._timers: list[asyncio.TimerHandle] = []

    @property
    def connected(self) -> bool:
        return self.transport is not None

    # -- asyncio protocol -------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)  # uvloop's is not a subclass

    def data_received(self, data: bytes) -> None:
        self.got_bytes = True
        self._last_data = time.monotonic()
        try:
            self._parser.feed_data(data)
        except httptools.HttpParserError as exc:
            self._fail(UpstreamConnectError(f"bad HTTP from upstream: {exc}"), Outcome.BROKEN)
        if self._out and self._flush is not None and not self._complete:
            self._flush()  # the last pieces go out with the end of the body (stream_to)

    def connection_lost(self, exc: Exception | None) -> None:
        self.transport = None
        self._fail(UpstreamConnectError(f"connection closed: {exc or 'EOF'}"), Outcome.BROKEN)

    # -- httptools callbacks ----------------------------------------------------------

    def on_header(self, name: bytes, value: bytes) -> None:
        name = name.lower()
        if name == b"content-type":
            self.content_type, self.charset = content_type(value)
        elif name == b"transfer-encoding" and b"chunked" in value.lower():
            self.chunked = True

    def on_headers_complete(self) -> None:
        self.status = self._parser.get_status_code()
        self._keep_alive = self._parser.should_keep_alive()
        if not self._head.done():
            self._head.set_result(None)

    def on_body(self, piece: bytes) -> None:
        self._piece_before = self._last_piece
        self._last_piece = piece
        if self._kept is not None and self._kept_room > 0:  # the body's beginning
            self._kept.append(piece[: self._kept_room])
            self._kept_room -= len(piece)
        if not self.first_byte_at:
            self.first_byte_at = time.perf_counter()
        sink = self._sink
        if sink is not None:
            sink(piece)
            return
        self._pieces.append(piece)

    def on_message_complete(self) -> None:
        self._complete = True
        self._settle(Outcome.DONE)

    # -- one request ------------------------------------------------------------------

    def start(
        self, request: bytes, total_s: float | None, idle_s: float | None, started: float
    ) -> None:
        """Send ``request`` (head and body) with fresh state, and arm its time limits:
        ``total_s`` after ``started``, ``idle_s`` without a byte (the head included)."""
        self._reset()
        if self.transport is None:
            raise UpstreamConnectError("connection closed while idle")
        loop = self._loop
        if total_s is not None:
            left = max(0.0, total_s - (time.monotonic() - started))
            self._timers.append(loop.call_later(left, self._time_out))
        if idle_s is not None:
            self._last_data = time.monotonic()
            self._watch_idle(idle_s)
        self.transport.write(request)

    async def head(self) -> None:
        """Wait for the status line and headers (the time limits of ``start`` apply)."""
        await self._head

    async def relay(self, request: web.Request, response: web.StreamResponse) -> Outcome:
        """The ``Exchange`` of upstream.py: a chunked body streams as it comes; another
        is read whole and sent only when complete (else ``response`` stays unprepared)."""
        if not self.chunked:
            outcome = await self._done
            if outcome is Outcome.DONE:
                body = b"".join(self._pieces)
                response.content_length = len(body)
                head_with_body(response)
                await response.prepare(request)
                await response.write_eof(body)
            return outcome
        if request.version >= HttpVersion11:
            response.enable_chunked_encoding()  # the relay frames the chunks itself
        if self._pieces:  # the first token is here: no need to send the head before it
            head_with_body(response)
        await response.prepare(request)
        return await self.stream_to(response, request)

    async def stream_to(self, response: web.StreamResponse, request: web.Request) -> Outcome:
        """Relay the body as it arrives to ``response``, prepared; returns the outcome.

        The pieces are framed as HTTP/1.1 chunks when the response has chunked encoding
        enabled (``enable_chunked_encoding``, before ``prepare``), and written as they are
        otherwise (for an HTTP/1.0 client, whose response ends when the connection closes).

        Without pieces in hand the head is out already (``relay`` holds it back only for
        pieces), so every read from then on, the first token's too, goes to the client
        from ``data_received``: the first token does not wait for this task's next turn
        of the loop."""
        if self._pieces:
            # The first write goes through aiohttp so that the headers go out with it, and
            # the end of the body too when the whole response is here.
            first = taken(self._pieces)
            if self._done.done() and self._done.result() is Outcome.DONE:
                await response.write_eof(first)
                return Outcome.DONE
            await response.write(first)
        client = request.transport
        if client is None or client.is_closing():
            return self._client_gone()
        write = chunk_writer(client) if response.chunked else client.write
        for piece in self._pieces:  # what came while the first write waited
            write(piece)
        self._pieces.clear()
        if self._done.done():
            return self._done.result()

        out = self._out

        def flush() -> None:
            pieces = taken(out)
            if client.is_closing():
                self._undelivered()
                return
            write(pieces)
            if not self.paused and client.get_write_buffer_size() > HIGH_WATER:
                self._pause(client)

        self._flush = flush
        self._sink = out.append
        outcome = await self._done
        if out:  # the pieces of the read that ended the body: one write with its end
            return await self._end_with(out, response, client)
        return outcome

    async def _end_with(
        self, out: list[bytes], response: web.StreamResponse, client: asyncio.Transport
    ) -> Outcome:
        last = taken(out)
        if client.is_closing():
            return self._undelivered()
        await response.write_eof(last)
        return Outcome.DONE

    def tail(self) -> bytes | None:
        return self._last_piece if self.chunked else None

    def end(self) -> bytes:
        # A stream's usage chunk is the piece before its "data: [DONE]".
        if self.chunked:
            return self._piece_before + self._last_piece
        return b"".join(self._pieces)

    def keep_body(self, max_bytes: int) -> None:
        if not self.chunked:  # a whole body stays in _pieces anyway
            return
        self._kept = list(self._pieces)  # what came with the head is not sent yet
        self._kept_room = max_bytes - sum(map(len, self._kept))

    def body(self) -> bytes:
        if not self.chunked:
            return b"".join(self._pieces)
        return b"".join(self._kept or ())

    def finish(self, completed: bool) -> None:
        """Back to the pool when the response ended cleanly, else closed."""
        self._on_finish(self, completed)

    def reusable(self) -> bool:
        return (
            self._complete
            and self._keep_alive
            and self.transport is not None
            and not self.transport.is_closing()
        )

    def close(self) -> None:
        self._keep_alive = False
        if self.transport is not None:
            self.transport.close()
            self.transport = None

    # -- timers and flow control ------------------------------------------------------

    def _watch_idle(self, idle_s: float) -> None:
        if self._done.done():
            return
        quiet = time.monotonic() - self._last_data
        if quiet >= idle_s and not self.paused:
            self._time_out()
            return
        wait = idle_s - quiet if not self.paused else idle_s
        self._timers.append(self._loop.call_later(wait, self._watch_idle, idle_s))

    def _time_out(self) -> None:
        if not self._done.done():
            if not self._head.done():
                self._head.set_exception(TimeoutError())
            self._settle(Outcome.TIMEOUT)
            self.close()

    def _pause(self, client: asyncio.Transport) -> None:
        if self.transport is None:
            return
        self.paused = True
        self.pauses += 1
        self.transport.pause_reading()
        loop = self._loop

        def check() -> None:
            if self._done.done() or self.transport is None:
                return
            if client.is_closing():
                self._client_gone()
            elif client.get_write_buffer_size() <= LOW_WATER:
                self.paused = False
                self._last_data = time.monotonic()
                self.transport.resume_reading()
            else:
                loop.call_later(_DRAIN_POLL_S, check)

        loop.call_later(_DRAIN_POLL_S, check)

    def _undelivered(self) -> Outcome:
        """The client left before the pieces in hand reached it: tail() must not show them."""
        self._last_piece = b""
        return self._client_gone()

    def _client_gone(self) -> Outcome:
        self._settle(Outcome.CLIENT_GONE)
        self.close()
        return Outcome.CLIENT_GONE

    def _fail(self, exc: Exception, outcome: Outcome) -> None:
        if not self._head.done():
            self._head.set_exception(exc)
        self._settle(outcome)

    def _settle(self, outcome: Outcome) -> None:
        for timer in self._timers:
            timer.cancel()
        self._timers.clear()
        self._sink = None  # nothing after the end of a response goes to this client
        if not self._done.done():
            self._done.set_result(outcome)


def _retrieve(future: asyncio.Future[None]) -> None:
    if not future.cancelled():
        future.exception()
