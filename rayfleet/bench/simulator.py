"""A simulator of an OpenAI-compatible streaming endpoint, for measuring the bench itself.

It is not an engine: it streams canned SSE chunks shaped like vLLM's (one chunk per
token, then a usage chunk, then ``[DONE]``), as fast as asked. It exists for what a real
vLLM server cannot do on a small machine: answer thousands of requests per second (to
find the client's own limit), stream at a known pace (a fixed delay before the first
token and between tokens) so a client's numbers can be checked against the truth, and
fail on purpose (error statuses, errors mid-stream, the gateway's ``x-rayfleet-replica``
header) for tests of the bench's bookkeeping.

Its own view of every request is the ground truth: ``GET /simulator/stats`` answers the
number of requests seen and, per streamed request, ``[arrival_s, first_token_s, end_s,
num_tokens]`` on ``time.perf_counter()`` (the machine's monotonic clock, the one the
bench times with); ``POST /simulator/reset`` forgets them.

- ``SimulatorThread``: in this process, on a thread (tests);
- ``SimulatorProcess``: in processes of its own (benchmarks, so the client measured and
  the server do not share an event loop);
- ``python -m rayfleet.bench.simulator --port 9000 --num-processes 2 --token-delay-s 0.01``.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from dataclasses import dataclass
from typing import Any

from aiohttp import web

from rayfleet.bench.client import REPLICA_HEADER


@dataclass(frozen=True)
class SimulatorSpec:
    """How the simulated endpoint behaves."""

    token_delay_s: float = 0.0
    first_token_delay_s: float = 0.0
    max_tokens_cap: int = 4096
    replica_names: tuple[str, ...] = ()
    fail_every: int = 0
    fail_status: int = 503
    stream_error_every: int = 0
    keep_bodies: bool = False  # /simulator/stats lists each request's [arrival_s, body] too


def token_chunk(is_chat: bool) -> bytes:
    if is_chat:
        body = {
            "object": "chat.completion.chunk",
            "model": "sim",
            "choices": [{"index": 0, "delta": {"content": " tok"}, "finish_reason": None}],
        }
    else:
        body = {
            "object": "text_completion",
            "model": "sim",
            "choices": [{"index": 0, "text": " tok", "finish_reason": None}],
        }
    return b"data: " + json.dumps(body, separators=(",", ":")).encode() + b"\n\n"


def usage_chunk(num_prompt: int, num_completion: int) -> bytes:
    body = {
        "choices": [],
        "usage": {
            "prompt_tokens": num_prompt,
            "completion_tokens": num_completion,
            "total_tokens": num_prompt + num_completion,
        },
    }
    return b"data: " + json.dumps(body, separators=(",", ":")).encode() + b"\n\n"


def prompt_chars(body: dict[str, Any]) -> int:
    """The characters of a request's prompt, or of its messages' contents."""
    messages = body.get("messages")
    if isinstance(messages, list):
        return sum(len(str(m.get("content", ""))) for m in messages if isinstance(m, dict))
    return len(str(body.get("prompt", "")))


ERROR_EVENT = b'data: {"error":{"message":"replica lost","type":"server_error","code":502}}\n\n'
DONE = b"data: [DONE]\n\n"


async def stream_tokens(
    response: web.StreamResponse,
    spec: SimulatorSpec,
    chunk: bytes,
    num_tokens: int,
    fails: bool,
    usage: bytes,
    timing: list[Any],
) -> None:
    """Stream ``num_tokens`` chunks at ``spec``'s pace (or an error event after the first,
    when ``fails``), then ``usage`` and ``[DONE]``; ``timing[1:]`` becomes the first and
    last token's departure and the number of tokens sent."""
    if spec.first_token_delay_s:
        await asyncio.sleep(spec.first_token_delay_s)
    for i in range(num_tokens):
        if i and spec.token_delay_s:
            await asyncio.sleep(spec.token_delay_s)
        await response.write(chunk)
        timing[2:] = [time.perf_counter(), i + 1]
        if i == 0:
            timing[1] = timing[2]
            if fails:
                await response.write(ERROR_EVENT)
                return
    await response.write(usage + DONE)


def make_app(spec: SimulatorSpec) -> web.Application:
    """The simulator's aiohttp app: ``/v1/completions``, ``/v1/chat/completions``,
    ``/v1/models``, ``/simulator/stats`` (requests seen so far, with their timings) and
    ``/simulator/reset``."""
    seen: dict[str, Any] = {"num_requests": 0, "requests": [], "bodies": []}
    replicas = itertools.cycle(spec.replica_names) if spec.replica_names else None
    chunks = {False: token_chunk(False), True: token_chunk(True)}

    async def generate(request: web.Request) -> web.StreamResponse:
        arrival_s = time.perf_counter()
        seen["num_requests"] += 1
        number = seen["num_requests"]
        body = await request.json()
        if spec.keep_bodies:
            seen["bodies"].append([arrival_s, body])
        headers = {REPLICA_HEADER: next(replicas)} if replicas else {}
        if spec.fail_every and number % spec.fail_every == 0:
            return web.json_response(
                {"error": {"message": "simulated failure"}},
                status=spec.fail_status,
                headers=headers,
            )
        is_chat = "messages" in body
        num_tokens = min(
            int(body.get("max_tokens") or body.get("max_completion_tokens") or 16),
            spec.max_tokens_cap,
        )
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream", **headers})
        await response.prepare(request)
        timing = [arrival_s, 0.0, 0.0, 0]
        try:
            fails = bool(spec.stream_error_every) and number % spec.stream_error_every == 0
            usage = usage_chunk(prompt_chars(body) // 4, num_tokens)
            await stream_tokens(response, spec, chunks[is_chat], num_tokens, fails, usage, timing)
        except ConnectionError:  # the client went away (a cancelled bench): nothing to do
            pass
        seen["requests"].append(timing)
        return response

    async def stats(request: web.Request) -> web.Response:
        return web.json_response(seen)

    async def reset(request: web.Request) -> web.Response:
        seen["requests"] = []
        seen["bodies"] = []
        return web.json_response(seen)

    async def models(request: web.Request) -> web.Response:
        return web.json_response({"object": "list", "data": [{"id": "sim", "object": "model"}]})

    app = web.Application()
    app.router.add_post("/v1/completions", generate)
    app.router.add_post("/v1/chat/completions", generate)
    app.router.add_get("/v1/models", models)
    app.router.add_get("/simulator/stats", stats)
    app.router.add_post("/simulator/reset", reset)
    return app


def serve(spec: SimulatorSpec, host: str, port: int) -> None:
    """Serve until killed (one process; start several with ``reuse_port`` for more)."""
    try:
        import uvloop

        uvloop.install()
    except ImportError:
        pass
    web.run_app(
        make_app(spec),
        host=host,
        port=port,
        reuse_port=True,
        print=None,
        access_log=None,
        handle_signals=True,
    )


class SimulatorThread:
    """The simulator on a background thread of this process, for tests."""

    def __init__(self, spec: SimulatorSpec = SimulatorSpec(), host: str = "127.0.0.1"):
        self.spec = spec
        self.host = host
        self.port = 0
        self._ready = threading.Event()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread = threading.Thread(target=self._run, daemon=True)

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def __enter__(self) -> SimulatorThread:
        self._thread.start()
        if not self._ready.wait(timeout=30):
            raise RuntimeError("simulator did not start within 30 s")
        return self

    def __exit__(self, *exc: object) -> None:
        if self._loop:
            self._loop.call_soon_threadsafe(self._stop.set)
        self._thread.join(timeout=10)

    def _run(self) -> None:
        self._loop = asyncio.new_event_loop()
        self._loop.run_until_complete(self._main())

    async def _main(self) -> None:
        self._stop = asyncio.Event()
        runner = web.AppRunner(make_app(self.spec), access_log=None)
        await runner.setup()
        sock = socket.socket()
        sock.bind((self.host, 0))
        self.port = sock.getsockname()[1]
        site = web.SockSite(runner, sock)
        await site.start()
        self._ready.set()
        await self._stop.wait()
        await runner.cleanup()


class SimulatorProcess:
    """The simulator in ``num_processes`` processes of its own (one port, ``reuse_port``),
    started on entry once it listens and stopped, every process of it, on exit."""

    def __init__(self, spec: SimulatorSpec = SimulatorSpec(), num_processes: int = 1):
        self.spec = spec
        self.num_processes = num_processes
        self.host = "127.0.0.1"
        self.port = 0
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def argv(self) -> list[str]:
        return [
            *(sys.executable, "-m", "rayfleet.bench.simulator", "--port", str(self.port)),
            *("--num-processes", str(self.num_processes)),
            *("--token-delay-s", repr(self.spec.token_delay_s)),
            *("--first-token-delay-s", repr(self.spec.first_token_delay_s)),
        ]

    def __enter__(self) -> SimulatorProcess:
        with socket.socket() as s:
            s.bind((self.host, 0))
            self.port = s.getsockname()[1]
        self.proc = subprocess.Popen(self.argv(), start_new_session=True)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and self.proc.poll() is None:
            with socket.socket() as s:
                if s.connect_ex((self.host, self.port)) == 0:
                    return self
            time.sleep(0.05)
        self.__exit__()
        raise RuntimeError(f"simulator did not listen on port {self.port} within 30 s")

    def __exit__(self, *exc: object) -> None:
        if self.proc is None:
            return
        try:
            os.killpg(self.proc.pid, signal.SIGTERM)
            self.proc.wait(timeout=10)
        except ProcessLookupError:
            pass
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()

    def stats(self) -> dict[str, Any]:
        """What the simulator saw (one of its processes, when there are several)."""
        with urllib.request.urlopen(self.url + "/simulator/stats", timeout=30) as response:
            stats: dict[str, Any] = json.loads(response.read())
        return stats

    def reset(self) -> None:
        request = urllib.request.Request(self.url + "/simulator/reset", method="POST")
        with urllib.request.urlopen(request, timeout=30):
            pass


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--num-processes", type=int, default=1)
    parser.add_argument("--token-delay-s", type=float, default=0.0)
    parser.add_argument("--first-token-delay-s", type=float, default=0.0)
    args = parser.parse_args()
    spec = SimulatorSpec(
        token_delay_s=args.token_delay_s, first_token_delay_s=args.first_token_delay_s
    )
    for _ in range(args.num_processes - 1):
        if os.fork() == 0:
            break
    serve(spec, args.host, args.port)


if __name__ == "__main__":
    main()
