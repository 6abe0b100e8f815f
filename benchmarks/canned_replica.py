"""Canned replicas: the cheapest server that streams like the simulator. Not a simulator.

    with CannedReplicasProcess(num_replicas=32) as canned:   # canned.urls, canned.proc
        ...

For measuring how gateway.workers scales, not for anything about routing or engines. The
simulator (rayfleet sim, zero-cost spec) spends about 550 us of CPU a request on its
aiohttp server and engine loop: on the 16-core machine, ten simulator processes topped
out near 17,000-18,500 req/s, below what four gateway processes carry, so the rig and not
the gateway set the ceiling (README, "Several gateway processes"). These replicas answer
the same requests with the same bytes a simulated zero-cost replica sends, for a fraction
of that CPU:

- ``POST .../completions`` and ``.../chat/completions``: status 200, ``text/event-stream``
  in HTTP/1.1 chunks, one chunk per token (``max_tokens`` of them, 16 unless given), each
  in a write of its own and one a turn of the event loop for every open stream together,
  as the simulator's engine steps every running request once a turn; then the usage
  chunk when ``stream_options.include_usage`` asks, ``data: [DONE]`` and the end of the
  body. A request without ``"stream": true`` gets a 400: these replicas only stream.
- ``GET /metrics``: vLLM's gauges of running and waiting requests and KV use (streams
  open on that port, 0, 0); ``GET /health`` and ``/v1/models`` answer 200.
- Anything else: 404. A request httptools cannot parse closes its connection.

No prompt is read beyond the JSON fields above, no prefix cache, no queue, no latency
model: every request is answered at once. One process serves all its replicas (a port
each) on one uvloop loop; it prints their URLs as one JSON line once all listen.
"""

from __future__ import annotations

import asyncio
import json
import signal
import socket
import sys
from pathlib import Path
from typing import Any

import httptools
import uvloop

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from child_server import start_server, stop_server

from rayfleet.sim.server import DONE, Chunks, sse_event

_STREAM_HEAD = (
    b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream; charset=utf-8\r\n"
    b"Transfer-Encoding: chunked\r\n\r\n"
)
_NOT_FOUND = b"HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\n\r\n"
_DEFAULT_TOKENS = 16


def chunk(data: bytes) -> bytes:
    """``data`` as one HTTP/1.1 chunk."""
    return b"%x\r\n%b\r\n" % (len(data), data)


def whole(status: str, content_type: str, body: bytes) -> bytes:
    """A complete response with a ``Content-Length``."""
    head = f"HTTP/1.1 {status}\r\nContent-Type: {content_type}\r\nContent-Length: {len(body)}"
    return head.encode() + b"\r\n\r\n" + body


class Stream:
    """One streamed completion's remaining chunks, written one a turn."""

    __slots__ = ("chunks", "conn", "count", "max_tokens", "tail")

    def __init__(self, conn: CannedConnection, body: dict[str, Any], is_chat: bool):
        self.conn = conn
        self.chunks = Chunks(str(body.get("model", "")), is_chat)
        self.count = 0
        self.max_tokens = int(body.get("max_tokens") or _DEFAULT_TOKENS)
        self.tail = chunk(DONE) + b"0\r\n\r\n"
        if (body.get("stream_options") or {}).get("include_usage"):
            usage = {"prompt_tokens": 1, "completion_tokens": self.max_tokens,
                     "total_tokens": 1 + self.max_tokens,
                     "prompt_tokens_details": {"cached_tokens": 0}}  # fmt: skip
            usage_event = sse_event({**self.chunks.head, "choices": [], "usage": usage})
            self.tail = chunk(usage_event) + self.tail

    def step(self) -> bool:
        """Write the next token (with the stream's end after the last); False once done."""
        self.count += 1
        last = self.count >= self.max_tokens
        data = chunk(self.chunks.token(first=self.count == 1, last=last))
        self.conn.write(data + self.tail if last else data)
        return not last


class Replica:
    """One port's state: its open streams, stepped once a turn of the loop."""

    def __init__(self, ticker: Ticker):
        self.ticker = ticker
        self.open_streams = 0

    def metrics(self) -> bytes:
        text = (
            "# TYPE vllm:num_requests_running gauge\n"
            f'vllm:num_requests_running{{model_name="canned"}} {self.open_streams}\n'
            "# TYPE vllm:num_requests_waiting gauge\n"
            'vllm:num_requests_waiting{model_name="canned"} 0\n'
            "# TYPE vllm:kv_cache_usage_perc gauge\n"
            'vllm:kv_cache_usage_perc{model_name="canned"} 0\n'
        )
        return whole("200 OK", "text/plain; version=0.0.4", text.encode())


class Ticker:
    """Every open stream of the process steps once per turn of the loop."""

    def __init__(self) -> None:
        self.streams: list[Stream] = []
        self._loop = asyncio.get_running_loop()
        self._armed = False

    def add(self, stream: Stream) -> None:
        self.streams.append(stream)
        if not self._armed:
            self._armed = True
            self._loop.call_soon(self._turn)

    def _turn(self) -> None:
        streams, self.streams = self.streams, []
        for stream in streams:
            if stream.conn.transport is not None and stream.step():
                self.streams.append(stream)
            else:
                stream.conn.replica.open_streams -= 1
        self._armed = bool(self.streams)
        if self._armed:
            self._loop.call_soon(self._turn)


class CannedConnection(asyncio.Protocol):
    """One connection to a canned replica; requests one at a time."""

    def __init__(self, replica: Replica):
        self.replica = replica
        self.transport: asyncio.Transport | None = None
        self._parser = httptools.HttpRequestParser(self)
        self._url = b""
        self._body: list[bytes] = []

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def connection_lost(self, exc: Exception | None) -> None:
        self.transport = None

    def data_received(self, data: bytes) -> None:
        try:
            self._parser.feed_data(data)
        except httptools.HttpParserError:
            if self.transport is not None:
                self.transport.close()

    def write(self, data: bytes) -> None:
        if self.transport is not None:
            self.transport.write(data)

    def on_url(self, url: bytes) -> None:
        self._url += url

    def on_body(self, body: bytes) -> None:
        self._body.append(body)

    def on_message_complete(self) -> None:
        path, self._url = self._url.split(b"?")[0], b""
        body, self._body = b"".join(self._body), []
        method = self._parser.get_method()
        if method == b"POST" and path.endswith(b"/completions"):
            self._complete(json.loads(body or b"{}"), path.endswith(b"/chat/completions"))
        elif method == b"GET" and path == b"/metrics":
            self.write(self.replica.metrics())
        elif method == b"GET" and path in (b"/health", b"/v1/models"):
            models = {"object": "list", "data": [{"id": "canned", "object": "model"}]}
            self.write(whole("200 OK", "application/json", json.dumps(models).encode()))
        else:
            self.write(_NOT_FOUND)

    def _complete(self, body: dict[str, Any], is_chat: bool) -> None:
        if not body.get("stream"):
            error = {"error": {"message": "canned replicas only stream", "code": 400}}
            self.write(whole("400 Bad Request", "application/json", json.dumps(error).encode()))
            return
        stream = Stream(self, body, is_chat)
        self.write(_STREAM_HEAD)
        self.replica.open_streams += 1
        self.replica.ticker.add(stream)


async def serve(num_replicas: int) -> None:
    loop = asyncio.get_running_loop()
    ticker = Ticker()
    servers, urls = [], []
    for _ in range(num_replicas):
        replica = Replica(ticker)
        sock = socket.create_server(("127.0.0.1", 0), backlog=4096)
        servers.append(await loop.create_server(lambda r=replica: CannedConnection(r), sock=sock))
        urls.append(f"http://127.0.0.1:{sock.getsockname()[1]}")
    print(json.dumps(urls), flush=True)
    stop = asyncio.Event()
    loop.add_signal_handler(signal.SIGTERM, stop.set)
    await stop.wait()
    for server in servers:
        server.close()


class CannedReplicasProcess:
    """``num_replicas`` canned replicas in a process of their own; ``urls`` once they
    listen. ``proc`` is the process (``SimFleetProcess``'s names), for pinning."""

    def __init__(self, num_replicas: int):
        self.num_replicas = num_replicas
        self.urls: list[str] = []

    def __enter__(self) -> CannedReplicasProcess:
        argv = [sys.executable, __file__, str(self.num_replicas)]
        self.proc, line = start_server(argv, "the canned replicas")
        self.urls = json.loads(line)
        return self

    def __exit__(self, *exc: object) -> None:
        stop_server(self.proc)


def main() -> None:
    uvloop.run(serve(int(sys.argv[1])))


if __name__ == "__main__":
    main()
