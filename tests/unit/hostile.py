"""The harness of the hostile-client tests: the real gateway in front of a recording upstream.

``Recorder`` is a real aiohttp server answering the three /v1 POST routes as an OpenAI
server would (a JSON body, or server-sent events when ``stream`` is true); it keeps the
headers and body of every request it got, so tests check what went over the wire.
``serving(...)`` starts it and a ``Gateway`` served by ``start_gateway`` (its own
runner, limits and error handling), both on ports from the OS. ``exchange`` speaks raw
HTTP on a socket of its own, for requests no HTTP client would send.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web

from rayfleet.gateway.app import Gateway
from rayfleet.gateway.policies import Policies
from rayfleet.gateway.server import start_gateway

ROUTES = ("/v1/chat/completions", "/v1/completions", "/v1/embeddings")
HEALTH = b"GET /health HTTP/1.1\r\nHost: g\r\n\r\n"  # a request aiohttp's server answers
Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


@dataclass
class Recorder:
    """A scripted OpenAI-like upstream that records what it received."""

    requests: list[tuple[str, dict[str, str], bytes]] = field(default_factory=list)
    pieces: int = 3
    gap_s: float = 0.0
    big: bytes = b""  # written first on a stream
    written: int = 0  # bytes of streams written so far
    reply: Handler | None = None  # answers instead, once the request is recorded

    async def answer(self, request: web.Request) -> web.StreamResponse:
        raw = await request.read()
        self.requests.append((request.path, dict(request.headers), raw))
        if self.reply is not None:
            return await self.reply(request)
        body = json.loads(raw)
        if not body.get("stream"):
            return web.json_response({"object": "answer", "path": request.path})
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        for start in range(0, len(self.big), 64 * 1024):  # each write waits for the reader
            piece = self.big[start : start + 64 * 1024]
            await response.write(piece)
            self.written += len(piece)
        for i in range(self.pieces):
            piece = f"data: {json.dumps({'i': i})}\n\n".encode()
            await response.write(piece)
            self.written += len(piece)
            if self.gap_s:
                await asyncio.sleep(self.gap_s)
        await response.write(b"data: [DONE]\n\n")
        await response.write_eof()
        return response


@dataclass
class Served:
    gateway: Gateway
    upstream: Recorder
    host: str
    port: int
    upstream_url: str
    runner: web.AppRunner
    listed: list[str]  # the models whose replica the source lists (serving's ``listed``)

    def gateway_connections(self) -> list[Any]:
        """The client connections the gateway holds open now."""
        assert self.runner.server is not None
        return self.runner.server.connections

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"


@contextlib.asynccontextmanager
async def upstream_answering(answer: Handler, client_max_size: int = 1024**2) -> AsyncIterator[str]:
    """A real aiohttp server on a port from the OS answering every route in ``ROUTES``
    with ``answer``: its URL, the server stopped on exit."""
    app = web.Application(client_max_size=client_max_size)
    for route in ROUTES:
        app.router.add_post(route, answer)
    runner = web.AppRunner(app, access_log=None, handler_cancellation=True)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0).start()
    host, port = runner.addresses[0][:2]
    try:
        yield f"http://{host}:{port}"
    finally:
        await runner.cleanup()


@contextlib.asynccontextmanager
async def recording_upstream() -> AsyncIterator[tuple[Recorder, str]]:
    """A ``Recorder`` serving every route in ``ROUTES``: it and its URL."""
    recorder = Recorder()
    async with upstream_answering(recorder.answer, client_max_size=1024**3) as url:
        yield recorder, url


@contextlib.asynccontextmanager
async def serving(
    models: tuple[str, ...] = ("m",),
    policies: Policies | None = None,
    *,
    listed: list[str] | None = None,
    **gateway_kwargs: Any,
) -> AsyncIterator[Served]:
    """A recording upstream serving every model in ``models``, and a gateway before it.
    ``listed``: the models whose replica the gateway's source lists, read at each poll
    (default all of them; a test may change it while the gateway runs)."""
    listed = list(models) if listed is None else listed
    async with recording_upstream() as (upstream, up_url):

        async def source() -> list[dict[str, str]]:
            return [{"replica_id": f"{m}#0", "model": m, "url": up_url} for m in listed]

        gateway = Gateway(
            list(models), source, policies=policies, replica_metrics_period_s=None, **gateway_kwargs
        )
        runner = await start_gateway(gateway, "127.0.0.1", 0)
        host, port = runner.addresses[0][:2]
        try:
            yield Served(gateway, upstream, host, port, up_url, runner, listed)
        finally:
            await runner.cleanup()


@dataclass
class Answer:
    status: int
    headers: dict[str, str]
    body: bytes
    closed: bool  # the answer ends the connection (Connection: close, or HTTP/1.0)

    def json(self) -> Any:
        return json.loads(self.body)


async def read_answer(reader: asyncio.StreamReader, timeout_s: float = 10.0) -> Answer:
    """One HTTP response (Content-Length framed). A connection whose request body was left
    unread closes after aiohttp's lingering time (10 s of reading and dropping the rest),
    so ``closed`` is what the answer says, not an end of file."""
    async with asyncio.timeout(timeout_s):
        head = await reader.readuntil(b"\r\n\r\n")
        lines = head.decode("latin-1").split("\r\n")
        status = int(lines[0].split()[1])
        headers = {
            k.strip().lower(): v.strip() for k, _, v in (x.partition(":") for x in lines[1:] if x)
        }
        body = await reader.readexactly(int(headers.get("content-length", "0")))
        closed = headers.get("connection", "").lower() == "close" or lines[0].startswith("HTTP/1.0")
        return Answer(status, headers, body, closed)


async def exchange(served: Served, data: bytes, timeout_s: float = 10.0) -> Answer:
    """Send ``data`` as it is on a new connection and read the answer."""
    reader, writer = await asyncio.open_connection(served.host, served.port)
    try:
        writer.write(data)
        await writer.drain()
        return await read_answer(reader, timeout_s)
    finally:
        writer.close()


def post(path: str, body: bytes, extra_headers: bytes = b"") -> bytes:
    return (
        b"POST %b HTTP/1.1\r\nHost: gateway\r\nContent-Type: application/json\r\n%b"
        b"Content-Length: %d\r\n\r\n%b" % (path.encode(), extra_headers, len(body), body)
    )


def assert_openai_error(answer: Answer, status: int) -> dict[str, Any]:
    """``answer`` is OpenAI's error JSON with ``status``; its error object."""
    assert answer.status == status, (answer.status, answer.body[:300])
    assert answer.headers["content-type"].startswith("application/json")
    error = answer.json()["error"]
    assert set(error) == {"message", "type", "param", "code"} and error["message"]
    assert "Traceback" not in error["message"]
    return error


async def until(predicate: Any, timeout_s: float = 10.0) -> None:
    """Wait until ``predicate()`` holds; fail after ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while not predicate():
        assert time.monotonic() < deadline, "condition not reached"
        await asyncio.sleep(0.005)


async def still_serving(served: Served) -> None:
    """A good request after the hostile ones is answered by the upstream."""
    body = json.dumps({"model": "m", "prompt": "after"}).encode()
    answer = await exchange(served, post("/v1/completions", body))
    assert answer.status == 200 and answer.json()["object"] == "answer", answer.body[:300]
