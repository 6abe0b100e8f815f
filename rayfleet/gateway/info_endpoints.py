"""The gateway's small endpoints, beside the data path of app.py.

    GET /v1/models          the fleet's models (healthy replicas now) and route names
    GET /health             200 when every model has a replica or holds requests until
                            one starts, else 503 ("degraded")
    GET /metrics            the gateway's series and each replica's vLLM gauges
    GET /rayfleet/status    the replicas as the gateway sees them, with the cluster's part
                            (``status_extra``) or ``status_error``, why it is missing
    GET /openapi.json       the API's description (openapi.py)

With API keys in the file, /v1/models asks for one, and /health and /metrics do when
``open_health`` / ``open_metrics`` are off (401 as on the data path). Under
gateway.workers a worker asked /metrics or /rayfleet/status over TCP passes the
request to the fleet process (``control``), which answers for every worker.
"""

from __future__ import annotations

import asyncio
import time
from typing import TYPE_CHECKING, Any

from aiohttp import web

from rayfleet.gateway.errors import GATEWAY_REPLICA, REPLICA_HEADER, RequestError
from rayfleet.gateway.openapi import openapi_document

if TYPE_CHECKING:
    from rayfleet.gateway.app import Gateway


class InfoEndpoints:
    def __init__(self, gateway: Gateway):
        self.gateway = gateway

    def _keyed(self, request: web.Request, open_: bool) -> web.Response | None:
        """None when the request may proceed, else the 401 to answer."""
        gw = self.gateway
        if open_ or not gw.policies.keys:
            return None
        try:
            gw.policies.authenticate(request.headers)
        except RequestError as exc:
            return gw.dispatcher.refuse(exc, "")
        return None

    async def list_models(self, request: web.Request) -> web.Response:
        gw = self.gateway
        refused = self._keyed(request, open_=False)
        if refused is not None:
            return refused
        created = int(time.time())
        data = [
            {
                "id": model,
                "object": "model",
                "created": created,
                "owned_by": "rayfleet",
                "replicas": gw.replica_set.num_healthy(model),
            }
            for model in gw.replica_set.models
        ]
        data += [
            {
                "id": route,
                "object": "model",
                "created": created,
                "owned_by": "rayfleet",
                "route": True,
            }
            for route in gw.policies.routes
        ]
        return web.json_response(
            {"object": "list", "data": data}, headers={REPLICA_HEADER: GATEWAY_REPLICA}
        )

    async def health(self, request: web.Request) -> web.Response:
        gw = self.gateway
        refused = self._keyed(request, gw.policies.open_health)
        if refused is not None:
            return refused
        models = {m: gw.replica_set.num_healthy(m) for m in gw.replica_set.models}
        # A model with no replica now but requests held until one starts (autoscaled, at
        # zero or in a window) is ready to take requests.
        ready = all(n or gw.dispatcher.hold_s.get(m, 0.0) > 0 for m, n in models.items())
        return web.json_response(
            {"status": "ok" if ready else "degraded", "models": models},
            status=200 if ready else 503,
            headers={REPLICA_HEADER: GATEWAY_REPLICA},
        )

    async def prometheus(self, request: web.Request) -> web.StreamResponse:
        gw = self.gateway
        refused = self._keyed(request, gw.policies.open_metrics)
        if refused is not None:
            return refused
        if gw.control is not None and not via_local_socket(request):
            return await gw.control(request)
        # Here, not in metrics.before_render: render() is also called off the loop.
        gw.metrics.asyncio_tasks.set(len(asyncio.all_tasks()))
        body = gw.metrics.render()
        if gw.metrics_peers is not None:
            from rayfleet.gateway.metrics_merge import merge

            body = merge(body, await gw.metrics_peers())
        return web.Response(
            body=body,
            headers={"Content-Type": "text/plain; version=0.0.4", REPLICA_HEADER: GATEWAY_REPLICA},
        )

    async def status(self, request: web.Request) -> web.StreamResponse:
        gw = self.gateway
        if gw.control is not None and not via_local_socket(request):
            return await gw.control(request)
        now = time.monotonic()
        body: dict[str, Any] = {
            "models": {m: gw.replica_set.num_healthy(m) for m in gw.replica_set.models},
            "replicas": [r.as_dict(now) for r in gw.replica_set.replicas()],
        }
        if gw.status_extra is not None:
            try:
                body.update(await gw.status_extra())
            except Exception as exc:  # noqa: BLE001 - the status page shows what failed
                body["status_error"] = str(exc)
        return web.json_response(body, headers={REPLICA_HEADER: GATEWAY_REPLICA})

    async def openapi(self, _request: web.Request) -> web.Response:
        gw = self.gateway
        routes = [(method, path) for method, path, _ in gw.extra_routes]
        return web.json_response(openapi_document(routes))


def via_local_socket(request: web.Request) -> bool:
    """Whether ``request`` came over a Unix socket: the local socket by which the
    processes of gateway.workers speak to each other, never a client's."""
    transport = request.transport
    return transport is not None and isinstance(transport.get_extra_info("sockname"), str)
