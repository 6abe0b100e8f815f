"""The request loop against the simulator: chunk timing, usage, headers and failures.

The simulator (rayfleet.bench.simulator) stands in where a real engine cannot: it fails
on purpose and sets the gateway's replica header, which no vLLM server does.
"""

from __future__ import annotations

import asyncio
import socket
import threading
from typing import ClassVar

import pytest
from aiohttp import web

from rayfleet.bench.client import Target, first_model, send_one
from rayfleet.bench.datasets import Prompt
from rayfleet.bench.simulator import SimulatorSpec, SimulatorThread

PROMPT = Prompt("hello world", 2, 8)


def test_completions_stream_is_timed_chunk_by_chunk():
    with SimulatorThread(SimulatorSpec(token_delay_s=0.01, first_token_delay_s=0.05)) as sim:
        result = send_one(Target(sim.url, model="sim"), PROMPT)
    assert result.ok and result.status == 200 and result.error == ""
    assert result.num_output_tokens == 8 and len(result.itl_s) == 7
    # The server waits 50 ms before the first token and 10 ms between tokens; receipt
    # times can bunch up on a busy machine, but the last cannot come before 50 + 7 x 10 ms.
    assert result.ttft_s >= 0.05 and result.e2e_s >= 0.12
    assert result.e2e_s == pytest.approx(result.ttft_s + sum(result.itl_s))
    assert result.num_input_tokens == len("hello world") // 4  # the server's count wins


def test_chat_endpoint_and_replica_header():
    with SimulatorThread(SimulatorSpec(replica_names=("tiny-1",))) as sim:
        result = send_one(Target(sim.url, endpoint="/v1/chat/completions", model="sim"), PROMPT)
    assert result.ok and result.num_output_tokens == 8 and result.replica == "tiny-1"


def test_error_status_is_recorded_with_its_code():
    with SimulatorThread(SimulatorSpec(fail_every=1, fail_status=429, replica_names=("r",))) as sim:
        result = send_one(Target(sim.url, model="sim"), PROMPT)
    assert not result.ok and result.status == 429 and result.error_kind == "429"
    assert "simulated failure" in result.error and result.replica == "r"


def test_error_event_after_the_first_token_fails_the_request():
    with SimulatorThread(SimulatorSpec(stream_error_every=1)) as sim:
        result = send_one(Target(sim.url, model="sim"), PROMPT)
    assert not result.ok and result.status == 200
    assert result.error == "stream error: replica lost" and result.error_kind == "stream error"


def test_refused_connection_is_a_failed_request_not_a_crash():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    result = send_one(Target(f"http://127.0.0.1:{port}", model="x"), PROMPT)
    assert not result.ok and result.status == 0
    assert result.error_kind == "ClientConnectorError"


def test_timeout_counts_as_failed():
    with SimulatorThread(SimulatorSpec(first_token_delay_s=2.0)) as sim:
        result = send_one(Target(sim.url, model="sim", request_timeout_s=0.2), PROMPT)
    assert not result.ok and result.error_kind == "timeout"


def test_first_model_is_read_from_the_model_list():
    with SimulatorThread() as sim:
        assert first_model(sim.url) == "sim"


class SplitChunkServer:
    """Streams vLLM-shaped events cut at awkward byte offsets, and a usage chunk that
    reports more tokens than chunks (a server that batches tokens)."""

    EVENTS: ClassVar[list[bytes]] = [
        b'data: {"choices":[{"index":0,"text":"a"}]}\n\n',
        b'data: {"choices":[{"index":0,"text":"error"}]}\n\n',
        b'data: {"choices":[{"index":0,"text":"c"}]}\n\n',
        b'data: {"choices":[],"usage":{"prompt_tokens":3,"completion_tokens":5}}\n\n',
        b"data: [DONE]\n\n",
    ]

    def __init__(self):
        self.ready = threading.Event()
        self.port = 0

    async def handler(self, request):
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        stream = b"".join(self.EVENTS)
        for start in range(0, len(stream), 17):
            await response.write(stream[start : start + 17])
            await asyncio.sleep(0.002)
        return response

    def serve(self):
        async def main():
            app = web.Application()
            app.router.add_post("/v1/completions", self.handler)
            runner = web.AppRunner(app)
            await runner.setup()
            sock = socket.socket()
            sock.bind(("127.0.0.1", 0))
            self.port = sock.getsockname()[1]
            await web.SockSite(runner, sock).start()
            self.ready.set()
            await asyncio.sleep(30)

        asyncio.run(main())


def test_events_split_across_reads_are_parsed_and_usage_wins():
    server = SplitChunkServer()
    threading.Thread(target=server.serve, daemon=True).start()
    assert server.ready.wait(10)
    result = send_one(Target(f"http://127.0.0.1:{server.port}", model="x"), PROMPT)
    assert result.ok, result.error
    assert len(result.itl_s) == 2  # three chunks with a choice; the text "error" is no error
    assert result.num_output_tokens == 5 and result.num_input_tokens == 3


def test_the_gateways_error_event_fails_the_request():
    from rayfleet.bench.client import RequestResult, read_event
    from rayfleet.gateway.errors import sse_error_event

    result = RequestResult()
    event_line = sse_error_event("replica tiny-0 went away").split(b"\n")[0]
    read_event(event_line, result)
    assert result.error == "stream error: replica tiny-0 went away"
