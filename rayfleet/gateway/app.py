"""The OpenAI-compatible gateway: one endpoint in front of every replica of every model.

Data flow of one request (policies compiled once, see policies.py)::

    client --POST /v1/chat/completions--> Gateway._proxy
        auth                            API key from 'Authorization: Bearer' (401)
        read body once -> parse_request (model, stream, field types; 400 on bad input)
        Policies.admit                  model or route known (404), key may use it (403),
                                        caps: body bytes (413), max_tokens (400 or clamp),
                                        n, messages; priority class; route rules pick a
                                        model or a provider (x-rayfleet-route); context
                                        length (400); key quotas (429 + Retry-After)
        ReplicaSet.pick(model)          fewest requests in flight; all over the queue
                                        depth -> fallback provider
        _forward(replica)               aiohttp, pooled connections, bytes passed through,
                                        the class's total and idle timeouts (408)
            failure before the first byte -> count it against the replica (out of rotation
                                             after N in a row), retry once on another
                                             replica, then the fallback provider
            failure after the first byte  -> end the stream with an error event
            client disconnects            -> the handler is cancelled, the upstream
                                             connection is closed, vLLM aborts the request

Replica membership comes from ``source``, an async callable returning registry
entries, polled every ``poll_interval_s``. ``status_extra``, when given, is an async
callable whose dict is merged into ``GET /rayfleet/status`` (nodes, Serve state).

Endpoints: ``/v1/models``, ``/v1/chat/completions``, ``/v1/completions``,
``/v1/embeddings``, ``/health``, ``/metrics`` and ``/rayfleet/status``.
Every response carries ``x-rayfleet-replica``: the replica that served it,
``fallback:<provider>``, or ``gateway`` when the gateway answered itself.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable

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
from rayfleet.gateway.policies import Policies
from rayfleet.gateway.relay import RelayPool, UpstreamConnectError
from rayfleet.gateway.replicas import Replica, ReplicaSet
from rayfleet.gateway.validate import INPUT_FIELDS, parse_request

log = logging.getLogger("rayfleet.gateway")

EntrySource = Callable[[], Awaitable[list[dict]]]
StatusExtra = Callable[[], Awaitable[dict]]

ROUTE_HEADER = "x-rayfleet-route"
_FORWARDED_REQUEST_HEADERS = ("authorization", "x-request-id")
_RETRY = object()
_UPSTREAM_ERRORS = (aiohttp.ClientError, asyncio.TimeoutError, ConnectionError)


class Gateway:
    def __init__(
        self,
        models: list[str],
        source: EntrySource | None = None,
        *,
        connect_timeout_s: float = 5.0,
        request_timeout_s: float = 600.0,
        poll_interval_s: float = 1.0,
        cooldown_s: float | None = None,
        status_extra: StatusExtra | None = None,
        policies: Policies | None = None,
        relay: bool = True,
    ):
        self.policies = policies if policies is not None else Policies.plain(models)
        self.replica_set = ReplicaSet(
            models,
            cooldown_s=cooldown_s if cooldown_s is not None else self.policies.cooldown_s,
            max_consecutive_failures=self.policies.max_consecutive_failures,
        )
        # A gateway key is for the gateway: do not hand it to the replicas.
        self._forwarded_headers = tuple(
            h
            for h in _FORWARDED_REQUEST_HEADERS
            if not (self.policies.keys and h == "authorization")
        )
        self.metrics = GatewayMetrics()
        self.source = source
        self.status_extra = status_extra
        self.poll_interval_s = poll_interval_s
        self.timeout = aiohttp.ClientTimeout(
            total=request_timeout_s, sock_connect=connect_timeout_s
        )
        self._session: aiohttp.ClientSession | None = None
        # Replica responses through relay.py (False: through aiohttp's client, as providers).
        self._relay_pool = RelayPool(connect_timeout_s) if relay else None
        self._poller: asyncio.Task | None = None

    # -- application -----------------------------------------------------------------

    def build_app(self) -> web.Application:
        cap = self.policies.default_limits.max_body_bytes
        app = web.Application(middlewares=[_json_http_errors], client_max_size=cap or 64 * 1024**2)
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
        needed = self.policies.tokenizers_needed()
        if needed:
            await asyncio.to_thread(self.policies.counter.load, needed)
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
        if self._relay_pool is not None:
            self._relay_pool.close()

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

    def _keyed(self, request: web.Request, open_: bool) -> web.Response | None:
        """None when the request may proceed, else the 401 to answer."""
        if open_ or not self.policies.keys:
            return None
        try:
            self.policies.authenticate(request.headers)
        except RequestError as exc:
            return self._refuse(exc, "")
        return None

    async def list_models(self, request: web.Request) -> web.Response:
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
                "replicas": self.replica_set.num_healthy(model),
            }
            for model in self.replica_set.models
        ]
        data += [
            {
                "id": route,
                "object": "model",
                "created": created,
                "owned_by": "rayfleet",
                "route": True,
            }
            for route in self.policies.routes
        ]
        return web.json_response(
            {"object": "list", "data": data}, headers={REPLICA_HEADER: GATEWAY_REPLICA}
        )

    async def health(self, request: web.Request) -> web.Response:
        refused = self._keyed(request, self.policies.open_health)
        if refused is not None:
            return refused
        models = {m: self.replica_set.num_healthy(m) for m in self.replica_set.models}
        ready = all(models.values())
        return web.json_response(
            {"status": "ok" if ready else "degraded", "models": models},
            status=200 if ready else 503,
            headers={REPLICA_HEADER: GATEWAY_REPLICA},
        )

    async def prometheus(self, request: web.Request) -> web.Response:
        refused = self._keyed(request, self.policies.open_metrics)
        if refused is not None:
            return refused
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
        policies = self.policies
        try:
            key = policies.authenticate(request.headers)
            self._check_declared_size(request)
            raw = await request.read()
            parsed = parse_request(path, raw)
            admission = policies.admit(path, parsed, len(raw), request.headers, self._usable, key)
        except RequestError as exc:
            return self._refuse(exc, getattr(exc, "model", ""))
        try:
            return await self._route(request, path, raw, admission, started)
        finally:
            admission.release()

    def _check_declared_size(self, request: web.Request) -> None:
        cap = self.policies.default_limits.max_body_bytes
        if cap is not None and request.content_length is not None and request.content_length > cap:
            raise RequestError(
                413,
                f"Request body is {request.content_length} bytes; the limit is {cap} bytes.",
                code="body_too_large",
                reason="body_too_large",
            )

    def _usable(self, model: str) -> bool:
        return self.replica_set.num_healthy(model) > 0

    def _refuse(self, error: RequestError, model: str) -> web.Response:
        self.metrics.errors.labels(model, error.reason).inc()
        self.metrics.requests.labels(model, GATEWAY_REPLICA, str(error.status)).inc()
        return error.response()

    async def _route(self, request, path, raw, admission, started) -> web.StreamResponse:
        """Send an admitted request to the fleet, falling back to a provider when allowed."""
        metrics = self.metrics
        requested = admission.requested
        if admission.key is not None:
            metrics.key_requests.labels(admission.key.name).inc()
        if admission.clamped:
            metrics.clamped.labels(requested).inc()
        extra = {}
        if admission.route_rule is not None:
            extra[ROUTE_HEADER] = admission.route_rule
            target = admission.model or admission.provider.label
            metrics.routes.labels(requested, admission.route_rule, target).inc()
        upstream_timeout = self._timeout_for(admission)
        if admission.provider is not None:
            return await self._to_provider(
                request,
                path,
                admission,
                admission.provider,
                admission.provider_model,
                "rule",
                extra,
                started,
            )

        model = admission.model
        when = self.policies.fallback
        headers = self._upstream_headers(request)
        body = admission.fleet_body(raw)
        tried: list[str] = []
        reason = "no_replica"
        while len(tried) < 2:
            replica = self.replica_set.pick(model, exclude=tried)
            if replica is None:
                break
            if (
                not tried
                and when.max_queue_depth is not None
                and replica.num_inflight >= when.max_queue_depth
            ):
                fallback = self.policies.fallback_for(admission)
                if fallback is not None:
                    return await self._to_provider(
                        request, path, admission, *fallback, "queue_depth", extra, started
                    )
            if tried:
                metrics.retries.labels(model).inc()
            tried.append(replica.replica_id)
            if self._relay_pool is not None and RelayPool.handles(replica.url):
                result = await self._relay(
                    request,
                    replica,
                    path,
                    model,
                    body,
                    headers,
                    started,
                    extra=extra,
                    timeout=upstream_timeout,
                    admission=admission,
                )
            else:
                result = await self._forward(
                    request,
                    replica.url + path,
                    replica.replica_id,
                    model,
                    body,
                    headers,
                    started,
                    replica=replica,
                    extra=extra,
                    timeout=upstream_timeout,
                    admission=admission,
                )
            if result is not _RETRY:
                return result
            reason = "failure"

        allowed = when.on_failure if tried else when.on_no_replica
        fallback = self.policies.fallback_for(admission) if allowed else None
        if fallback is not None:
            return await self._to_provider(
                request, path, admission, *fallback, reason, extra, started
            )
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
        return self._refuse(error, model)

    async def _to_provider(
        self, request, path, admission, provider, provider_model, reason, extra, started
    ) -> web.StreamResponse:
        self.metrics.fallbacks.labels(admission.requested, provider.name, reason).inc()
        body = provider.body_for(admission.body, provider_model)
        timeout = self._timeout_for(admission, provider.timeout)
        result = await self._forward(
            request,
            provider.url(path),
            provider.label,
            admission.requested,
            body,
            provider.headers,
            started,
            extra=extra,
            timeout=timeout,
            admission=admission,
        )
        if result is _RETRY:
            error = RequestError(
                502,
                f"Fallback provider '{provider.name}' failed before responding. Retry the request.",
                code="upstream_failed",
                reason="fallback_failed",
            )
            return self._refuse(error, admission.requested)
        return result

    def _upstream_headers(self, request: web.Request) -> dict:
        headers = {"Content-Type": "application/json"}
        for name in self._forwarded_headers:
            if name in request.headers:
                headers[name] = request.headers[name]
        return headers

    def _timeout_for(self, admission, base: aiohttp.ClientTimeout | None = None):
        cls = admission.priority_class
        if cls is None or (cls.timeout_s is None and cls.stream_idle_timeout_s is None):
            return base
        base = base or self.timeout
        return aiohttp.ClientTimeout(
            total=min(cls.timeout_s or base.total, base.total),
            sock_connect=base.sock_connect or self.timeout.sock_connect,
            sock_read=cls.stream_idle_timeout_s,
        )

    async def _forward(
        self,
        request: web.Request,
        url: str,
        label: str,
        model: str,
        raw: bytes,
        headers: dict,
        started: float,
        *,
        replica: Replica | None = None,
        extra: dict | None = None,
        timeout: aiohttp.ClientTimeout | None = None,
        admission=None,
    ):
        """Send one request upstream; _RETRY when it failed before the first byte."""
        inflight = self.metrics.inflight.labels(model, label)
        if replica is not None:
            self.replica_set.begin(replica)
        inflight.inc()
        upstream: aiohttp.ClientResponse | None = None
        finished = False
        try:
            try:
                if timeout is None:
                    upstream = await self._session.post(url, data=raw, headers=headers)
                else:
                    upstream = await self._session.post(
                        url, data=raw, headers=headers, timeout=timeout
                    )
            except aiohttp.ConnectionTimeoutError as exc:
                return self._unreachable(replica, model, label, exc)
            except TimeoutError:
                return self._refuse(self._timed_out(admission, timeout), model)
            except _UPSTREAM_ERRORS as exc:
                return self._unreachable(replica, model, label, exc)
            if self._server_error(upstream.status, replica, model, label):
                return _RETRY

            response = _response_like(
                upstream.status, upstream.content_type, upstream.charset, label, extra
            )
            if upstream.content_length is not None:
                response.content_length = upstream.content_length
            streaming = upstream.content_type == "text/event-stream"
            await response.prepare(request)

            first_byte_at = None
            last_chunk = b""
            broken = timed_out = False
            while True:
                try:
                    chunk = await upstream.content.readany()
                except TimeoutError:
                    timed_out = True
                    break
                except _UPSTREAM_ERRORS as exc:
                    log.warning("%s broke mid-response: %r", label, exc)
                    broken = True
                    break
                if not chunk:
                    break
                if first_byte_at is None:
                    first_byte_at = time.perf_counter()
                    self.metrics.ttfb.labels(model, label).observe(first_byte_at - started)
                await response.write(chunk)
                last_chunk = chunk

            if timed_out or broken:
                await self._end_cut_off(
                    response,
                    "timeout" if timed_out else "broken",
                    last_chunk if streaming else None,
                    replica,
                    model,
                    label,
                    admission,
                    timeout,
                )
            else:
                finished = True
                if replica is not None:
                    self.replica_set.succeeded(replica)
            await response.write_eof()
            self.metrics.latency.labels(model, label).observe(time.perf_counter() - started)
            self.metrics.requests.labels(model, label, str(upstream.status)).inc()
            return response
        except (asyncio.CancelledError, ConnectionResetError):
            # The client went away: closing the upstream connection makes vLLM abort.
            self.metrics.errors.labels(model, "client_disconnect").inc()
            raise
        finally:
            if replica is not None:
                self.replica_set.end(replica)
            inflight.dec()
            if upstream is not None:
                if finished:
                    upstream.release()
                else:
                    upstream.close()

    async def _relay(
        self,
        request,
        replica: Replica,
        path: str,
        model: str,
        raw: bytes,
        headers: dict,
        started: float,
        *,
        extra: dict,
        timeout,
        admission,
    ):
        """``_forward`` for a replica over plain HTTP, through the relay (see relay.py)."""
        label = replica.replica_id
        metrics = self.metrics
        inflight = metrics.inflight.labels(model, label)
        self.replica_set.begin(replica)
        inflight.inc()
        up = None
        finished = False
        limits = timeout or self.timeout
        try:
            try:
                up = await self._relay_pool.request(
                    replica.url, path, raw, headers, total_s=limits.total, idle_s=limits.sock_read
                )
            except TimeoutError:
                return self._refuse(self._timed_out(admission, timeout), model)
            except UpstreamConnectError as exc:
                return self._unreachable(replica, model, label, exc)
            if self._server_error(up.status, replica, model, label):
                return _RETRY

            response = _response_like(up.status, up.content_type, up.charset, label, extra)
            if up.chunked:
                if request.version >= aiohttp.HttpVersion11:
                    response.enable_chunked_encoding()  # the relay frames the chunks itself
                await response.prepare(request)
                outcome = await up.stream_to(response, request)
            else:
                body, outcome = await up.body()
                if outcome == "done":
                    response.content_length = len(body)
                    await response.prepare(request)
                    await response.write(body)
            if up.first_at:
                metrics.ttfb.labels(model, label).observe(up.first_at - started)
            if outcome == "client_gone":
                raise ConnectionResetError("the client went away")
            if outcome == "done":
                finished = True
                self.replica_set.succeeded(replica)
            elif not up.chunked:  # nothing was sent yet: answer with an error of our own
                if outcome == "timeout":
                    return self._refuse(self._timed_out(admission, timeout), model)
                self._replica_failed(replica, model, "stream_broken")
                return self._refuse(
                    RequestError(
                        502,
                        f"{label} failed while responding; retry the request.",
                        code="upstream_failed",
                        reason="upstream_failed",
                    ),
                    model,
                )
            else:
                await self._end_cut_off(
                    response, outcome, up.last_piece, replica, model, label, admission, timeout
                )
            await response.write_eof()
            metrics.latency.labels(model, label).observe(time.perf_counter() - started)
            metrics.requests.labels(model, label, str(up.status)).inc()
            return response
        except (asyncio.CancelledError, ConnectionResetError):
            metrics.errors.labels(model, "client_disconnect").inc()
            raise
        finally:
            self.replica_set.end(replica)
            inflight.dec()
            if up is not None:
                if finished:
                    self._relay_pool.release(up)
                else:
                    up.close()

    def _unreachable(self, replica: Replica | None, model: str, label: str, exc) -> object:
        """No response head came: count it against the replica; the caller retries."""
        log.warning("%s unreachable: %r", label, exc)
        self._replica_failed(replica, model, "upstream_connect")
        return _RETRY

    def _server_error(self, status: int, replica: Replica | None, model: str, label: str) -> bool:
        """A 5xx before the first byte counts against the replica and is retried."""
        if status < 500:
            return False
        log.warning("%s answered %s", label, status)
        self._replica_failed(replica, model, "upstream_status")
        return True

    async def _end_cut_off(
        self,
        response,
        outcome: str,
        last_piece: bytes | None,
        replica: Replica | None,
        model: str,
        label: str,
        admission,
        timeout,
    ) -> None:
        """Account for a response cut off by a timeout or a broken upstream; a stream
        (``last_piece`` not None) gets an error event of its own to end with."""
        if outcome == "timeout":
            error = self._timed_out(admission, timeout)
            self.metrics.errors.labels(model, error.reason).inc()
            event = sse_error_event(error.message, "timeout", 408)
        else:
            self._replica_failed(replica, model, "stream_broken")
            event = sse_error_event(f"{label} failed mid-stream; the response is incomplete")
        if last_piece is not None:
            await response.write(_event_boundary(last_piece) + event)

    @staticmethod
    def _timed_out(admission, timeout) -> RequestError:
        cls = admission.priority_class if admission is not None else None
        limit = f" of priority class '{cls.name}'" if cls is not None else ""
        if timeout is not None and timeout.sock_read and cls and cls.stream_idle_timeout_s:
            detail = (
                f"exceeded the time limit{limit} ({timeout.total:g} s total, "
                f"{timeout.sock_read:g} s without output)"
            )
        else:
            total = timeout.total if timeout is not None else None
            detail = f"exceeded the time limit{limit}" + (f" ({total:g} s)" if total else "")
        return RequestError(
            408,
            f"The request {detail}; the upstream request was aborted.",
            code="timeout",
            reason="timeout",
        )

    def _replica_failed(self, replica: Replica | None, model: str, reason: str) -> None:
        self.metrics.errors.labels(model, reason).inc()
        if replica is not None and self.replica_set.failed(replica):
            self.metrics.cooldowns.labels(replica.model, replica.replica_id).inc()


def _response_like(
    status: int, content_type: str, charset: str | None, label: str, extra: dict | None
) -> web.StreamResponse:
    """The response to the client, with the upstream's status and type and our headers."""
    response = web.StreamResponse(status=status)
    response.content_type = content_type
    if charset:
        response.charset = charset
    response.headers[REPLICA_HEADER] = label
    if extra:
        response.headers.update(extra)
    return response


def _event_boundary(last_chunk: bytes) -> bytes:
    """What ends an SSE event the upstream cut off mid-way, so that ours stands alone."""
    if not last_chunk or last_chunk.endswith(b"\n\n"):
        return b""
    return b"\n" if last_chunk.endswith(b"\n") else b"\n\n"


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
            413: f"Request body too large (limit {request.app._client_max_size} bytes).",
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
