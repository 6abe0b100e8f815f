"""Serving a ``Gateway`` (app.py) on a socket.

    sock = listen(host, port)                  # bound now, before Ray takes ports
    runner = await start_gateway(gateway, host, port, sock)
    ...
    await runner.cleanup()

aiohttp's runner, with a client that goes away cancelling its handler
(``handler_cancellation``, which aborts the upstream request), idle and slow-header
connections closed after ``gateway.idle_timeout_s``, and HTTP parser errors answered in
OpenAI's error JSON (http_errors.py's ``GatewayRunner``).
"""

from __future__ import annotations

import socket

from aiohttp import web

from rayfleet.gateway.app import Gateway
from rayfleet.gateway.http_errors import GatewayRunner


def listen(host: str, port: int) -> socket.socket:
    """The gateway's listening socket, bound now: a fleet binds it before Ray starts, whose
    processes take ports of their own; a busy port is a clear RayfleetError."""
    from rayfleet.errors import RayfleetError

    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    try:
        return socket.create_server((host, port), family=family, backlog=1024)
    except OSError as exc:
        raise RayfleetError(
            f"gateway cannot listen on {host}:{port} ({exc.strerror}); "
            "pass another --port or stop what uses it"
        ) from None


async def start_gateway(
    gateway: Gateway, host: str, port: int, sock: socket.socket | None = None
) -> web.AppRunner:
    """Serve ``gateway`` on ``sock`` (from ``listen``), or on host:port."""
    runner = GatewayRunner(
        gateway.build_app(),
        handler_cancellation=True,
        access_log=None,
        keepalive_timeout=gateway.idle_timeout_s,
    )
    await runner.setup()
    try:
        site = web.SockSite(runner, sock or listen(host, port), backlog=1024)
        await site.start()
    except BaseException:
        await runner.cleanup()
        raise
    return runner
