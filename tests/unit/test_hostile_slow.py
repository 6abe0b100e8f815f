"""Slow and idle clients against the real gateway: none holds memory, tasks or the loop.

- a body trickled a byte at a time: a 408 in error JSON once ``body_timeout_s`` has
  passed, the connection ends, and every task the request made is gone;
- headers trickled a byte at a time (slowloris), on a new connection and on a kept-alive
  one after an answer: the connection is closed ``idle_timeout_s`` after it opened or
  after that answer, however steadily the bytes come, and nothing reaches the replica;
- a streaming client that stops reading: the relay stops reading its replica, so what
  the replica could write stays bounded (socket buffers and the relay's high-water
  marks), far below what it has to send;
- 1,000 idle keep-alive connections: held open, each still usable, while a new client
  is served; closing them leaves no task behind.
"""

from __future__ import annotations

import asyncio
import json
import time

import pytest

from tests.unit.hostile import (
    HEALTH,
    assert_openai_error,
    exchange,
    post,
    read_answer,
    serving,
    still_serving,
    until,
)


def test_a_body_trickled_a_byte_at_a_time_is_408_and_leaks_no_task():
    async def main():
        async with serving(body_timeout_s=0.5) as served:
            await still_serving(served)  # the pools and pollers exist before the baseline
            baseline = len(asyncio.all_tasks())
            reader, writer = await asyncio.open_connection(served.host, served.port)
            writer.write(post("/v1/completions", b"")[: -len(b"Content-Length: 0\r\n\r\n")])
            writer.write(b"Content-Length: 100\r\n\r\n")
            answer = asyncio.create_task(read_answer(reader))
            started = time.monotonic()
            while not answer.done():  # the client's pace: one byte per 0.1 s
                writer.write(b" ")
                await asyncio.wait([answer], timeout=0.1)
            elapsed = time.monotonic() - started
            writer.close()
            await until(lambda: len(asyncio.all_tasks()) <= baseline)
            await still_serving(served)
            return answer.result(), elapsed, served.upstream.requests[1:-1]

    answer, elapsed, reached = asyncio.run(main())
    assert assert_openai_error(answer, 408)["code"] == "body_timeout"
    assert answer.closed and 0.5 <= elapsed < 5 and reached == []


@pytest.mark.parametrize("after_an_answer", [False, True])
def test_headers_trickled_a_byte_at_a_time_are_cut_off_at_the_idle_timeout(after_an_answer):
    idle_s = 1.0

    async def main():
        async with serving(idle_timeout_s=idle_s) as served:
            await still_serving(served)
            baseline = len(asyncio.all_tasks())
            reader, writer = await asyncio.open_connection(served.host, served.port)
            if after_an_answer:
                writer.write(HEALTH)
                assert (await read_answer(reader)).status == 200
            head = b"POST /v1/completions HTTP/1.1\r\nHost: g\r\nX-Pad: " + b"a" * 10_000
            eof = asyncio.create_task(reader.read())  # b"" once the gateway closes
            started = time.monotonic()
            for byte in (head[i : i + 1] for i in range(len(head))):  # one a 0.05 s
                if eof.done() or time.monotonic() - started > idle_s + 5:
                    break
                writer.write(byte)
                await asyncio.wait([eof], timeout=0.05)
            elapsed = time.monotonic() - started
            writer.close()
            await until(lambda: len(asyncio.all_tasks()) <= baseline)
            await still_serving(served)
            return eof.done() and eof.result(), elapsed, served.upstream.requests[1:-1]

    closed_with, elapsed, reached = asyncio.run(main())
    assert closed_with == b""  # closed, no answer and no request made of it
    assert idle_s - 0.5 <= elapsed < idle_s + 5 and reached == []


def test_a_stream_nobody_reads_holds_a_bounded_number_of_bytes():
    total = 256 * 1024**2

    async def main():
        async with serving() as served:
            served.upstream.big = b"x" * total
            body = json.dumps({"model": "m", "prompt": "hi", "stream": True}).encode()
            _reader, writer = await asyncio.open_connection(served.host, served.port)
            writer.write(post("/v1/completions", body))  # and never read the answer
            relay = served.gateway.dispatcher.relay
            assert relay is not None
            await until(lambda: any(conn.paused for conn in relay.busy()))
            # for a second the replica can write no more than the buffers hold
            deadline = time.monotonic() + 1.0
            most = 0
            while time.monotonic() < deadline:
                most = max(most, served.upstream.written)
                await asyncio.sleep(0.05)
            writer.close()
            replica = served.gateway.replica_set.replicas()[0]
            await until(lambda: replica.num_inflight == 0 and not relay.busy())
            return most

    written = asyncio.run(main())
    assert written < 32 * 1024**2, written  # of 256 MB: the rest waits for the reader


def test_a_thousand_idle_keep_alive_connections_while_another_client_is_served():
    num = 1000

    async def main():
        async with serving() as served:
            await still_serving(served)
            baseline = len(asyncio.all_tasks())
            conns = [await asyncio.open_connection(served.host, served.port) for _ in range(num)]
            for _, writer in conns:
                writer.write(HEALTH)
            answers = [await read_answer(reader) for reader, _ in conns]
            started = time.monotonic()
            await still_serving(served)  # a new client, with 1,000 idle connections held
            latency_s = time.monotonic() - started
            for reader, writer in conns[::100]:  # and the idle ones still work
                writer.write(HEALTH)
                assert (await read_answer(reader)).status == 200
            num_open = len(served.gateway_connections())
            for _, writer in conns:
                writer.close()
            await until(lambda: len(asyncio.all_tasks()) <= baseline, timeout_s=30)
            return answers, latency_s, num_open

    answers, latency_s, num_open = asyncio.run(main())
    assert all(a.status == 200 and not a.closed for a in answers)
    assert num_open >= 1000 and latency_s < 2.0


def test_the_task_gauge_rises_with_streams_and_stays_flat_across_rounds():
    """``rayfleet_gateway_asyncio_tasks`` (what the soak benchmark samples) rises with
    streams held open, and a second round of the same streams leaves it where the first
    left it. (In this test one loop also runs the recording upstream, whose server keeps
    a task for each connection the gateway's pool keeps open.)"""

    async def tasks_gauge(served) -> float:
        answer = await exchange(served, b"GET /metrics HTTP/1.1\r\nHost: g\r\n\r\n")
        text = answer.body.decode()
        line = next(x for x in text.splitlines() if x.startswith("rayfleet_gateway_asyncio"))
        return float(line.split()[-1])

    async def settled(served, floor: float) -> float:
        deadline = time.monotonic() + 10
        while (now := await tasks_gauge(served)) > floor and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        return now

    async def round_of_streams(served) -> float:
        body = json.dumps({"model": "m", "prompt": "p", "stream": True}).encode()
        streams = [await asyncio.open_connection(served.host, served.port) for _ in range(10)]
        num_before = len(served.upstream.requests)
        for _, writer in streams:
            writer.write(post("/v1/completions", body))
        await until(lambda: len(served.upstream.requests) >= num_before + 10)
        during = await tasks_gauge(served)
        for reader, writer in streams:
            await reader.readuntil(b"[DONE]")
            writer.close()
        return during

    async def main():
        async with serving() as served:
            served.upstream.gap_s = 0.5  # each stream takes a while
            await still_serving(served)
            before = await tasks_gauge(served)
            during = await round_of_streams(served)
            after_one = await settled(served, before + 10)
            await round_of_streams(served)
            after_two = await settled(served, after_one)
            return before, during, after_one, after_two

    before, during, after_one, after_two = asyncio.run(main())
    assert during >= before + 20  # each stream: its client connection and its request
    assert after_one <= before + 10 and after_two == after_one
