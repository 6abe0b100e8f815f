"""The running fleet's admin endpoints, on the gateway's port, for this machine only.

    POST /rayfleet/scale  {"model": M, "replicas": N}   `rayfleet scale M N` (N or "auto")
    POST /rayfleet/apply  {"config": YAML, "dry_run": b} `rayfleet apply -c fleet.yaml`

They change the fleet, so they answer only clients on a loopback address (the CLI on
the fleet's own machine), whatever address the gateway listens on; anyone else gets
403. Errors are OpenAI-style JSON with a one-line message.
"""

from __future__ import annotations

import ipaddress
from typing import TYPE_CHECKING, Any

from aiohttp import web

from rayfleet.gateway.errors import openai_error
from rayfleet.gateway.info_endpoints import via_local_socket
from rayfleet.gateway.workers import FORWARDED_FOR

if TYPE_CHECKING:
    from rayfleet.control.fleet import FleetProcess
    from rayfleet.gateway.app import Route


def admin_routes(fleet: FleetProcess) -> list[Route]:
    async def scale(request: web.Request) -> web.StreamResponse:
        body = await _admin_body(request)
        if isinstance(body, web.Response):
            return body
        model, replicas = body.get("model"), body.get("replicas")
        count = None if replicas == "auto" else replicas
        if not isinstance(model, str) or not (
            count is None or (isinstance(count, int) and count >= 0)
        ):
            return _error(400, 'send {"model": NAME, "replicas": N} with N >= 0, or "auto"')
        problem = fleet.scaler.scale(model, count)
        if problem:
            return _error(400, problem)
        return web.json_response({"model": model, "replicas": replicas})

    async def apply(request: web.Request) -> web.StreamResponse:
        body = await _admin_body(request)
        if isinstance(body, web.Response):
            return body
        text = body.get("config")
        if not isinstance(text, str):
            return _error(400, 'send {"config": <fleet.yaml text>, "dry_run": bool}')
        result = await fleet.apply(text, dry_run=bool(body.get("dry_run")))
        if result.error:
            return _error(400, result.error)
        return web.json_response(result.as_dict())

    return [("POST", "/rayfleet/scale", scale), ("POST", "/rayfleet/apply", apply)]


async def _admin_body(request: web.Request) -> dict[str, Any] | web.Response:
    if not _loopback(client_address(request)):
        return _error(403, "admin endpoints answer only on the fleet's own machine")
    try:
        body = await request.json()
    except ValueError:
        return _error(400, "the body is not JSON")
    if not isinstance(body, dict):
        return _error(400, "the body must be a JSON object")
    return body


def client_address(request: web.Request) -> str | None:
    """The client's address; for a request a gateway worker passed on over the local
    socket (gateway.workers), the address the worker saw."""
    if via_local_socket(request):
        return request.headers.get(FORWARDED_FOR)
    return request.remote


def _loopback(remote: str | None) -> bool:
    try:
        return remote is not None and ipaddress.ip_address(remote).is_loopback
    except ValueError:
        return False


def _error(status: int, message: str) -> web.Response:
    return openai_error(status, message)
