"""The gateway's streaming relay against a scripted HTTP upstream, through the real gateway.

The upstream is a real aiohttp server whose handlers do what a vLLM server cannot be made
to do on demand: stall, break off mid-stream, drop idle connections. Requests go through
``Gateway`` (its relay path) and are read with aiohttp's client.
"""

from __future__ import annotations

import asyncio
import json

import aiohttp
import pytest
from aiohttp import web

from rayfleet.gateway.app import Gateway
from rayfleet.gateway.relay import RelayPool, UpstreamConnectError

BODY = {"model": "m", "prompt": "hi", "stream": True}


class Upstream:
    """A scripted OpenAI-like server; counts connections and remembers aborted streams."""

    def __init__(self):
        self.connections: set[tuple] = set()  # the gateway's ends, as (host, port)
        self.aborted = asyncio.Event()
        self.pieces = 5
        self.gap_s = 0.0
        self.stall_after: int | None = None
        self.break_after: int | None = None
        self.big: bytes = b""

    async def completions(self, request: web.Request) -> web.StreamResponse:
        self.connections.add(request.transport.get_extra_info("peername"))
        body = await request.json()
        if not body.get("stream"):
            return web.json_response({"object": "text_completion", "echo": body["prompt"]})
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        try:
            if self.big:
                await response.write(self.big)
            for i in range(self.pieces):
                if i == self.stall_after:
                    await asyncio.sleep(30)
                if i == self.break_after:
                    request.transport.close()
                    return response
                await response.write(f"data: {json.dumps({'i': i})}\n\n".encode())
                if self.gap_s:
                    await asyncio.sleep(self.gap_s)
            await response.write(b"data: [DONE]\n\n")
            await response.write_eof()
        except (ConnectionResetError, asyncio.CancelledError):
            self.aborted.set()
            raise
        return response


async def serve(app: web.Application, **kwargs) -> tuple[web.AppRunner, str]:
    runner = web.AppRunner(app, access_log=None, **kwargs)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]
    return runner, f"http://127.0.0.1:{port}"


def run(scenario, *, keepalive_s: float = 75.0, timeout_s: float = 600.0):
    """Start the upstream and a gateway in front of it, then run ``scenario``."""

    async def main():
        upstream = Upstream()
        up_app = web.Application()
        up_app.router.add_post("/v1/completions", upstream.completions)
        up_runner, up_url = await serve(
            up_app, keepalive_timeout=keepalive_s, handler_cancellation=True
        )

        async def source():
            return [{"replica_id": "r0", "model": "m", "url": up_url}]

        gateway = Gateway(["m"], source, request_timeout_s=timeout_s)
        gw_runner, gw_url = await serve(gateway.build_app(), handler_cancellation=True)
        try:
            async with aiohttp.ClientSession() as client:
                return await scenario(upstream, gateway, client, gw_url + "/v1/completions")
        finally:
            await gw_runner.cleanup()
            await up_runner.cleanup()

    return asyncio.run(main())


def events(text: str) -> list[str]:
    return [line for line in text.split("\n\n") if line]


def test_stream_relayed_whole_and_connection_reused():
    async def scenario(upstream, gateway, client, url):
        texts = []
        for _ in range(3):
            async with client.post(url, json=BODY) as response:
                assert response.status == 200
                assert response.headers["x-rayfleet-replica"] == "r0"
                assert response.content_type == "text/event-stream"
                texts.append(await response.text())
        async with client.post(url, json={**BODY, "stream": False}) as response:
            plain = await response.json()
        return texts, plain, len(upstream.connections)

    texts, plain, connections = run(scenario)
    for text in texts:
        assert events(text) == [f'data: {{"i": {i}}}' for i in range(5)] + ["data: [DONE]"]
    assert plain == {"object": "text_completion", "echo": "hi"}
    assert connections == 1  # one keep-alive connection carried all four requests


def test_connection_the_upstream_closed_while_idle_is_replaced():
    async def scenario(upstream, gateway, client, url):
        async with client.post(url, json=BODY) as response:
            await response.text()
        await asyncio.sleep(0.6)  # the upstream drops idle connections after 0.2 s
        async with client.post(url, json=BODY) as response:
            status, text = response.status, await response.text()
        return status, text, len(upstream.connections), gateway.replica_set.replicas()[0]

    status, text, connections, replica = run(scenario, keepalive_s=0.2)
    assert status == 200 and events(text)[-1] == "data: [DONE]"
    assert connections == 2
    assert replica.num_consecutive_failures == 0  # an idle close is not the replica's failure


def test_upstream_breaking_mid_stream_ends_with_an_error_event():
    async def scenario(upstream, gateway, client, url):
        upstream.break_after = 2
        async with client.post(url, json=BODY) as response:
            return response.status, await response.text()

    status, text = run(scenario)
    got = events(text)
    assert status == 200
    assert got[:2] == ['data: {"i": 0}', 'data: {"i": 1}']
    error = json.loads(got[2].removeprefix("data: "))["error"]
    assert "failed mid-stream" in error["message"]
    assert got[3:] == ["data: [DONE]"]


def test_total_timeout_mid_stream_ends_with_a_408_event():
    async def scenario(upstream, gateway, client, url):
        upstream.stall_after = 1
        async with client.post(url, json=BODY) as response:
            return response.status, await response.text()

    status, text = run(scenario, timeout_s=0.5)
    got = events(text)
    assert status == 200 and got[0] == 'data: {"i": 0}'
    error = json.loads(got[-2].removeprefix("data: "))["error"]
    assert error["code"] == "timeout" and "time limit" in error["message"]


def test_client_leaving_mid_stream_aborts_the_upstream_request():
    async def scenario(upstream, gateway, client, url):
        upstream.pieces, upstream.gap_s = 200, 0.02
        response = await client.post(url, json=BODY)
        await response.content.readline()
        response.close()  # the client goes away
        await asyncio.wait_for(upstream.aborted.wait(), 5)
        await asyncio.sleep(0.1)
        return gateway.replica_set.replicas()[0].num_inflight

    assert run(scenario) == 0


def test_slow_client_gets_every_byte():
    big = b"".join(f"data: {'x' * 1000} {i}\n\n".encode() for i in range(16000))  # 16 MB

    async def scenario(upstream, gateway, client, url):
        upstream.big = big
        async with client.post(url, json=BODY) as response:
            await asyncio.sleep(0.5)  # let the gateway's buffer to the client fill up
            received = await response.read()
        return received, [up.pauses for up in gateway._relay_pool.idle()]

    received, pauses = run(scenario)
    assert pauses and pauses[0] > 0  # reading from the upstream paused, then resumed
    assert received.startswith(big)
    assert events(received[len(big) :].decode())[-1] == "data: [DONE]"


def test_pool_reports_refused_and_stalled_upstreams():
    async def main():
        pool = RelayPool(connect_timeout_s=2)
        with pytest.raises(UpstreamConnectError, match="cannot connect"):
            await pool.request(
                "http://127.0.0.1:9", "/v1/completions", b"{}", {}, total_s=5, idle_s=None
            )

        async def silent(request):
            await asyncio.sleep(30)

        app = web.Application()
        app.router.add_post("/v1/completions", silent)
        runner, url = await serve(app, handler_cancellation=True)
        try:
            with pytest.raises(asyncio.TimeoutError):
                await pool.request(url, "/v1/completions", b"{}", {}, total_s=None, idle_s=0.3)
        finally:
            pool.close()
            await runner.cleanup()

    asyncio.run(main())


def test_http_1_0_client_gets_the_stream_unframed():
    async def scenario(upstream, gateway, client, url):
        host, port = url.split("/")[2].split(":")
        reader, writer = await asyncio.open_connection(host, int(port))
        body = json.dumps(BODY).encode()
        writer.write(
            b"POST /v1/completions HTTP/1.0\r\nContent-Type: application/json\r\n"
            b"Content-Length: %d\r\n\r\n%b" % (len(body), body)
        )
        answer = await asyncio.wait_for(reader.read(), 10)  # to the close: no framing
        writer.close()
        return answer

    head, _, text = run(scenario).decode().partition("\r\n\r\n")
    assert head.startswith("HTTP/1.0 200") and "transfer-encoding" not in head.lower()
    assert events(text) == [f'data: {{"i": {i}}}' for i in range(5)] + ["data: [DONE]"]
