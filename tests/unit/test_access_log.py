"""The gateway's request log and request id, through the real gateway, against a real
aiohttp upstream that answers as vLLM does (a whole body with its usage, or a stream whose
usage chunk comes just before ``[DONE]``) and remembers the headers it was sent.

The log is read from the file the fleet process writes (``open_access_log``); tests wait
on conditions (a line written, a request entered), never on fixed sleeps.
"""

from __future__ import annotations

import asyncio
import json
import re
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import aiohttp
from aiohttp import web
from multidict import CIMultiDict

from rayfleet.gateway.access_log import close_access_log, open_access_log
from rayfleet.gateway.app import Gateway
from rayfleet.gateway.server import start_gateway

PROMPT = "the secret prompt text"
USAGE = {"prompt_tokens": 5, "total_tokens": 12, "completion_tokens": 7}


class Upstream:
    """An OpenAI-like replica: remembers each request's headers; can stall a stream."""

    def __init__(self) -> None:
        self.headers: list[CIMultiDict[str]] = []
        self.entered = asyncio.Event()
        self.stall = False
        self.linger = False  # between [DONE] and the end of the response
        self.first_token: asyncio.Event | None = None  # set: the first token waits for it

    async def completions(self, request: web.Request) -> web.StreamResponse:
        self.headers.append(request.headers.copy())
        body = await request.json()
        self.entered.set()
        if not body.get("stream"):
            return web.json_response({"object": "text_completion", "usage": USAGE})
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        if self.first_token is not None:
            await self.first_token.wait()
        await response.write(b'data: {"choices":[{"text":"a"}]}\n\n')
        if self.stall:
            await asyncio.sleep(60)
        await response.write(b"data: " + json.dumps({"choices": [], "usage": USAGE}).encode())
        await response.write(b"\n\ndata: [DONE]\n\n")
        if self.linger:
            await asyncio.sleep(60)
        await response.write_eof()
        return response


Scenario = Callable[[aiohttp.ClientSession, str, Upstream, Path], Awaitable[None]]


def run(scenario: Scenario, tmp_path: Path) -> None:
    """An upstream, a gateway in front of it writing its log to tmp_path, then ``scenario``."""

    async def main() -> None:
        upstream = Upstream()
        app = web.Application()
        app.router.add_post("/v1/completions", upstream.completions)
        up_runner = web.AppRunner(app, access_log=None, handler_cancellation=True)
        await up_runner.setup()
        await web.TCPSite(up_runner, "127.0.0.1", 0).start()
        host, port = up_runner.addresses[0][:2]

        async def source() -> list[dict[str, Any]]:
            return [{"replica_id": "r0", "model": "m", "url": f"http://{host}:{port}"}]

        path = tmp_path / "access.log"
        handler = open_access_log(path)
        gateway = Gateway(["m"], source, replica_metrics_period_s=None)
        gw_runner = await start_gateway(gateway, "127.0.0.1", 0)
        gw_host, gw_port = gw_runner.addresses[0][:2]
        try:
            async with aiohttp.ClientSession() as client:
                await scenario(client, f"http://{gw_host}:{gw_port}", upstream, path)
        finally:
            await gw_runner.cleanup()
            await up_runner.cleanup()
            close_access_log(handler)

    asyncio.run(main())


async def lines(path: Path, count: int, timeout_s: float = 10.0) -> list[dict[str, Any]]:
    """The log's lines, once it has ``count`` of them."""
    deadline = time.monotonic() + timeout_s
    while True:
        text = path.read_text() if path.exists() else ""
        if len(text.splitlines()) >= count:
            return [json.loads(line) for line in text.splitlines()]
        assert time.monotonic() < deadline, f"no {count} log lines: {text!r}"
        await asyncio.sleep(0.01)


def test_a_whole_answer_logged_with_its_usage_and_the_clients_id(tmp_path):
    async def scenario(client, url, upstream, path):
        body = {"model": "m", "prompt": PROMPT}
        headers = {"x-request-id": "client-id-1"}
        async with client.post(f"{url}/v1/completions", json=body, headers=headers) as response:
            assert response.status == 200
            assert response.headers["x-request-id"] == "client-id-1"
            await response.read()
        assert upstream.headers[0]["x-request-id"] == "client-id-1"
        [line] = await lines(path, 1)
        assert line.keys() == {
            "time", "request_id", "path", "model", "replica", "status", "ttft_s",
            "duration_s", "prompt_tokens", "completion_tokens",
        }  # fmt: skip
        assert line["request_id"] == "client-id-1"
        assert (line["path"], line["model"], line["replica"], line["status"]) == (
            "/v1/completions",
            "m",
            "r0",
            200,
        )
        assert (line["prompt_tokens"], line["completion_tokens"]) == (5, 7)
        assert 0 < line["ttft_s"] <= line["duration_s"] < 10
        assert PROMPT not in path.read_text()

    run(scenario, tmp_path)


def test_a_stream_gets_a_made_id_forwarded_upstream_and_its_usage_logged(tmp_path):
    async def scenario(client, url, upstream, path):
        body = {"model": "m", "prompt": PROMPT, "stream": True}
        async with client.post(f"{url}/v1/completions", json=body) as response:
            made = response.headers["x-request-id"]
            assert b"[DONE]" in await response.read()
        assert re.fullmatch("[0-9a-f]{32}", made)
        assert upstream.headers[0]["x-request-id"] == made
        [line] = await lines(path, 1)
        assert (line["request_id"], line["status"], line["replica"]) == (made, 200, "r0")
        assert (line["prompt_tokens"], line["completion_tokens"]) == (5, 7)

    run(scenario, tmp_path)


def test_a_first_token_that_comes_after_the_head_is_timed(tmp_path):
    # The head reaches the client before the first token leaves the replica, so the relay
    # passes the first token on from its protocol callback, not from the handler's task.
    async def scenario(client, url, upstream, path):
        upstream.first_token = asyncio.Event()
        body = {"model": "m", "prompt": PROMPT, "stream": True}
        async with client.post(f"{url}/v1/completions", json=body) as response:
            assert response.status == 200
            upstream.first_token.set()
            assert b'"text":"a"' in await response.read()
        [line] = await lines(path, 1)
        assert 0 < line["ttft_s"] <= line["duration_s"] < 10
        assert (line["prompt_tokens"], line["completion_tokens"]) == (5, 7)

    run(scenario, tmp_path)


def test_an_unfit_client_id_is_replaced(tmp_path):
    async def scenario(client, url, upstream, path):
        for given in ("x" * 129, "has space", "tab\tinside"):
            body = {"model": "m", "prompt": "hi"}
            headers = {"x-request-id": given}
            async with client.post(f"{url}/v1/completions", json=body, headers=headers) as r:
                made = r.headers["x-request-id"]
            assert re.fullmatch("[0-9a-f]{32}", made), given
            assert upstream.headers[-1]["x-request-id"] == made
        assert len(await lines(path, 3)) == 3

    run(scenario, tmp_path)


def test_errors_carry_the_id_and_are_logged_with_their_code(tmp_path):
    async def scenario(client, url, upstream, path):
        headers = {"x-request-id": "err-1"}
        body = {"model": "nope", "prompt": PROMPT}
        async with client.post(f"{url}/v1/completions", json=body, headers=headers) as r:
            assert (r.status, r.headers["x-request-id"]) == (404, "err-1")
        async with client.post(f"{url}/v1/completions", data=b"{", headers=headers) as r:
            assert (r.status, r.headers["x-request-id"]) == (400, "err-1")
        async with client.get(f"{url}/v1/nothing-here") as r:  # aiohttp's 404, as JSON
            assert r.status == 404
            assert re.fullmatch("[0-9a-f]{32}", r.headers["x-request-id"])
        async with client.get(f"{url}/health") as r:
            assert r.headers["x-request-id"]
        unknown, bad = await lines(path, 2)
        assert (unknown["status"], unknown["replica"]) == (404, "gateway")
        assert unknown["error"] == "model_not_found"
        assert "model" not in unknown  # refused before a model was admitted
        assert (bad["status"], bad["request_id"]) == (400, "err-1")
        assert len(await lines(path, 2)) == 2  # only API requests are logged

    run(scenario, tmp_path)


def test_a_client_that_leaves_mid_stream_is_logged_as_499(tmp_path):
    async def scenario(client, url, upstream, path):
        upstream.stall = True
        body = {"model": "m", "prompt": "hi", "stream": True}
        headers = {"x-request-id": "leaver"}
        response = await client.post(f"{url}/v1/completions", json=body, headers=headers)
        assert await response.content.readany()
        response.close()  # gone before the end
        [line] = await lines(path, 1)
        assert (line["request_id"], line["status"]) == ("leaver", 499)

    run(scenario, tmp_path)


def test_a_client_that_closes_at_done_is_logged_as_answered(tmp_path):
    # The openai client closes at [DONE], before the response's end: not a 499.
    async def scenario(client, url, upstream, path):
        upstream.linger = True
        body = {"model": "m", "prompt": PROMPT, "stream": True}
        async with client.post(f"{url}/v1/completions", json=body) as response:
            await response.content.readuntil(b"data: [DONE]")
            response.close()
        [line] = await lines(path, 1)
        assert (line["status"], line["replica"]) == (200, "r0")
        assert (line["prompt_tokens"], line["completion_tokens"]) == (5, 7)

    run(scenario, tmp_path)
