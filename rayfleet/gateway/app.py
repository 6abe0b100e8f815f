"""The OpenAI-compatible gateway: one endpoint in front of every replica of every model.

Data flow of one request::

    client --POST /v1/chat/completions--> Gateway._proxy
        read body once -> parse_request (model, stream, field types; 400 on bad input)
        model known? (404 listing the models served)
        ReplicaSet.pick(model)         fewest requests in flight
        _forward(replica)              aiohttp, pooled connections, bytes passed through
            failure before the first byte -> take the replica out of rotation, retry once
                                             on another replica of the same model
            failure after the first byte  -> end the stream with an error event
            client disconnects            -> the handler is cancelled, the upstream
                                             connection is closed, vLLM aborts the request

Replica membership comes from ``source``, an async callable returning registry
entries, polled every ``poll_interval_s``. ``status_extra``, when given, is an async
callable whose dict is merged into ``GET /rayfleet/status`` (nodes, Serve state).

Endpoints: ``/v1/models``, ``/v1/chat/completions``, ``/v1/completions``,
``/v1/embeddings``, ``/health``, ``/metrics`` and ``/rayfleet/status``.
Every response carries ``x-rayfleet-replica``: the replica that served it, or
``gateway`` when the gateway answered itself.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from typing import Awaitable, Callable, Optional

import aiohttp
from aiohttp import web

from rayfleet.gateway.errors import (
    GATEWAY_REPLICA,
    REPLICA_HEADER,
    RequestError,
    openai_error,
    sse_error_event,
)
from rayfleet.gateway.metrics import GatewayMetrics
from rayfleet.gateway.replicas import Replica, ReplicaSet
from rayfleet.gateway.validate import INPUT_FIELDS, parse_request

log = logging.getLogger("rayfleet.gateway")

EntrySource = Callable[[], Awaitable[list[dict]]]
StatusExtra = Callable[[], Awaitable[dict]]

_FORWARDED_REQUEST_HEADERS = ("authorization", "x-request-id")
_RETRY = object()
_UPSTREAM_ERRORS = (aiohttp.ClientError, asyncio.TimeoutError, ConnectionError)


class Gateway:
    def __init__(
        self,
        models: list[str],
        source: Optional[EntrySource] = None,
        *,
        connect_timeout_s: float = 5.0,
        request_timeout_s: float = 600.0,
        poll_interval_s: float = 1.0,
        cooldown_s: float = 5.0,
        status_extra: Optional[StatusExtra] = None,
    ):
        self.replica_set = ReplicaSet(models, cooldown_s=cooldown_s)
        self.metrics = GatewayMetrics()
        self.source = source
        self.status_extra = status_extra
        self.poll_interval_s = poll_interval_s
        self.timeout = aiohttp.ClientTimeout(
            total=request_timeout_s, sock_connect=connect_timeout_s
        )
        self._session: Optional[aiohttp.ClientSession] = None
        self._poller: Optional[asyncio.Task] = None

    # -- application -----------------------------------------------------------------

    def build_app(self) -> web.Application:
        app = web.Application(middlewares=[_json_http_errors], client_max_size=64 * 1024**2)
        app.router.add_get("/v1/models", self.list_models)
        for path in INPUT_FIELDS:
            app.router.add_post(path, self._proxy_for(path))
        app.router.add_get("/health", self.health)
        app.router.add_get("/metrics", self.prometheus)
        app.router.add_get("/rayfleet/status", self.status)
        app.on_startup.append(self._start)
        app.on_cleanup.append(self._stop)
        return app

    async def _start(self, _app: web.Application) -> None:
        connector = aiohttp.TCPConnector(limit=0, keepalive_timeout=60)
        self._session = aiohttp.ClientSession(
            connector=connector, timeout=self.timeout, auto_decompress=False
        )
        if self.source is not None:
            await self.refresh()
            self._poller = asyncio.create_task(self._poll_forever())

    async def _stop(self, _app: web.Application) -> None:
        if self._poller:
            self._poller.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._poller
        if self._session:
            await self._session.close()

    async def refresh(self) -> None:
        """Pull replica membership from the source once."""
        try:
            entries = await self.source()
        except Exception as exc:  # the registry being briefly away must not stop routing
            log.warning("could not read the replica registry: %s", exc)
            return
        self.replica_set.update(entries)
        now = time.monotonic()
        for model in self.replica_set.models:
            replicas = self.replica_set.replicas(model)
            healthy = sum(r.healthy(now) for r in replicas)
            self.metrics.replicas.labels(model, "healthy").set(healthy)
            self.metrics.replicas.labels(model, "cooling_down").set(len(replicas) - healthy)

    async def _poll_forever(self) -> None:
        while True:
            await asyncio.sleep(self.poll_interval_s)
            await self.refresh()

    # -- small endpoints -------------------------------------------------------------

    async def list_models(self, _request: web.Request) -> web.Response:
        created = int(time.time())
        data = [
            {
                "id": model,
                "object": "model",
                "created": created,
                "owned_by": "rayfleet",
                "replicas": self.replica_set.num_healthy(model),
            }
            for model in self.replica_set.models
        ]
        return web.json_response(
            {"object": "list", "data": data}, headers={REPLICA_HEADER: GATEWAY_REPLICA}
        )

    async def health(self, _request: web.Request) -> web.Response:
        models = {m: self.replica_set.num_healthy(m) for m in self.replica_set.models}
        ready = all(models.values())
        return web.json_response(
            {"status": "ok" if ready else "degraded", "models": models},
            status=200 if ready else 503,
            headers={REPLICA_HEADER: GATEWAY_REPLICA},
        )

    async def prometheus(self, _request: web.Request) -> web.Response:
        return web.Response(
            body=self.metrics.render(),
            headers={"Content-Type": "text/plain; version=0.0.4", REPLICA_HEADER: GATEWAY_REPLICA},
        )

    async def status(self, _request: web.Request) -> web.Response:
        now = time.monotonic()
        body = {
            "models": {m: self.replica_set.num_healthy(m) for m in self.replica_set.models},
            "replicas": [r.as_dict(now) for r in self.replica_set.replicas()],
        }
        if self.status_extra is not None:
            try:
                body.update(await self.status_extra())
            except Exception as exc:
                body["status_error"] = str(exc)
        return web.json_response(body, headers={REPLICA_HEADER: GATEWAY_REPLICA})

    # -- the data path ---------------------------------------------------------------

    def _proxy_for(self, path: str):
        async def handler(request: web.Request) -> web.StreamResponse:
            return await self._proxy(request, path)

        return handler

    async def _proxy(self, request: web.Request, path: str) -> web.StreamResponse:
        started = time.perf_counter()
        raw = await request.read()
        try:
            parsed = parse_request(path, raw)
            self._check_model(parsed.model)
        except RequestError as exc:
            self.metrics.errors.labels(getattr(exc, "model", ""), exc.reason).inc()
            self.metrics.requests.labels("", GATEWAY_REPLICA, str(exc.status)).inc()
            return exc.response()

        model = parsed.model
        headers = {"Content-Type": "application/json"}
        for name in _FORWARDED_REQUEST_HEADERS:
            if name in request.headers:
                headers[name] = request.headers[name]

        tried: list[str] = []
        while len(tried) < 2:
            replica = self.replica_set.pick(model, exclude=tried)
            if replica is None:
                break
            if tried:
                self.metrics.retries.labels(model).inc()
            tried.append(replica.replica_id)
            result = await self._forward(request, replica, path, raw, headers, started)
            if result is not _RETRY:
                return result

        if tried:
            error = RequestError(
                502,
                f"The replicas of model '{model}' failed before responding "
                f"(tried {', '.join(tried)}). Retry the request.",
                code="upstream_failed",
                reason="upstream_failed",
            )
        else:
            error = RequestError(
                503,
                f"No healthy replica of model '{model}' is available right now. "
                "Retry shortly, or check `rayfleet status`.",
                code="no_healthy_replica",
                reason="no_replica",
            )
        self.metrics.errors.labels(model, error.reason).inc()
        self.metrics.requests.labels(model, GATEWAY_REPLICA, str(error.status)).inc()
        return error.response()

    def _check_model(self, model: str) -> None:
        if model in self.replica_set.models:
            return
        served = ", ".join(self.replica_set.models)
        error = RequestError(
            404,
            f"The model '{model}' does not exist. Models served: {served}.",
            param="model",
            code="model_not_found",
            reason="unknown_model",
        )
        raise error

    async def _forward(
        self,
        request: web.Request,
        replica: Replica,
        path: str,
        raw: bytes,
        headers: dict,
        started: float,
    ):
        """Send one request to one replica; _RETRY when it failed before the first byte."""
        model, rid = replica.model, replica.replica_id
        inflight = self.metrics.inflight.labels(model, rid)
        self.replica_set.begin(replica)
        inflight.inc()
        upstream: Optional[aiohttp.ClientResponse] = None
        finished = False
        try:
            try:
                upstream = await self._session.post(replica.url + path, data=raw, headers=headers)
            except _UPSTREAM_ERRORS as exc:
                log.warning("replica %s unreachable: %r", rid, exc)
                self._replica_failed(replica, "upstream_connect")
                return _RETRY
            if upstream.status >= 500:
                log.warning("replica %s answered %s", rid, upstream.status)
                self._replica_failed(replica, "upstream_status")
                return _RETRY

            response = web.StreamResponse(status=upstream.status)
            response.content_type = upstream.content_type
            if upstream.charset:
                response.charset = upstream.charset
            response.headers[REPLICA_HEADER] = rid
            if upstream.content_length is not None:
                response.content_length = upstream.content_length
            streaming = upstream.content_type == "text/event-stream"
            await response.prepare(request)

            first_byte_at = None
            broken = False
            while True:
                try:
                    chunk = await upstream.content.readany()
                except _UPSTREAM_ERRORS as exc:
                    log.warning("replica %s broke mid-response: %r", rid, exc)
                    broken = True
                    break
                if not chunk:
                    break
                if first_byte_at is None:
                    first_byte_at = time.perf_counter()
                    self.metrics.ttfb.labels(model, rid).observe(first_byte_at - started)
                await response.write(chunk)

            if broken:
                self._replica_failed(replica, "stream_broken")
                if streaming:
                    await response.write(
                        sse_error_event(f"replica {rid} failed mid-stream; the response is incomplete")
                    )
            else:
                finished = True
                self.replica_set.succeeded(replica)
            await response.write_eof()
            self.metrics.latency.labels(model, rid).observe(time.perf_counter() - started)
            self.metrics.requests.labels(model, rid, str(upstream.status)).inc()
            return response
        except (asyncio.CancelledError, ConnectionResetError):
            # The client went away: closing the upstream connection makes vLLM abort.
            self.metrics.errors.labels(model, "client_disconnect").inc()
            raise
        finally:
            self.replica_set.end(replica)
            inflight.dec()
            if upstream is not None:
                if finished:
                    upstream.release()
                else:
                    upstream.close()

    def _replica_failed(self, replica: Replica, reason: str) -> None:
        self.replica_set.failed(replica)
        self.metrics.errors.labels(replica.model, reason).inc()


@web.middleware
async def _json_http_errors(request: web.Request, handler):
    """Turn aiohttp's plain-text HTTP errors (404, 405, 413) into OpenAI error JSON."""
    try:
        return await handler(request)
    except web.HTTPException as exc:
        if exc.status < 400:
            raise
        message = {
            404: f"Unknown endpoint {request.method} {request.path}.",
            405: f"Method {request.method} is not allowed on {request.path}.",
            413: "Request body too large.",
        }.get(exc.status, exc.reason)
        return openai_error(exc.status, message)


async def start_gateway(gateway: Gateway, host: str, port: int) -> web.AppRunner:
    """Serve ``gateway`` on host:port; a busy port is a clear RayfleetError."""
    from rayfleet.errors import RayfleetError

    runner = web.AppRunner(gateway.build_app(), handler_cancellation=True, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, host, port, backlog=1024)
    try:
        await site.start()
    except OSError as exc:
        await runner.cleanup()
        raise RayfleetError(
            f"gateway cannot listen on {host}:{port} ({exc.strerror}); "
            "pass another --port or stop what uses it"
        ) from None
    return runner
