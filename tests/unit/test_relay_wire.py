"""relay_wire's hold on a response's head: aiohttp sends a ``StreamResponse``'s head at
once unless a private switch says otherwise, so a new aiohttp that drops the switch must
fail here, not quietly cost every whole-body answer a write of its own."""

from __future__ import annotations

import asyncio
import socket

from aiohttp import web

from rayfleet.gateway.relay_wire import head_with_body


def first_transport_write(hold_head: bool) -> bytes:
    """What the first write to the client's socket carried, for a response that sends
    its head, then a body of b"whole body". On asyncio's own loop: uvloop's transports
    (the gateway's, and the suite's once a gateway has run) cannot be wrapped."""
    with asyncio.Runner(loop_factory=asyncio.SelectorEventLoop) as runner:
        return runner.run(_first_transport_write(hold_head))


async def _first_transport_write(hold_head: bool) -> bytes:
    writes: list[bytes] = []

    async def handler(request: web.Request) -> web.StreamResponse:
        transport = request.transport
        assert transport is not None
        write, writelines = transport.write, transport.writelines

        def record(data: bytes) -> None:
            writes.append(bytes(data))
            write(data)

        def record_lines(lines: list[bytes]) -> None:
            writes.append(b"".join(lines))
            writelines(lines)

        transport.write, transport.writelines = record, record_lines  # type: ignore[method-assign]
        response = web.StreamResponse(headers={"Content-Length": "10"})
        if hold_head:
            head_with_body(response)
        await response.prepare(request)
        await response.write(b"whole body")
        await response.write_eof()
        return response

    app = web.Application()
    app.router.add_get("/", handler)
    runner = web.AppRunner(app)
    await runner.setup()
    listening = socket.create_server(("127.0.0.1", 0))
    port = listening.getsockname()[1]
    await web.SockSite(runner, listening).start()
    try:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(b"GET / HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        answer = await reader.read()
        writer.close()
        assert answer.startswith(b"HTTP/1.1 200") and answer.endswith(b"whole body")
    finally:
        await runner.cleanup()
    return writes[0]


def test_a_held_head_leaves_in_one_write_with_the_body():
    first = first_transport_write(hold_head=True)
    assert first.startswith(b"HTTP/1.1 200") and first.endswith(b"whole body")


def test_without_the_hold_the_head_leaves_alone():
    """The control: the switch is what changes the writes."""
    first = first_transport_write(hold_head=False)
    assert first.startswith(b"HTTP/1.1 200") and b"whole body" not in first
