"""The gateway process's limit on requests in flight (gateway.max_in_flight, overload.py).

The real gateway over a real aiohttp replica that holds its streams until told to end
them: the request over the limit gets OpenAI's 503 with Retry-After at once, the requests
in flight end as they would have, and the official ``openai`` client, retrying by itself,
is served once room is made.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import resource
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import openai
import pytest
from aiohttp import web

from rayfleet.config import parse_fleet
from rayfleet.errors import ConfigError
from rayfleet.gateway.overload import InFlightLimit, default_max_in_flight
from rayfleet.gateway.policies import Policies
from tests.unit.hostile import upstream_answering
from tests.unit.test_hostile_faults import gateway_over


class Holding:
    """A replica whose streams send one event, then wait for ``release``."""

    def __init__(self) -> None:
        self.release = asyncio.Event()

    async def answer(self, request: web.Request) -> web.StreamResponse:
        body = json.loads(await request.read())
        if not body.get("stream"):
            return web.json_response(completion())
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        await response.write(b'data: {"i": 0}\n\n')
        await self.release.wait()
        await response.write(b'data: {"i": 1}\n\ndata: [DONE]\n\n')
        await response.write_eof()
        return response


def completion() -> dict[str, Any]:
    return {
        "id": "cmpl-1",
        "object": "text_completion",
        "created": 0,
        "model": "m",
        "choices": [{"index": 0, "text": "ok", "finish_reason": "stop", "logprobs": None}],
    }


@contextlib.asynccontextmanager
async def holding_replica() -> AsyncIterator[tuple[Holding, str]]:
    replica = Holding()
    async with upstream_answering(replica.answer) as url:
        yield replica, url


def limited(max_in_flight: int) -> Policies:
    models = [{"name": "m", "source": "/models/none"}]
    gateway = {"max_in_flight": max_in_flight}
    return Policies.from_fleet(parse_fleet({"gateway": gateway, "models": models}))


async def open_stream(client: aiohttp.ClientSession) -> aiohttp.ClientResponse:
    """A stream through the gateway, its first event read: it is in flight."""
    body = {"model": "m", "prompt": "hold", "stream": True}
    response = await client.post("/v1/completions", json=body)
    assert response.status == 200
    assert (await response.content.readline()).startswith(b"data: ")
    return response


def overloaded_count(text: str) -> float:
    for line in text.splitlines():
        if line.startswith("rayfleet_request_errors_total{") and "gateway_overloaded" in line:
            return float(line.rsplit(" ", 1)[1])
    return 0.0


def test_the_request_over_the_limit_gets_a_503_and_those_in_flight_end_whole():
    async def main() -> dict[str, Any]:
        async with (
            holding_replica() as (replica, url),
            gateway_over({"m#0": url}, limited(2)) as (gateway, client),
        ):
            streams = [await open_stream(client) for _ in range(2)]
            body = {"model": "m", "prompt": "one more"}
            async with client.post("/v1/completions", json=body) as refused:
                over = (refused.status, dict(refused.headers), await refused.text())
            replica.release.set()
            rests = [await s.read() for s in streams]
            async with client.post("/v1/completions", json=body) as after:
                after_status = after.status
            async with client.get("/metrics") as metrics:
                refusals = overloaded_count(await metrics.text())
            return {
                "over": over,
                "rests": rests,
                "after": after_status,
                "refusals": refusals,
                "count": gateway.in_flight.count,
            }

    got = asyncio.run(main())
    status, headers, text = got["over"]
    assert status == 503 and headers["Retry-After"] == "1"
    assert headers["x-rayfleet-replica"] == "gateway"
    error = json.loads(text)["error"]
    assert error["code"] == "gateway_overloaded" and error["type"] == "service_unavailable"
    assert "limit of 2 requests in flight (gateway.max_in_flight)" in error["message"]
    assert all(rest.endswith(b"data: [DONE]\n\n") for rest in got["rests"]), got["rests"]
    assert got["after"] == 200
    assert got["refusals"] == 1
    assert got["count"] == 0  # every request left the count: no slot lost


def test_the_openai_client_retries_the_503_and_is_served_once_room_is_made():
    async def main() -> tuple[str, float]:
        async with (
            holding_replica() as (replica, url),
            gateway_over({"m#0": url}, limited(1)) as (_, client),
        ):
            held = await open_stream(client)
            sdk = openai.AsyncOpenAI(
                base_url=f"{str(client._base_url).rstrip('/')}/v1", api_key="none", max_retries=3
            )
            answer = asyncio.create_task(sdk.completions.create(model="m", prompt="x"))
            async with asyncio.timeout(60):  # until the gateway refused it once
                while True:
                    async with client.get("/metrics") as metrics:
                        refusals = overloaded_count(await metrics.text())
                    if refusals >= 1:
                        break
                    await asyncio.sleep(0.02)
            replica.release.set()
            await held.read()
            result = await answer
            await sdk.close()
            return result.choices[0].text, refusals

    text, refusals = asyncio.run(main())
    assert text == "ok"
    assert refusals >= 1


def test_the_default_limit_is_what_the_open_files_allow():
    limit = InFlightLimit(None)
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    assert soft == hard or hard == resource.RLIM_INFINITY  # raised to the hard limit
    assert limit.limit == default_max_in_flight(soft) == max(64, (soft - 512) // 2)
    assert limit.configured is None
    assert InFlightLimit(300).limit == 300 and InFlightLimit(300).configured == 300


def test_a_limit_below_one_is_refused_naming_the_field():
    models = [{"name": "m", "source": "/models/none"}]
    with pytest.raises(ConfigError, match=r"gateway.max_in_flight: Input should be greater"):
        parse_fleet({"gateway": {"max_in_flight": 0}, "models": models})


def test_apply_changes_the_limit_of_a_running_gateway():
    async def main() -> list[tuple[int, int | None]]:
        async with (
            holding_replica() as (_, url),
            gateway_over({"m#0": url}, limited(2)) as (gateway, _),
        ):
            seen = [(gateway.in_flight.limit, gateway.in_flight.configured)]
            await gateway.reconfigure(["m"], limited(5), {})
            seen.append((gateway.in_flight.limit, gateway.in_flight.configured))
            await gateway.reconfigure(["m"], Policies.plain(["m"]), {})
            seen.append((gateway.in_flight.limit, gateway.in_flight.configured))
            return seen

    seen = asyncio.run(main())
    assert seen[:2] == [(2, 2), (5, 5)]
    assert seen[2][0] > 5 and seen[2][1] is None  # unset again: what the open files allow
