"""Replicas and providers that fail, behind the real gateway: no accepted request that
could have been served is lost, and what cannot be served gets a clear answer.

- a replica that accepts requests and never answers: the request times out (408), and
  the next requests go to another replica (it cools down);
- a replica that answers 500s: every request is retried on the other replica, and the
  failing one cools down;
- the fallback provider down as well: 503 in OpenAI's error JSON naming the model and
  the provider, streamed or not;
- the provider taking the overflow over ``max_queue_depth`` is down: the busy replica
  serves the request.

The replicas are real aiohttp servers scripted to fail (vLLM cannot be made to hang or
to answer 500 on demand); the good replica is ``tests.unit.hostile.Recorder``.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
from aiohttp import web

from rayfleet.config import parse_fleet
from rayfleet.control.engine import free_port
from rayfleet.gateway.app import Gateway
from rayfleet.gateway.policies import Policies
from rayfleet.gateway.server import start_gateway
from tests.unit.hostile import recording_upstream, upstream_answering

COOLDOWN_S = 60.0  # longer than any test: a replica out of rotation stays out


class Scripted:
    """A replica that fails one way, counting the requests it got."""

    def __init__(self, how: str):
        self.how = how
        self.requests = 0

    async def answer(self, request: web.Request) -> web.StreamResponse:
        await request.read()
        self.requests += 1
        if self.how == "silent":
            await asyncio.sleep(3600)  # accepted, never answered
        body = {"error": {"message": "boom", "type": "internal", "param": None, "code": None}}
        return web.json_response(body, status=500)


@contextlib.asynccontextmanager
async def scripted(how: str) -> AsyncIterator[tuple[Scripted, str]]:
    replica = Scripted(how)
    async with upstream_answering(replica.answer) as url:
        yield replica, url


def policies(fallback: dict[str, Any] | None = None) -> Policies:
    gateway: dict[str, Any] = {"replica_protection": {"cooldown_s": COOLDOWN_S}}
    if fallback is not None:
        gateway["fallback"] = fallback
    models = [{"name": "m", "source": "/models/none"}]
    return Policies.from_fleet(parse_fleet({"gateway": gateway, "models": models}))


def provider_down(**fields: Any) -> dict[str, Any]:
    """A fallback with one provider where nothing listens."""
    url = f"http://127.0.0.1:{free_port()}/v1"
    return {"providers": [{"name": "backup", "base_url": url, "default_model": "x"}], **fields}


@contextlib.asynccontextmanager
async def gateway_over(
    replicas: dict[str, str], policies: Policies, **kwargs: Any
) -> AsyncIterator[tuple[Gateway, aiohttp.ClientSession]]:
    """The real gateway over ``replicas`` ({replica id: url}) of model ``m``, and a client."""

    async def source() -> list[dict[str, str]]:
        return [{"replica_id": rid, "model": "m", "url": url} for rid, url in replicas.items()]

    gateway = Gateway(["m"], source, policies=policies, replica_metrics_period_s=None, **kwargs)
    runner = await start_gateway(gateway, "127.0.0.1", 0)
    host, port = runner.addresses[0][:2]
    try:
        async with aiohttp.ClientSession(f"http://{host}:{port}") as client:
            await ready(gateway, len(replicas))
            yield gateway, client
    finally:
        await runner.cleanup()


async def ready(gateway: Gateway, count: int) -> None:
    async with asyncio.timeout(10):
        while len(gateway.replica_set.candidates("m")) < count:
            await asyncio.sleep(0.01)


async def ask(client: aiohttp.ClientSession, stream: bool = False) -> tuple[int, str, str]:
    """(status, x-rayfleet-replica, body) of one completion."""
    body = {"model": "m", "prompt": "hi", "stream": stream}
    async with client.post("/v1/completions", json=body) as response:
        label = response.headers.get("x-rayfleet-replica", "")
        return response.status, label, await response.text()


def openai_error(text: str) -> dict[str, Any]:
    error: dict[str, Any] = json.loads(text)["error"]
    assert set(error) == {"message", "type", "param", "code"}
    return error


def test_a_replica_that_never_answers_times_out_and_the_next_requests_avoid_it():
    async def main() -> tuple[list[tuple[int, str]], list[tuple[int, str]], int]:
        async with scripted("silent") as (silent, silent_url), recording_upstream() as (_, url):
            replicas = {"m#silent": silent_url, "m#good": url}
            async with gateway_over(replicas, policies(), request_timeout_s=1.0) as (_, client):
                # Ties go round the replicas: one of the first two reaches the silent one.
                first = [(await ask(client))[:2] for _ in range(2)]
                after = [(await ask(client))[:2] for _ in range(6)]
                return first, after, silent.requests

    first, after, silent_got = asyncio.run(main())
    assert sorted(first) == [(200, "m#good"), (408, "gateway")]
    assert after == [(200, "m#good")] * 6
    assert silent_got == 1


def test_a_replica_answering_500s_cools_down_and_every_request_is_served():
    async def main() -> tuple[list[tuple[int, str]], int, dict[str, Any]]:
        async with scripted("fails") as (fails, fails_url), recording_upstream() as (_, url):
            replicas = {"m#fails": fails_url, "m#good": url}
            async with gateway_over(replicas, policies()) as (_, client):
                answers = [(await ask(client, stream=i % 2 == 1))[:2] for i in range(6)]
                async with client.get("/rayfleet/status") as response:
                    status = await response.json()
                return answers, fails.requests, status

    answers, fails_got, status = asyncio.run(main())
    assert answers == [(200, "m#good")] * 6
    assert fails_got == 1
    failing = next(r for r in status["replicas"] if r["replica_id"] == "m#fails")
    assert not failing["healthy"] and failing["cooldown_remaining_s"] > 0


def test_the_provider_down_as_well_is_a_503_naming_model_and_provider():
    async def main() -> list[tuple[int, str, str]]:
        async with scripted("fails") as (_, fails_url):
            replicas = {"m#fails": fails_url}
            async with gateway_over(replicas, policies(provider_down())) as (_, client):
                # Both before and during the replica's cool-down, streamed or not.
                return [await ask(client, stream=s) for s in (False, True, False)]

    for status, label, text in asyncio.run(main()):
        assert (status, label) == (503, "gateway")
        message = openai_error(text)["message"]
        assert "model 'm'" in message and "provider 'backup'" in message, message


def test_no_replica_and_the_provider_down_is_a_503_naming_both():
    async def main() -> tuple[int, str, str]:
        async with gateway_over({}, policies(provider_down())) as (_, client):
            return await ask(client)

    status, label, text = asyncio.run(main())
    assert (status, label) == (503, "gateway")
    message = openai_error(text)["message"]
    assert "No replica of model 'm' is available" in message and "'backup'" in message


def test_overflow_to_a_provider_that_is_down_is_served_by_the_busy_replica():
    async def main() -> tuple[int, str, str, int]:
        async with recording_upstream() as (recorder, url):
            recorder.pieces, recorder.gap_s = 50, 0.05  # a stream that keeps it busy
            fallback = provider_down(max_queue_depth=1)
            async with gateway_over({"m#0": url}, policies(fallback)) as (gateway, client):
                body = {"model": "m", "prompt": "long", "stream": True}
                async with client.post("/v1/completions", json=body) as busy:
                    await busy.content.readline()
                    [replica] = gateway.replica_set.replicas()
                    in_flight = replica.num_inflight
                    recorder.pieces = 3
                    status, label, text = await ask(client)
                return status, label, text, in_flight

    status, label, text, in_flight = asyncio.run(main())
    assert in_flight == 1  # the second request was over the queue depth
    assert (status, label) == (200, "m#0"), text
