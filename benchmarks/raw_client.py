"""A closed-loop load client on uvloop and httptools, for runs where the client must be
cheap: many gateway processes on a machine of 16 cores.

    output = run_raw(target, num_requests, in_flight, processes)   # a RunOutput

rayfleet bench's runner (aiohttp's client, with its SSE timing) costs a few hundred us of
CPU a request. On the 16-core machine, four gateway processes at about 5,600 req/s each
need more load than six such client processes and six simulator processes can give
together: there, four bare relays (bare_relay.py, 67 us a request) carried fewer req/s
than four gateways, so the rig and not the gateway set the ceiling. This client spends a
fraction of that per request, so the simulated replicas can have the cores instead.

Each of ``processes`` processes (spawned, uvloop) opens its share of ``in_flight``
keep-alive connections to ``target`` and sends on each the next streamed completion as
soon as the last one ended, until it has sent its share of ``num_requests``. A request's
TTFT runs from its write to the first body bytes that carry a choice (``"choices":[{``,
as the bench's client reads it); it is done at the end of the chunked body (httptools'
``on_message_complete``), ok when the status is 200 and ``[DONE]`` came. The results are
the bench's ``RequestResult`` (status, start, TTFT, end-to-end time), so ``summary`` and
the tables read them as they read the runner's. Not handled: redirects, a connection the
server closes between requests (counted as a failure, and that connection stops).
"""

from __future__ import annotations

import asyncio
import json
import multiprocessing as mp
import time
from typing import Any
from urllib.parse import urlsplit

import httptools
import uvloop
from gateway_capacity import capacity_prompt

from rayfleet.bench.client import CHOICE_MARKERS, RequestResult, Target, request_body
from rayfleet.bench.drive import RunOutput

_DONE = b"data: [DONE]"

# (ok, status, start_s, ttft_s, e2e_s) of one request, as a process sends them back.
Row = tuple[bool, int, float, float, float]


def request_bytes(target: Target, n: int) -> bytes:
    """Request ``n``'s head and body: the bench runner's body for gateway_capacity.py's
    prompt ``n`` (a streamed completion of 16 tokens, usage included)."""
    parts = urlsplit(target.url)
    body = json.dumps(request_body(target, capacity_prompt(n))).encode()
    head = (
        f"POST {parts.path} HTTP/1.1\r\nHost: {parts.netloc}\r\n"
        f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n"
    )
    return head.encode() + body


class _Connection(asyncio.Protocol):
    """One keep-alive connection carrying one request at a time."""

    def __init__(self) -> None:
        self.parser = httptools.HttpResponseParser(self)
        self.transport: asyncio.Transport | None = None
        self.done: asyncio.Future[Row] | None = None
        self.closed = asyncio.get_running_loop().create_future()

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def send(self, payload: bytes) -> asyncio.Future[Row]:
        assert self.transport is not None
        self.done = asyncio.get_running_loop().create_future()
        self.start = time.perf_counter()
        self.ttft = 0.0
        self.tail = b""
        self.saw_done = False
        self.transport.write(payload)
        return self.done

    def data_received(self, data: bytes) -> None:
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserError:
            self._fail()

    def on_body(self, piece: bytes) -> None:
        if not self.ttft and any(marker in piece for marker in CHOICE_MARKERS):
            self.ttft = time.perf_counter() - self.start
        # The end marker may straddle two pieces: look in the last bytes and this piece.
        if not self.saw_done:
            self.saw_done = _DONE in self.tail + piece
            self.tail = piece[-len(_DONE) :]

    def on_message_complete(self) -> None:
        status = self.parser.get_status_code()
        ok = status == 200 and self.saw_done and self.ttft > 0
        if self.done is not None and not self.done.done():
            end = time.perf_counter() - self.start
            self.done.set_result((ok, status, self.start, self.ttft, end))

    def connection_lost(self, exc: Exception | None) -> None:
        self._fail()
        if not self.closed.done():
            self.closed.set_result(None)

    def _fail(self) -> None:
        if self.done is not None and not self.done.done():
            self.done.set_result((False, 0, self.start, 0.0, time.perf_counter() - self.start))
        if self.transport is not None:
            self.transport.close()


async def _loop(target: Target, first: int, count: int, connections: int, start: Any) -> list[Row]:
    """This process's share: its connections opened, then (once every process has its
    own, ``start``: a barrier) the closed loop."""
    parts = urlsplit(target.url)
    loop = asyncio.get_running_loop()
    payloads = [request_bytes(target, first + n) for n in range(count)]
    rows: list[Row] = []
    next_index = iter(range(count))
    opened = await asyncio.gather(
        *(
            loop.create_connection(_Connection, parts.hostname, parts.port)
            for _ in range(connections)
        )
    )
    start.wait()  # blocks the loop on purpose: nothing runs on it yet

    async def one_connection(conn: _Connection) -> None:
        for n in next_index:
            row = await conn.send(payloads[n])
            rows.append(row)
            if not row[0] and conn.closed.done():
                break
        if conn.transport is not None:
            conn.transport.close()

    await asyncio.gather(*(one_connection(conn) for _, conn in opened))
    return rows


def _process(
    target: Target, first: int, count: int, connections: int, start: Any, queue: Any
) -> None:
    queue.put(uvloop.run(_loop(target, first, count, connections, start)))


def run_raw(target: Target, num_requests: int, in_flight: int, processes: int) -> RunOutput:
    """``num_requests`` streamed completions to ``target``, ``in_flight`` at a time over
    ``processes`` processes (started with spawn; each inherits this process's CPU
    affinity)."""
    context = mp.get_context("spawn")
    queue: Any = context.Queue()
    start = context.Barrier(processes)
    per_process = -(-num_requests // processes)
    connections = max(1, in_flight // processes)
    workers = [
        context.Process(
            target=_process,
            args=(
                target,
                n * per_process,
                per_process,
                connections,
                start,
                queue,
            ),
        )
        for n in range(processes)
    ]
    for worker in workers:
        worker.start()
    rows: list[Row] = [row for _ in workers for row in queue.get()]
    for worker in workers:
        worker.join()
    results = [
        RequestResult(ok=ok, status=status, start_s=began, ttft_s=ttft, e2e_s=e2e)
        for ok, status, began, ttft, e2e in rows
    ]
    start_s = min((r.start_s for r in results), default=0.0)
    end_s = max((r.start_s + r.e2e_s for r in results), default=0.0)
    return RunOutput(results=results, start_s=start_s, end_s=end_s)
