"""The gateway's streaming relay against a scripted HTTP upstream, through the real gateway.

The upstream is a real aiohttp server whose handlers do what a vLLM server cannot be made
to do on demand: stall, break off mid-stream, drop idle connections. Requests go through
``Gateway`` (its relay path), served as ``start_gateway`` serves it, and are read with
aiohttp's client or a raw socket. Tests wait on conditions (``until``), never on sleeps.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time

import aiohttp
import pytest
from aiohttp import web

from rayfleet.gateway.app import Gateway
from rayfleet.gateway.relay_pool import RelayPool
from rayfleet.gateway.server import start_gateway
from rayfleet.gateway.upstream import TimeLimits, UpstreamConnectError

BODY = {"model": "m", "prompt": "hi", "stream": True}


class Upstream:
    """A scripted OpenAI-like server; counts connections and remembers aborted requests."""

    def __init__(self):
        self.connections: set[tuple] = set()  # the gateway's ends, as (host, port)
        self.entered = asyncio.Event()  # a request's handler started
        self.aborted = asyncio.Event()
        self.pieces = 5
        self.gap_s = 0.0
        self.stall_after: int | None = None
        self.stall_before_head = False
        self.break_after: int | None = None
        self.big: bytes = b""
        self.partial_body = False  # a non-streamed body: half of it, then a stall
        self.cut_bodies = 0  # the next n non-streamed bodies: half of it, then a close
        self.end_gap_s = 0.0  # between [DONE] and the end of the response

    async def completions(self, request: web.Request) -> web.StreamResponse:
        self.connections.add(request.transport.get_extra_info("peername"))
        body = await request.json()
        self.entered.set()
        try:
            if self.stall_before_head:
                await asyncio.sleep(30)
            if not body.get("stream"):
                if self.partial_body or self.cut_bodies:
                    return await self._partial_body(request)
                return web.json_response({"object": "text_completion", "echo": body["prompt"]})
            return await self._stream(request)
        except (ConnectionResetError, asyncio.CancelledError):
            self.aborted.set()
            raise

    async def _stream(self, request: web.Request) -> web.StreamResponse:
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
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
        await asyncio.sleep(self.end_gap_s)
        await response.write_eof()
        return response

    async def _partial_body(self, request: web.Request) -> web.StreamResponse:
        response = web.StreamResponse(headers={"Content-Type": "application/json"})
        response.content_length = 100
        await response.prepare(request)
        await response.write(b"{" + b" " * 49)
        if self.cut_bodies:
            self.cut_bodies -= 1
            request.transport.close()
            return response
        await asyncio.sleep(30)
        return response


async def until(predicate, timeout_s: float = 10.0) -> None:
    """Wait until ``predicate()`` holds; fail after ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while not predicate():
        assert time.monotonic() < deadline, "condition not reached"
        await asyncio.sleep(0.005)


async def serve(app: web.Application, **kwargs) -> tuple[web.AppRunner, str]:
    runner = web.AppRunner(app, access_log=None, **kwargs)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0).start()
    host, port = runner.addresses[0][:2]
    return runner, f"http://{host}:{port}"


def run(
    scenario,
    *,
    keepalive_s: float = 75.0,
    timeout_s: float = 600.0,
    relay: bool = True,
    replicas: int = 1,
):
    """Start the upstream and a gateway in front of it (as ``replicas`` replicas, r0 ...),
    then run ``scenario``."""

    async def main():
        upstream = Upstream()
        up_app = web.Application()
        up_app.router.add_post("/v1/completions", upstream.completions)
        up_runner, up_url = await serve(
            up_app, keepalive_timeout=keepalive_s, handler_cancellation=True
        )

        async def source():
            return [{"replica_id": f"r{i}", "model": "m", "url": up_url} for i in range(replicas)]

        gateway = Gateway(["m"], source, request_timeout_s=timeout_s, relay=relay)
        gw_runner = await start_gateway(gateway, "127.0.0.1", 0)
        host, port = gw_runner.addresses[0][:2]
        try:
            async with aiohttp.ClientSession() as client:
                url = f"http://{host}:{port}/v1/completions"
                return await scenario(upstream, gateway, client, url)
        finally:
            await gw_runner.cleanup()
            await up_runner.cleanup()

    return asyncio.run(main())


def events(text: str) -> list[str]:
    return [line for line in text.split("\n\n") if line]


def relay_of(gateway: Gateway) -> RelayPool:
    assert gateway.dispatcher.relay is not None
    return gateway.dispatcher.relay


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
        kept = relay_of(gateway).idle()
        assert kept
        await until(lambda: not any(conn.connected for conn in kept))  # closed after 0.2 s
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


WHOLE = {**BODY, "stream": False}


def test_a_whole_body_cut_off_before_its_end_is_retried_on_another_replica():
    async def scenario(upstream, gateway, client, url):
        upstream.cut_bodies = 1
        async with client.post(url, json=WHOLE) as response:
            answer = response.status, response.headers["x-rayfleet-replica"], await response.json()
        failures = {
            r.replica_id: r.num_consecutive_failures for r in gateway.replica_set.replicas()
        }
        return answer, failures

    (status, replica, body), failures = run(scenario, replicas=2)
    assert status == 200 and body == {"object": "text_completion", "echo": "hi"}
    assert failures[replica] == 0 and sorted(failures.values()) == [0, 1]


def test_a_whole_body_cut_off_on_the_only_replica_is_a_502_in_error_json():
    async def scenario(upstream, gateway, client, url):
        upstream.cut_bodies = 1
        async with client.post(url, json=WHOLE) as response:
            return response.status, await response.json(), gateway.replica_set.replicas()[0]

    status, body, replica = run(scenario)
    assert status == 502 and body["error"]["code"] == "upstream_failed"
    assert "tried r0" in body["error"]["message"]
    assert replica.num_consecutive_failures == 1


async def left(upstream, gateway) -> tuple[bool, int, int]:
    """After the client left: whether the upstream saw the abort, the replica's count in
    flight and the relay's connections still carrying a request, once both reach 0."""
    await asyncio.wait_for(upstream.aborted.wait(), 10)
    replica = gateway.replica_set.replicas()[0]
    await until(lambda: replica.num_inflight == 0 and not relay_of(gateway).busy())
    return upstream.aborted.is_set(), replica.num_inflight, len(relay_of(gateway).busy())


async def raw_request(url: str, body: dict) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    """Send a request on a socket of our own, to leave at any moment, response or not."""
    host, port = url.split("/")[2].split(":")
    reader, writer = await asyncio.open_connection(host, int(port))
    payload = json.dumps(body).encode()
    writer.write(
        b"POST /v1/completions HTTP/1.1\r\nHost: gateway\r\nContent-Type: application/json\r\n"
        b"Content-Length: %d\r\n\r\n%b" % (len(payload), payload)
    )
    return reader, writer


def test_client_leaving_mid_stream_aborts_the_upstream_request():
    async def scenario(upstream, gateway, client, url):
        upstream.pieces, upstream.gap_s = 200, 0.02
        response = await client.post(url, json=BODY)
        await response.content.readline()
        response.close()  # the client goes away
        return await left(upstream, gateway)

    assert run(scenario) == (True, 0, 0)


def test_client_leaving_before_the_response_head_aborts_the_upstream_request():
    async def scenario(upstream, gateway, client, url):
        upstream.stall_before_head = True
        _, writer = await raw_request(url, BODY)
        await upstream.entered.wait()
        writer.close()
        return await left(upstream, gateway)

    assert run(scenario) == (True, 0, 0)


def test_client_leaving_before_the_first_piece_aborts_the_upstream_request():
    async def scenario(upstream, gateway, client, url):
        upstream.stall_after = 0  # the head, then nothing
        _, writer = await raw_request(url, BODY)
        relay = relay_of(gateway)
        await until(lambda: any(conn.status == 200 for conn in relay.busy()))
        writer.close()
        return await left(upstream, gateway)

    assert run(scenario) == (True, 0, 0)


def test_client_leaving_during_a_body_that_is_not_streamed_aborts_the_upstream_request():
    async def scenario(upstream, gateway, client, url):
        upstream.partial_body = True
        _, writer = await raw_request(url, {**BODY, "stream": False})
        relay = relay_of(gateway)
        await until(lambda: any(conn.first_byte_at for conn in relay.busy()))
        writer.close()
        return await left(upstream, gateway)

    assert run(scenario) == (True, 0, 0)


def test_client_leaving_while_reading_is_paused_aborts_the_upstream_request():
    async def scenario(upstream, gateway, client, url):
        upstream.big = b"x" * (16 * 1024 * 1024)  # more than every buffer on the way holds
        upstream.pieces, upstream.gap_s = 200, 0.02
        _, writer = await raw_request(url, BODY)
        relay = relay_of(gateway)
        await until(lambda: any(conn.paused for conn in relay.busy()))
        writer.close()  # without reading a byte
        return await left(upstream, gateway)

    assert run(scenario) == (True, 0, 0)


def test_a_client_that_leaves_after_done_is_counted_as_answered_not_as_gone(caplog):
    # As the openai client does: it stops reading at [DONE], before the response's end.
    async def scenario(upstream, gateway, client, url):
        upstream.end_gap_s = 0.5
        reader, writer = await raw_request(url, BODY)
        await reader.readuntil(b"data: [DONE]")
        writer.close()
        replica = gateway.replica_set.replicas()[0]
        await until(lambda: replica.num_inflight == 0)
        metrics = gateway.metrics
        return (
            metrics.errors.labels("m", "client_disconnect")._value.get(),
            metrics.requests.labels("m", "r0", "200").value,
        )

    with caplog.at_level(logging.DEBUG, logger="aiohttp"):
        assert run(scenario) == (0, 1)
    assert [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR] == []


def test_a_client_that_leaves_before_done_is_counted_as_gone():
    async def scenario(upstream, gateway, client, url):
        upstream.pieces, upstream.gap_s = 200, 0.02
        reader, writer = await raw_request(url, BODY)
        await reader.readuntil(b'data: {"i": 1}')
        writer.close()
        await left(upstream, gateway)
        metrics = gateway.metrics
        return (
            metrics.errors.labels("m", "client_disconnect")._value.get(),
            metrics.requests.labels("m", "r0", "200").value,
        )

    assert run(scenario) == (1, 0)


def test_slow_client_gets_every_byte():
    big = b"".join(f"data: {'x' * 1000} {i}\n\n".encode() for i in range(16000))  # 16 MB

    async def scenario(upstream, gateway, client, url):
        upstream.big = big
        relay = relay_of(gateway)
        async with client.post(url, json=BODY) as response:
            await until(lambda: any(conn.paused for conn in relay.busy()))
            received = await response.read()
        return received, [conn.pauses for conn in relay.idle()]

    received, pauses = run(scenario)
    assert pauses and pauses[0] > 0  # reading from the upstream paused, then resumed
    assert received.startswith(big)
    assert events(received[len(big) :].decode())[-1] == "data: [DONE]"


def test_aiohttp_path_relays_and_aborts_the_same_way():
    """``Gateway(relay=False)``: replicas through aiohttp's client, as fallback providers."""

    async def scenario(upstream, gateway, client, url):
        assert gateway.dispatcher.relay is None
        async with client.post(url, json=BODY) as response:
            whole = response.headers["x-rayfleet-replica"], await response.text()
        async with client.post(url, json={**BODY, "stream": False}) as response:
            plain = await response.json()
        upstream.pieces, upstream.gap_s = 200, 0.01
        response = await client.post(url, json=BODY)
        await response.content.readline()
        response.close()  # the client goes away
        await asyncio.wait_for(upstream.aborted.wait(), 10)
        replica = gateway.replica_set.replicas()[0]
        await until(lambda: replica.num_inflight == 0)
        upstream.break_after = 3  # last: it puts the replica in its cool-down
        async with client.post(url, json=BODY) as response:
            broken = events(await response.text())
        return whole, plain, broken

    (label, text), plain, broken = run(scenario, relay=False)
    assert label == "r0"
    assert events(text) == [f'data: {{"i": {i}}}' for i in range(5)] + ["data: [DONE]"]
    assert plain == {"object": "text_completion", "echo": "hi"}
    assert "failed mid-stream" in broken[-2] and broken[-1] == "data: [DONE]"


def test_pool_reports_refused_and_stalled_upstreams():
    async def main():
        pool = RelayPool()
        with pytest.raises(UpstreamConnectError, match="cannot connect"):
            await pool.open(
                "http://127.0.0.1:9/v1/completions", b"{}", {}, TimeLimits(5, connect_s=2)
            )

        async def silent(request):
            await asyncio.sleep(30)

        app = web.Application()
        app.router.add_post("/v1/completions", silent)
        runner, url = await serve(app, handler_cancellation=True)
        try:
            with pytest.raises(asyncio.TimeoutError):
                await pool.open(url + "/v1/completions", b"{}", {}, TimeLimits(30, idle_s=0.3))
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
