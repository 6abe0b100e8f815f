"""What the HTTP front end alone costs per streamed request: aiohttp's server against a
bare asyncio protocol on httptools, side by side.

    python benchmarks/server_floor.py --rounds 6 --in-flight 64 --duration-s 5 \\
        --client-processes 8                                    # 16 cores
    .venv/bin/python benchmarks/server_floor.py --rounds 2 --duration-s 2 \\
        --client-processes 1 --max-rps 2000                     # 2 cores: a smoke run

The gateway serves clients with aiohttp's server. Whether a front end of its own would
bring it to 5,000 requests a second on one core depends on what aiohttp's part of a
request costs, which a profile of the whole gateway spreads over many frames. Here each
server answers every POST with the same bytes, the SSE stream of a 16-token completion
(usage included) in chunked encoding, in one write: what the gateway sends when a
replica's whole stream came in one read. Nothing is read from a replica, so the
difference between them is the front end's own cost:

- ``aiohttp``: a handler that reads the body and answers with a ``StreamResponse``
  (chunked, ``write_eof`` with the stream), served as the gateway serves (uvloop,
  ``handler_cancellation``), with no middleware;
- ``bare+task``: an ``asyncio.Protocol`` whose httptools parser collects the request,
  and a task per request that writes the answer (a gateway must await its replica, so
  it needs a coroutine per request);
- ``bare``: the same protocol answering from the parser's callback, no task: the floor;
- ``bare+aiohttp``: the protocol and its task, the task building aiohttp's request object
  around the parsed message and answering through aiohttp's ``StreamResponse``, as the
  aiohttp handler does: what a front end of the gateway's own would cost if it kept
  aiohttp's request and response objects (and so every handler unchanged), skipping only
  aiohttp's connection loop, router and middleware.

Each round starts each server in a fresh process pinned to core 0 (when the machine has
more than 2 cores), warms it, and drives it with the same closed loop of ``--in-flight``
streamed completions (rayfleet bench's runner, its processes on the other cores); the
order of the servers is reversed every other round. Printed: req/s and CPU per request
per round, and the median of the per-round ratios to aiohttp.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from gateway_capacity import MODEL, run, summary

from rayfleet.bench.client import Target
from rayfleet.sim.engine import SimRequest
from rayfleet.sim.server import DONE, Chunks, sse_event

KINDS = ("aiohttp", "bare+task", "bare", "bare+aiohttp")
_TOKENS = 16


def sse_stream() -> bytes:
    """The body of a streamed 16-token completion with its usage, framed by the
    simulator's ``Chunks`` as vLLM frames it."""
    chunks = Chunks(MODEL, is_chat=False)
    request = SimRequest(_TOKENS, _TOKENS, [], num_output_tokens=_TOKENS)
    tokens = [chunks.token(first=n == 1, last=n == _TOKENS) for n in range(1, _TOKENS + 1)]
    return b"".join(tokens) + sse_event(chunks.usage_chunk(request)) + DONE


def chunked_answer(body: bytes) -> bytes:
    head = (
        b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n"
    )
    return head + b"%x\r\n%b\r\n0\r\n\r\n" % (len(body), body)


def serve_aiohttp(sock_port: int) -> None:
    from aiohttp import web

    body = sse_stream()

    async def completions(request: web.Request) -> web.StreamResponse:
        await request.read()
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        response.enable_chunked_encoding()
        await response.prepare(request)
        await response.write_eof(body)
        return response

    async def main() -> None:
        app = web.Application()
        app.router.add_post("/v1/completions", completions)
        runner = web.AppRunner(app, handler_cancellation=True, access_log=None)
        await runner.setup()
        await web.TCPSite(runner, "127.0.0.1", sock_port).start()
        print("ready", flush=True)
        await asyncio.Event().wait()

    _run(main())


def serve_bare(sock_port: int, with_task: bool) -> None:
    import httptools

    answer = chunked_answer(sse_stream())

    class Connection(asyncio.Protocol):
        def connection_made(self, transport: asyncio.BaseTransport) -> None:
            self.transport = transport
            self.parser = httptools.HttpRequestParser(self)
            self.body: list[bytes] = []

        def data_received(self, data: bytes) -> None:
            try:
                self.parser.feed_data(data)
            except httptools.HttpParserError:
                self.transport.close()

        def on_body(self, piece: bytes) -> None:
            self.body.append(piece)

        def on_message_complete(self) -> None:
            self.body.clear()
            if with_task:
                asyncio.get_running_loop().create_task(self.answer())
            else:
                self.transport.write(answer)

        async def answer(self) -> None:
            self.transport.write(answer)

    async def main() -> None:
        loop = asyncio.get_running_loop()
        await loop.create_server(Connection, "127.0.0.1", sock_port, backlog=4096)
        print("ready", flush=True)
        await asyncio.Event().wait()

    _run(main())


def serve_bare_aiohttp(sock_port: int) -> None:
    """httptools' parser and a task per request, aiohttp's request and response objects."""
    import httptools
    from aiohttp import web
    from aiohttp.base_protocol import BaseProtocol
    from aiohttp.http import HttpVersion11
    from aiohttp.http_parser import RawRequestMessage
    from aiohttp.http_writer import StreamWriter
    from aiohttp.streams import StreamReader
    from multidict import CIMultiDict, CIMultiDictProxy
    from yarl import URL

    body = sse_stream()

    class Connection(BaseProtocol):
        ssl_context = None
        max_field_size = 8190
        max_headers = 128

        def connection_made(self, transport: asyncio.BaseTransport) -> None:
            super().connection_made(transport)
            self.peername = transport.get_extra_info("peername")
            self.sockname = transport.get_extra_info("sockname")
            self.parser = httptools.HttpRequestParser(self)
            self.headers: CIMultiDict[str] = CIMultiDict()
            self.body: list[bytes] = []

        def data_received(self, data: bytes) -> None:
            try:
                self.parser.feed_data(data)
            except httptools.HttpParserError:
                assert self.transport is not None
                self.transport.close()

        def on_url(self, url: bytes) -> None:
            self.url = url.decode("ascii")

        def on_header(self, name: bytes, value: bytes) -> None:
            self.headers.add(name.decode("latin-1"), value.decode("latin-1"))

        def on_body(self, piece: bytes) -> None:
            self.body.append(piece)

        def on_message_complete(self) -> None:
            headers, self.headers = CIMultiDictProxy(self.headers), CIMultiDict()
            data, self.body = b"".join(self.body), []
            message = RawRequestMessage(
                "POST",
                self.url,
                HttpVersion11,
                headers,
                (),
                False,
                None,
                False,
                False,
                URL.build(path=self.url, encoded=True),
            )
            asyncio.get_running_loop().create_task(self.answer(message, data))

        async def answer(self, message: RawRequestMessage, data: bytes) -> None:
            loop = asyncio.get_running_loop()
            payload = StreamReader(self, 2**16, loop=loop)
            payload.feed_data(data)
            payload.feed_eof()
            task = asyncio.current_task()
            assert task is not None
            request = web.BaseRequest(message, payload, self, StreamWriter(self, loop), task, loop)  # type: ignore[arg-type]
            await request.read()
            response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
            response.enable_chunked_encoding()
            await response.prepare(request)
            await response.write_eof(body)

    async def main() -> None:
        loop = asyncio.get_running_loop()
        await loop.create_server(lambda: Connection(loop), "127.0.0.1", sock_port, backlog=4096)
        print("ready", flush=True)
        await asyncio.Event().wait()

    _run(main())


def _run(main: object) -> None:
    import uvloop

    uvloop.run(main)  # type: ignore[arg-type]


class Server:
    """One server of ``kind`` in a process of its own, pinned to ``cpu`` when given."""

    def __init__(self, kind: str, port: int, cpu: int | None):
        self.kind, self.port, self.cpu = kind, port, cpu

    def __enter__(self) -> Server:
        argv = [sys.executable, __file__, "serve", self.kind, str(self.port)]
        self.proc = subprocess.Popen(argv, stdout=subprocess.PIPE, text=True)
        assert self.proc.stdout is not None
        if self.proc.stdout.readline().strip() != "ready":
            raise RuntimeError(f"the {self.kind} server exited ({self.proc.wait()})")
        if self.cpu is not None:
            os.sched_setaffinity(self.proc.pid, {self.cpu})
        return self

    def cpu_s(self) -> float:
        import psutil

        times = psutil.Process(self.proc.pid).cpu_times()
        return times.user + times.system

    def __exit__(self, *exc: object) -> None:
        self.proc.terminate()
        self.proc.wait(timeout=10)


def measure(args: argparse.Namespace) -> list[dict]:
    from rayfleet.control.engine import free_port

    many_cores = (os.cpu_count() or 1) > 2
    if many_cores:
        os.sched_setaffinity(0, set(range(1, os.cpu_count() or 2)))  # the client's cores
    rows = []
    for n in range(args.rounds):
        for kind in KINDS if n % 2 == 0 else KINDS[::-1]:
            with Server(kind, free_port(), 0 if many_cores else None) as server:
                target = Target(f"http://127.0.0.1:{server.port}", "/v1/completions", MODEL)
                run(target, 500, 1, args.client_processes, 0, args.in_flight)  # warm
                before = server.cpu_s()
                output = run(
                    target, args.max_rps, args.duration_s, args.client_processes, 0, args.in_flight
                )
                used = server.cpu_s() - before
            row = {"round": n, "server": kind} | summary(output)
            row["cpu_us_per_request"] = 1e6 * used / max(len(output.results), 1)
            print(json.dumps(row), flush=True)
            rows.append(row)
    return rows


def print_table(rows: list[dict]) -> None:
    by_round = {(r["round"], r["server"]): r for r in rows}
    rounds = sorted({r["round"] for r in rows})
    print(f"\n{'server':>10} {'req/s per round':>36} {'CPU/req per round (us)':>30} ratio")
    for kind in KINDS:
        mine = [by_round[(n, kind)] for n in rounds]
        rps = ", ".join(f"{r['achieved_rps']:,.0f}" for r in mine)
        cpu = ", ".join(f"{r['cpu_us_per_request']:.0f}" for r in mine)
        ratio = statistics.median(
            by_round[(n, kind)]["cpu_us_per_request"]
            / by_round[(n, "aiohttp")]["cpu_us_per_request"]
            for n in rounds
        )
        print(f"{kind:>10} {rps:>36} {cpu:>30} {ratio:.2f}x CPU/req")


def main() -> None:
    if sys.argv[1:2] == ["serve"]:
        kind, port = sys.argv[2], int(sys.argv[3])
        if kind == "aiohttp":
            serve_aiohttp(port)
        elif kind == "bare+aiohttp":
            serve_bare_aiohttp(port)
        else:
            serve_bare(port, with_task=kind == "bare+task")
        return
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--duration-s", type=float, default=5.0)
    parser.add_argument("--in-flight", type=int, default=64)
    parser.add_argument(
        "--max-rps", type=float, default=12000.0, help="sizes the closed loop: this x duration"
    )
    parser.add_argument("--client-processes", type=int, default=max(1, (os.cpu_count() or 1) - 2))
    parser.add_argument("--out", type=Path, default=Path("results/server_floor.json"))
    args = parser.parse_args()
    rows = measure(args)
    print_table(rows)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
