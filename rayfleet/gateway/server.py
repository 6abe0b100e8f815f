"""Serving a ``Gateway`` (app.py) on a socket.

    sock = listen(host, port)                  # bound now, before Ray takes ports
    runner = await start_gateway(gateway, host, port, sock)
    ...
    await runner.cleanup()

The API routes go through the gateway's own front (front.py) unless
``gateway.http_front`` is 'aiohttp'; everything else is served by aiohttp's runner,
with a client that goes away cancelling its handler
(``handler_cancellation``, which aborts the upstream request), idle and slow-header
connections closed after ``gateway.idle_timeout_s``, and HTTP parser errors answered in
OpenAI's error JSON (http_errors.py's ``GatewayRunner``).
"""

from __future__ import annotations

import socket

from aiohttp import web

from rayfleet.gateway.app import Gateway
from rayfleet.gateway.front import Front, FrontSite
from rayfleet.gateway.http_errors import GatewayRunner

# Connections the kernel completes for us before we accept them; it caps this at
# net.core.somaxconn (4,096 on current kernels). When a burst of new connections finds the
# queue full, their SYNs are dropped and the clients wait 1, 3, 7 s to retry: the
# multi-second TTFT p99 of an overloaded gateway (README, "Overload").
BACKLOG = 65535
SHUTDOWN_S = 60.0  # how long a stopping gateway lets the requests in flight finish


def listen(host: str, port: int, *, reuse_port: bool = False, accept: bool = True) -> socket.socket:
    """The gateway's listening socket, bound now: a fleet binds it before Ray starts, whose
    processes take ports of their own; a busy port is a clear RayfleetError.

    ``reuse_port``: with SO_REUSEPORT, so that several processes (gateway.workers) listen
    on the port and the kernel spreads connections over them. ``accept=False``: bound
    only, holding the port for the workers without taking any connection."""
    from rayfleet.errors import RayfleetError

    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    try:
        if not reuse_port:
            return socket.create_server((host, port), family=family, backlog=BACKLOG)
        if accept is False:
            # SO_REUSEPORT would let this bind join another process's listening group on
            # the port (another fleet's workers): first make sure nobody listens there.
            socket.create_server((host, port), family=family).close()
        sock = socket.socket(family, socket.SOCK_STREAM)
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
            sock.bind((host, port))
            if accept:
                sock.listen(BACKLOG)
        except OSError:
            sock.close()
            raise
        return sock
    except OSError as exc:
        raise RayfleetError(
            f"gateway cannot listen on {host}:{port} ({exc.strerror}); "
            "pass another --port or stop what uses it"
        ) from None


async def start_gateway(
    gateway: Gateway,
    host: str,
    port: int,
    sock: socket.socket | None = None,
    *,
    unix_path: str | None = None,
    tcp: bool = True,
) -> web.AppRunner:
    """Serve ``gateway`` on ``sock`` (from ``listen``), or on host:port; also on the Unix
    socket ``unix_path`` when given (the local socket of gateway.workers), and only
    there when ``tcp`` is false."""
    runner = GatewayRunner(
        gateway.build_app(),
        handler_cancellation=True,
        access_log=None,
        keepalive_timeout=gateway.idle_timeout_s,
        shutdown_timeout=SHUTDOWN_S,
    )
    await runner.setup()
    try:
        if tcp:
            sock = sock or listen(host, port)
            site: web.SockSite
            if gateway.http_front:
                front = Front(
                    gateway.front_routes(),
                    runner,
                    idle_timeout_s=gateway.idle_timeout_s,
                    max_body_bytes=gateway.max_body_bytes,
                )
                site = FrontSite(runner, sock, front, backlog=BACKLOG, shutdown_s=SHUTDOWN_S)
            else:
                site = web.SockSite(runner, sock, backlog=BACKLOG)
            await site.start()
        if unix_path is not None:
            await web.UnixSite(runner, unix_path).start()
    except BaseException:
        await runner.cleanup()
        raise
    return runner
