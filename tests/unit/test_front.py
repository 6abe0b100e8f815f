"""The gateway's own front (front.py): which requests it answers, which it hands to
aiohttp's server with the bytes it holds, bodies that come late or never, pipelining,
and a gateway that stops while a stream is under way. Raw sockets against the real
gateway and a recording upstream (hostile.py); the hostile-client suites run through the
front as well, since it is the default."""

from __future__ import annotations

import asyncio
import json

from rayfleet.config import parse_fleet
from rayfleet.gateway.auth import hash_key
from rayfleet.gateway.front import Front, FrontSite
from rayfleet.gateway.policies import Policies
from tests.unit.hostile import (
    HEALTH,
    Served,
    assert_openai_error,
    post,
    read_answer,
    serving,
    until,
)

COMPLETION = json.dumps({"model": "m", "prompt": "hello"}).encode()


def front_of(served: Served) -> Front:
    return next(site.front for site in served.runner.sites if isinstance(site, FrontSite))


def num_aiohttp_connections(served: Served) -> int:
    assert served.runner.server is not None
    return len(served.runner.server.connections)


async def connect(served: Served) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    return await asyncio.open_connection(served.host, served.port)


def test_api_requests_are_the_fronts_and_the_connection_goes_to_aiohttp_at_the_first_other():
    async def main():
        async with serving() as served:
            front = front_of(served)
            reader, writer = await connect(served)
            writer.write(post("/v1/completions", COMPLETION))
            first = await read_answer(reader)
            on_front = (len(front.connections), num_aiohttp_connections(served))
            writer.write(HEALTH)
            health = await read_answer(reader)
            writer.write(post("/v1/completions", COMPLETION))
            after = await read_answer(reader)
            on_aiohttp = (len(front.connections), num_aiohttp_connections(served))
            writer.close()
            return first, on_front, health, after, on_aiohttp, served.upstream.requests

    first, on_front, health, after, on_aiohttp, requests = asyncio.run(main())
    assert first.status == 200 and first.json()["object"] == "answer"
    assert first.headers["x-rayfleet-replica"] == "m#0" and first.headers["x-request-id"]
    assert on_front == (1, 0)
    assert health.status == 200
    assert after.status == 200 and after.json()["object"] == "answer"
    assert on_aiohttp == (0, 1)
    assert [path for path, _, _ in requests] == ["/v1/completions", "/v1/completions"]


def test_pipelined_requests_are_answered_in_order_the_last_by_aiohttp():
    async def main():
        async with serving() as served:
            reader, writer = await connect(served)
            first = json.dumps({"model": "m", "prompt": "one"}).encode()
            second = json.dumps({"model": "m", "prompt": "two"}).encode()
            writer.write(post("/v1/completions", first) + post("/v1/completions", second) + HEALTH)
            answers = [await read_answer(reader) for _ in range(3)]
            writer.close()
            return answers, [json.loads(body)["prompt"] for _, _, body in served.upstream.requests]

    answers, prompts = asyncio.run(main())
    assert [a.status for a in answers] == [200, 200, 200]
    assert prompts == ["one", "two"]


def test_a_body_after_its_head_is_awaited_and_one_that_stops_is_a_408_that_closes():
    async def main():
        async with serving(body_timeout_s=0.5) as served:
            gateway = served.gateway
            reader, writer = await connect(served)
            message = post("/v1/completions", COMPLETION)
            head_end = message.index(b"\r\n\r\n") + 4
            writer.write(message[: head_end + 5])
            await until(lambda: gateway.in_flight.count == 1)  # admitted, waiting for the rest
            writer.write(message[head_end + 5 :])
            whole = await read_answer(reader)
            writer.write(message[: head_end + 5])  # never finished
            late = await read_answer(reader)
            end = await reader.read()
            writer.close()
            return whole, late, end

    whole, late, end = asyncio.run(main())
    assert whole.status == 200 and whole.json()["object"] == "answer"
    error = assert_openai_error(late, 408)
    assert error["code"] == "body_timeout" and late.closed and end == b""


def test_a_refusal_before_the_body_skips_the_rest_of_it_and_serves_the_next_request():
    key = "sk-front-0123456789"
    fleet = parse_fleet(
        {
            "gateway": {"api_keys": [{"name": "k", "key_sha256": hash_key(key)}]},
            "models": [{"name": "m", "source": "/models/none"}],
        }
    )

    async def main():
        async with serving(policies=Policies.from_fleet(fleet)) as served:
            reader, writer = await connect(served)
            message = post("/v1/completions", COMPLETION)
            head_end = message.index(b"\r\n\r\n") + 4
            writer.write(message[:head_end])  # no key, and the body not sent yet
            refused = await read_answer(reader)
            writer.write(message[head_end:])
            keyed = post(
                "/v1/completions", COMPLETION, b"Authorization: Bearer %b\r\n" % key.encode()
            )
            writer.write(keyed)
            served_after = await read_answer(reader)
            writer.close()
            return refused, served_after

    refused, served_after = asyncio.run(main())
    assert_openai_error(refused, 401)
    assert not refused.closed
    assert served_after.status == 200 and served_after.json()["object"] == "answer"


def test_http10_chunked_and_expect_posts_are_aiohttps():
    def chunked(body: bytes) -> bytes:
        return (
            b"POST /v1/completions HTTP/1.1\r\nHost: g\r\nContent-Type: application/json\r\n"
            b"Transfer-Encoding: chunked\r\n\r\n%x\r\n%b\r\n0\r\n\r\n" % (len(body), body)
        )

    http10 = post("/v1/completions", COMPLETION).replace(b"HTTP/1.1", b"HTTP/1.0", 1)
    expect = post("/v1/completions", COMPLETION, b"Expect: 100-continue\r\n")

    async def main():
        async with serving() as served:
            reader, writer = await connect(served)
            writer.write(http10)
            answer10 = await reader.read()  # aiohttp answers HTTP/1.0 and closes
            writer.close()
            answers = []
            for message in (chunked(COMPLETION), expect):
                reader, writer = await connect(served)
                writer.write(message)
                if b"Expect" in message:
                    assert (await reader.readuntil(b"\r\n\r\n")).startswith(b"HTTP/1.1 100")
                answers.append((await read_answer(reader), num_aiohttp_connections(served)))
                writer.close()
            return answer10, answers

    answer10, answers = asyncio.run(main())
    assert answer10.startswith(b"HTTP/1.0 200") and b'"object": "answer"' in answer10
    for answer, num_on_aiohttp in answers:
        assert answer.status == 200 and answer.json()["object"] == "answer"
        assert num_on_aiohttp == 1


def test_a_stopping_gateway_finishes_the_stream_under_way_and_closes_idle_connections():
    streamed = json.dumps({"model": "m", "prompt": "slow", "stream": True}).encode()

    async def main():
        async with serving() as served:
            served.upstream.pieces, served.upstream.gap_s = 20, 0.02
            _, idle = await connect(served)
            reader, writer = await connect(served)
            writer.write(post("/v1/completions", streamed))
            await reader.readuntil(b"data: ")  # the stream is under way
            front = front_of(served)
            await until(lambda: len(front.connections) == 2)
            stopping = asyncio.create_task(served.runner.cleanup())
            rest = await asyncio.wait_for(reader.read(), 30)  # to the end of the connection
            await stopping
            idle.close()
            return rest

    rest = asyncio.run(main())
    assert b"data: [DONE]" in rest and rest.endswith(b"0\r\n\r\n")


def test_http_front_off_serves_everything_with_aiohttp():
    async def main():
        async with serving(http_front=False) as served:
            reader, writer = await connect(served)
            writer.write(post("/v1/completions", COMPLETION))
            answer = await read_answer(reader)
            sites = list(served.runner.sites)
            on_aiohttp = num_aiohttp_connections(served)
            writer.close()
            return answer, sites, on_aiohttp

    answer, sites, on_aiohttp = asyncio.run(main())
    assert answer.status == 200 and on_aiohttp == 1
    assert not any(isinstance(site, FrontSite) for site in sites)


def test_connections_without_a_whole_request_close_after_the_idle_timeout():
    async def main():
        async with serving(idle_timeout_s=0.3) as served:
            front = front_of(served)
            answered_reader, answered = await connect(served)
            answered.write(post("/v1/completions", COMPLETION))
            first = await read_answer(answered_reader)
            partial_reader, partial = await connect(served)
            partial.write(b"POST /v1/completions HTTP/1.1\r\nHost: g\r\n")  # never finished
            ends = await asyncio.wait_for(
                asyncio.gather(answered_reader.read(), partial_reader.read()), 10
            )
            await until(lambda: not front.connections)
            answered.close()
            partial.close()
            return first, ends

    first, ends = asyncio.run(main())
    assert first.status == 200 and ends == [b"", b""]


def test_a_thousand_pipelined_refusals_in_one_write_are_all_answered():
    fleet = parse_fleet(
        {
            "gateway": {"api_keys": [{"name": "k", "key_sha256": hash_key("sk-0123456789ab")}]},
            "models": [{"name": "m", "source": "/models/none"}],
        }
    )

    async def main():
        async with serving(policies=Policies.from_fleet(fleet)) as served:
            reader, writer = await connect(served)
            writer.write(post("/v1/completions", COMPLETION) * 1000)
            answers = [await read_answer(reader) for _ in range(1000)]
            writer.close()
            return answers

    for answer in asyncio.run(main()):
        assert_openai_error(answer, 401)
        assert not answer.closed
