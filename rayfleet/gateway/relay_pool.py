"""The relay's ``Upstream``: keep-alive connections to the replicas (see relay.py).

    pool = RelayPool()
    conn = await pool.open("http://127.0.0.1:8001/v1/completions", body, headers,
                           TimeLimits(total_s=600, connect_s=5))   # the head is in
    outcome = await conn.relay(request, response)
    conn.finish(completed=outcome is Outcome.DONE)   # kept for the next request, or closed

Connections are kept per host and port, a stack of idle ones each, and reused for at
most ``_IDLE_REUSE_S``, below the replica's own idle close. A kept connection that the
replica closed meanwhile is replaced without counting against the replica.
"""

from __future__ import annotations

import asyncio
import functools
import time
from collections.abc import Mapping
from urllib.parse import urlsplit

from rayfleet.gateway.relay import RelayConnection
from rayfleet.gateway.upstream import TimeLimits, UpstreamConnectError

_IDLE_REUSE_S = 4.0  # uvicorn closes idle keep-alive connections after 5 s

Key = tuple[str, int]


class RelayPool:
    """An ``Upstream`` for plain ``http://`` URLs (``handles``)."""

    def __init__(self) -> None:
        self._idle: dict[Key, list[RelayConnection]] = {}
        self._busy: set[RelayConnection] = set()

    @staticmethod
    def handles(url: str) -> bool:
        return url.startswith("http://")

    async def open(
        self, url: str, body: bytes, headers: Mapping[str, str], limits: TimeLimits
    ) -> RelayConnection:
        """Send a POST and wait for the response head; see upstream.py for the errors."""
        started = time.monotonic()
        key, path = _address(url)
        request = _request_head(key, path, headers, len(body)) + body
        conn = self._take_idle(key)
        if conn is not None:
            try:
                return await self._exchange(conn, request, limits, started)
            except UpstreamConnectError:
                if conn.got_bytes:
                    raise
                # The server closed it while idle: not the replica's fault; a new one.
        conn = await self._connect(key, limits, started)
        return await self._exchange(conn, request, limits, started)

    async def _exchange(
        self, conn: RelayConnection, request: bytes, limits: TimeLimits, started: float
    ) -> RelayConnection:
        """Send the request on ``conn`` and wait for the response head; close it on failure
        or cancellation (the client went away)."""
        self._busy.add(conn)
        try:
            conn.start(request, limits.total_s, limits.idle_s, started)
            await conn.head()
        except BaseException:
            self._busy.discard(conn)
            conn.close()
            raise
        return conn

    async def _connect(self, key: Key, limits: TimeLimits, started: float) -> RelayConnection:
        loop = asyncio.get_running_loop()
        limit = max(0.0, limits.total_s - (time.monotonic() - started))
        if limits.connect_s is not None:
            limit = min(limit, limits.connect_s)
        try:
            # asyncio.timeout, not wait_for: on Python 3.11, wait_for swallows a cancellation
            # that comes as the connection completes, and the request would go out for a
            # client that has already left.
            async with asyncio.timeout(limit):
                _, conn = await loop.create_connection(
                    lambda: RelayConnection(key, self._finish), *key
                )
        except TimeoutError:
            raise UpstreamConnectError(
                f"no connection to {key[0]}:{key[1]} within {limit:g} s"
            ) from None
        except OSError as exc:
            raise UpstreamConnectError(f"cannot connect to {key[0]}:{key[1]}: {exc}") from None
        return conn

    def _take_idle(self, key: Key) -> RelayConnection | None:
        stack = self._idle.get(key)
        now = time.monotonic()
        while stack:
            conn = stack.pop()
            if conn.connected and now - conn.idle_since < _IDLE_REUSE_S:
                return conn
            conn.close()
        return None

    def _finish(self, conn: RelayConnection, completed: bool) -> None:
        self._busy.discard(conn)
        if completed and conn.reusable():
            conn.idle_since = time.monotonic()
            self._idle.setdefault(conn.key, []).append(conn)
        else:
            conn.close()

    def idle(self) -> list[RelayConnection]:
        """The connections kept for reuse."""
        return [conn for stack in self._idle.values() for conn in stack]

    def busy(self) -> list[RelayConnection]:
        """The connections carrying a request now."""
        return list(self._busy)

    def close(self) -> None:
        for conn in [*self.idle(), *self._busy]:
            conn.close()
        self._idle.clear()
        self._busy.clear()


@functools.lru_cache(maxsize=4096)
def _address(url: str) -> tuple[Key, str]:
    """(host, port) and path of a replica's URL; a fleet has few, and each request asks."""
    parts = urlsplit(url)
    return (parts.hostname or "127.0.0.1", parts.port or 80), parts.path or "/"


def _request_head(key: Key, path: str, headers: Mapping[str, str], length: int) -> bytes:
    lines = [f"POST {path} HTTP/1.1", f"Host: {key[0]}:{key[1]}", f"Content-Length: {length}"]
    lines += [f"{name}: {value}" for name, value in headers.items()]
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")
