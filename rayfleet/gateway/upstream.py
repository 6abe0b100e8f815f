"""What the gateway sends a request to: one interface, two implementations.

An ``Upstream`` opens one exchange per request and returns once the response head is in::

    exchange = await upstream.open(url, body, headers, limits)   # TimeLimits
    exchange.status, exchange.content_type, exchange.charset
    outcome = await exchange.relay(request, response)   # Outcome; prepares ``response``
    exchange.first_byte_at, exchange.tail()              # for metrics and a cut-off stream
    exchange.end()                                       # where the usage is, once DONE
    exchange.keep_body(max_bytes); ...; exchange.body()  # the body, when asked first
    exchange.finish(completed=outcome is Outcome.DONE)   # back to a pool, or closed

``open`` raises ``UpstreamConnectError`` when no response head came (nothing reached the
upstream, or it went away before answering: safe to retry elsewhere) and ``TimeoutError``
when the time limits ran out first. ``relay`` sends the body to the client as it arrives;
a response it could not start (a body that is not streamed and did not arrive whole) is
left unprepared, so that the caller can still answer with an error of its own.

Implementations: ``RelayPool`` (relay_pool.py; replicas over plain HTTP, no coroutine
step per streamed token) and ``AiohttpUpstream`` here (fallback providers, https, and
replicas when the relay is off), whose cost per token is a reader coroutine's wake-up.
"""

from __future__ import annotations

import enum
import logging
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Protocol

import aiohttp
from aiohttp import web

log = logging.getLogger("rayfleet.gateway")

_UPSTREAM_ERRORS = (aiohttp.ClientError, ConnectionError)


class Outcome(enum.Enum):
    """How the relay of one response body ended."""

    DONE = "done"
    BROKEN = "broken"  # the upstream went away or sent what is not HTTP
    TIMEOUT = "timeout"
    CLIENT_GONE = "client_gone"


class UpstreamConnectError(ConnectionError):
    """The request did not get a response head from the upstream: safe to retry."""


@dataclass(frozen=True)
class TimeLimits:
    """How long one request may take: in all, to connect, and without a byte of output."""

    total_s: float
    connect_s: float | None = None
    idle_s: float | None = None


class Exchange(Protocol):
    """One request's response from an upstream, its head already received."""

    status: int
    content_type: str
    charset: str | None
    first_byte_at: float  # time.perf_counter() of the first byte of body; 0.0 before

    async def relay(self, request: web.Request, response: web.StreamResponse) -> Outcome:
        """Prepare ``response`` (status and headers set by the caller) and send the body."""
        ...

    def tail(self) -> bytes | None:
        """The last piece of a streamed body (None when the body is not a stream)."""
        ...

    def end(self) -> bytes:
        """The end of the body as received: a whole body, or a stream's last two pieces
        (vLLM's usage chunk comes just before ``[DONE]``)."""
        ...

    def keep_body(self, max_bytes: int) -> None:
        """Keep the body's pieces from now on (called before ``relay``), for ``body``: a
        stream's first ``max_bytes``."""
        ...

    def body(self) -> bytes:
        """The body once relayed: a whole body always; of a stream, the pieces kept."""
        ...

    def finish(self, completed: bool) -> None:
        """Give the connection back for reuse when ``completed``, else close it."""
        ...


class Upstream(Protocol):
    async def open(
        self, url: str, body: bytes, headers: Mapping[str, str], limits: TimeLimits
    ) -> Exchange:
        """POST ``body`` to ``url`` and wait for the response head."""
        ...


class AiohttpUpstream:
    """Upstreams through aiohttp's client: pooled connections, bytes passed through."""

    def __init__(self) -> None:
        self._session: aiohttp.ClientSession | None = None

    async def start(self) -> None:
        connector = aiohttp.TCPConnector(limit=0, keepalive_timeout=60)
        self._session = aiohttp.ClientSession(connector=connector, auto_decompress=False)

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()

    async def open(
        self, url: str, body: bytes, headers: Mapping[str, str], limits: TimeLimits
    ) -> AiohttpExchange:
        if self._session is None:
            raise RuntimeError("AiohttpUpstream.start() was not awaited")
        timeout = aiohttp.ClientTimeout(
            total=limits.total_s, sock_connect=limits.connect_s, sock_read=limits.idle_s
        )
        try:
            response = await self._session.post(url, data=body, headers=headers, timeout=timeout)
        except aiohttp.ConnectionTimeoutError as exc:  # a TimeoutError, but before any byte
            raise UpstreamConnectError(f"no connection within {limits.connect_s:g} s") from exc
        except TimeoutError:
            raise
        except _UPSTREAM_ERRORS as exc:
            raise UpstreamConnectError(repr(exc)) from exc
        return AiohttpExchange(response)


class AiohttpExchange:
    def __init__(self, upstream: aiohttp.ClientResponse):
        self._upstream = upstream
        self.status = upstream.status
        self.content_type = upstream.content_type
        self.charset = upstream.charset
        self.first_byte_at = 0.0
        self._last_chunk = b""
        self._chunk_before = b""
        self._kept: list[bytes] | None = None
        self._kept_room = 0

    async def relay(self, request: web.Request, response: web.StreamResponse) -> Outcome:
        upstream = self._upstream
        if upstream.content_length is not None:
            response.content_length = upstream.content_length
        await response.prepare(request)
        while True:
            try:
                chunk = await upstream.content.readany()
            except TimeoutError:
                return Outcome.TIMEOUT
            except _UPSTREAM_ERRORS as exc:
                log.warning("%s broke mid-response: %r", upstream.url, exc)
                return Outcome.BROKEN
            if not chunk:
                return Outcome.DONE
            if not self.first_byte_at:
                self.first_byte_at = time.perf_counter()
            await response.write(chunk)
            self._chunk_before = self._last_chunk
            self._last_chunk = chunk
            if self._kept is not None and self._kept_room > 0:  # the body's beginning
                self._kept.append(chunk[: self._kept_room])
                self._kept_room -= len(chunk)

    def tail(self) -> bytes | None:
        return self._last_chunk if self.content_type == "text/event-stream" else None

    def end(self) -> bytes:
        return self._chunk_before + self._last_chunk

    def keep_body(self, max_bytes: int) -> None:
        self._kept = []
        self._kept_room = max_bytes

    def body(self) -> bytes:
        return b"".join(self._kept or ())

    def finish(self, completed: bool) -> None:
        if completed:
            self._upstream.release()
        else:
            self._upstream.close()
