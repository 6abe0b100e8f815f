"""Relayed answers through the gateway's front, byte for byte on a raw socket: a stream's
head matches what aiohttp's server sends for the same request, its chunk framing and end,
a connection the client asked to close, a whole body with its length, and a 204."""

from __future__ import annotations

import asyncio
import json
from email.utils import parsedate_to_datetime

from aiohttp import web

from tests.unit.hostile import HEALTH, exchange, post, read_answer, serving

STREAM = json.dumps({"model": "m", "prompt": "hello", "stream": True}).encode()


async def raw_stream(reader: asyncio.StreamReader) -> tuple[list[str], bytes, bytes]:
    """A chunked answer: its head's lines, its body's bytes as sent (chunk framing
    included), and the body with the framing taken off."""
    async with asyncio.timeout(10):
        head = (await reader.readuntil(b"\r\n\r\n")).decode("latin-1")
        framed = await reader.readuntil(b"\r\n0\r\n\r\n")
    body, rest = b"", framed
    while rest:
        size, _, rest = rest.partition(b"\r\n")
        length = int(size, 16)
        body += rest[:length]
        assert rest[length : length + 2] == b"\r\n"
        rest = rest[length + 2 :]
    return head.split("\r\n")[:-2], framed, body


def header(lines: list[str], name: str) -> list[str]:
    return [line.partition(":")[2].strip() for line in lines if line.lower().startswith(name)]


def test_a_stream_goes_out_chunked_with_the_head_aiohttp_sends():
    async def main():
        async with serving() as served:
            reader, writer = await asyncio.open_connection(served.host, served.port)
            writer.write(post("/v1/completions", STREAM))
            front = await raw_stream(reader)
            writer.write(HEALTH)  # the connection goes to aiohttp's server
            await read_answer(reader)
            writer.write(post("/v1/completions", STREAM))
            aiohttp = await raw_stream(reader)
            writer.close()
            return front, aiohttp

    (lines, framed, body), (aiohttp_lines, _, aiohttp_body) = asyncio.run(main())
    assert lines[0] == aiohttp_lines[0] == "HTTP/1.1 200 OK"
    assert header(lines, "transfer-encoding") == ["chunked"]
    assert header(lines, "content-type") == ["text/event-stream"]
    assert header(lines, "x-rayfleet-replica") == ["m#0"]
    assert len(header(lines, "x-request-id")[0]) == 32
    assert parsedate_to_datetime(header(lines, "date")[0]).tzinfo is not None
    assert not header(lines, "connection") and not header(lines, "content-length")
    same = {"transfer-encoding", "content-type", "x-rayfleet-replica", "server"}
    assert {name: header(lines, name) for name in same} == {
        name: header(aiohttp_lines, name) for name in same
    }
    assert sorted(names(lines)) == sorted(names(aiohttp_lines))
    events = [e for e in body.decode().split("\n\n") if e]
    assert events[-1] == "data: [DONE]" and len(events) > 2
    assert framed.endswith(b"\r\n0\r\n\r\n") and aiohttp_body == body


def names(lines: list[str]) -> list[str]:
    return [line.partition(":")[0].lower() for line in lines[1:]]


def test_a_client_that_asks_to_close_gets_connection_close_and_the_end_of_file():
    async def main():
        async with serving() as served:
            reader, writer = await asyncio.open_connection(served.host, served.port)
            writer.write(post("/v1/completions", STREAM, b"Connection: close\r\n"))
            lines, _, body = await raw_stream(reader)
            end = await asyncio.wait_for(reader.read(), 10)
            writer.close()
            return lines, body, end

    lines, body, end = asyncio.run(main())
    assert header(lines, "connection") == ["close"]
    assert body.endswith(b"data: [DONE]\n\n") and end == b""


def test_a_whole_body_goes_out_with_its_length_and_no_chunks():
    async def main():
        async with serving() as served:
            body = json.dumps({"model": "m", "prompt": "hello"}).encode()
            return await exchange(served, post("/v1/completions", body))

    answer = asyncio.run(main())
    assert answer.status == 200 and answer.json()["object"] == "answer"
    assert answer.headers["content-length"] == str(len(answer.body))
    assert "transfer-encoding" not in answer.headers
    assert answer.headers["content-type"] == "application/json; charset=utf-8"


def test_a_204_from_the_replica_is_relayed_without_a_body():
    async def no_content(request: web.Request) -> web.StreamResponse:
        return web.Response(status=204)

    async def main():
        async with serving() as served:
            served.upstream.reply = no_content
            reader, writer = await asyncio.open_connection(served.host, served.port)
            writer.write(post("/v1/completions", STREAM))
            head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 10)
            writer.write(post("/v1/completions", STREAM))  # and the connection goes on
            again = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 10)
            writer.close()
            return head.decode("latin-1").split("\r\n"), again

    lines, again = asyncio.run(main())
    assert lines[0] == "HTTP/1.1 204 No Content"
    assert not header(lines, "transfer-encoding") and not header(lines, "content-length")
    assert again.startswith(b"HTTP/1.1 204 No Content\r\n")
