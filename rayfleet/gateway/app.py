"""The OpenAI-compatible gateway: one endpoint in front of every replica of every model.

This module is the HTTP surface: the routes, the small endpoints and the first steps of
the data path; dispatch.py takes an admitted request the rest of the way::

    client --POST /v1/chat/completions--> Gateway._proxy
        auth                            API key from 'Authorization: Bearer' (401)
        InFlightLimit.enter             the process's requests in flight (503 + Retry-After;
                                        overload.py)
        read body once -> parse_request (model, stream, field types; 400 on bad input)
        Policies.admit                  model or route known (404), key may use it (403),
                                        caps: body bytes (413), max_tokens (400 or clamp),
                                        n, messages; priority class; route rules pick a
                                        model or a provider (x-rayfleet-route); context
                                        length (400); key quotas (429 + Retry-After)
        Dispatcher.dispatch             replica pick, send, retry, fallback (dispatch.py)

Replica membership comes from ``source``, an async callable returning registry
entries, polled every ``poll_interval_s``. ``status_extra``, when given, is an async
callable whose dict is merged into ``GET /rayfleet/status`` (nodes, Serve state).
``relay=False`` sends replica requests through aiohttp's client instead of the relay
(benchmarks/gateway_cpu.py compares the two).

Endpoints: ``/v1/models``, ``/v1/chat/completions``, ``/v1/completions``,
``/v1/embeddings``, ``/health``, ``/metrics`` (with each replica's vLLM gauges, read in a
task of their own: replica_gauges.py) and ``/rayfleet/status``.
Every response carries ``x-rayfleet-replica``: the replica that served it,
``fallback:<provider>``, or ``gateway`` when the gateway answered itself.
Serve it with server.py's ``start_gateway``: the API routes through the gateway's own
front (front.py, ``front_routes``), everything else through aiohttp's server; a client
that goes away cancels its handler, which aborts the upstream request.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any

from aiohttp import web

from rayfleet.gateway import access_log
from rayfleet.gateway.dispatch import Dispatcher
from rayfleet.gateway.errors import RequestError
from rayfleet.gateway.front import FrontHandler, FrontRequest
from rayfleet.gateway.http_errors import (
    IDLE_TIMEOUT_S,
    json_http_errors,
    read_body,
)
from rayfleet.gateway.info_endpoints import InfoEndpoints
from rayfleet.gateway.metrics import GatewayMetrics
from rayfleet.gateway.openapi import OPENAPI_PATH
from rayfleet.gateway.overload import InFlightLimit
from rayfleet.gateway.policies import Policies
from rayfleet.gateway.replica_gauges import PERIOD_S, ReplicaGauges
from rayfleet.gateway.replicas import Entry, ReplicaSet
from rayfleet.gateway.routing import build_replica_policy, observe_engine
from rayfleet.gateway.upstream import TimeLimits
from rayfleet.gateway.validate import INPUT_FIELDS, parse_request

log = logging.getLogger("rayfleet.gateway")

EntrySource = Callable[[], Awaitable[list[Entry]]]
StatusExtra = Callable[[], Awaitable[dict[str, Any]]]
MetricsPeers = Callable[[], Awaitable[list[bytes]]]
Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
Route = tuple[str, str, Handler]  # (method, path, handler): the fleet's admin endpoints

_DEFAULT_MAX_BODY_BYTES = 64 * 1024**2
_GC_YOUNG_THRESHOLD = 20_000  # net allocations between young-generation collections


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
        hold_s: dict[str, float] | None = None,
        extra_routes: list[Route] | None = None,
        replica_metrics_period_s: float | None = PERIOD_S,
        body_timeout_s: float = 60.0,
        idle_timeout_s: float = IDLE_TIMEOUT_S,
        control: Handler | None = None,
        metrics_peers: MetricsPeers | None = None,
        http_front: bool = True,
    ):
        self.policies = policies if policies is not None else Policies.plain(models)
        self.replica_set = ReplicaSet(
            models,
            cooldown_s=cooldown_s if cooldown_s is not None else self.policies.cooldown_s,
            max_consecutive_failures=self.policies.max_consecutive_failures,
        )
        self.metrics = GatewayMetrics()
        # Each replica's vLLM gauges on our /metrics (None: not read).
        self.replica_gauges = (
            ReplicaGauges(
                self.replica_set,
                self.metrics.registry,
                period_s=replica_metrics_period_s,
                on_stats=lambda r, s: observe_engine(
                    self.dispatcher.replica_policies.get(r.model),
                    r,
                    s.kv_cache_tokens,
                    s.start_time,
                ),
            )
            if replica_metrics_period_s is not None
            else None
        )
        self.dispatcher = Dispatcher(
            self.replica_set,
            self.policies,
            self.metrics,
            TimeLimits(total_s=request_timeout_s, connect_s=connect_timeout_s),
            {
                m: build_replica_policy(self.policies.routing.get(m), model=m, metrics=self.metrics)
                for m in models
            },
            relay=relay,
            hold_s=hold_s,
        )
        self.extra_routes = list(extra_routes or [])
        # gateway.workers (workers.py): a worker passes /metrics and /rayfleet/status
        # asked over TCP to the fleet process (``control``), whose /metrics folds in
        # every worker's (``metrics_peers``).
        self.control = control
        self.metrics_peers = metrics_peers
        self.response_headers: dict[str, str] = {}  # on every answer (x-rayfleet-worker)
        self.source = source
        self.status_extra = status_extra
        self.poll_interval_s = poll_interval_s
        self.body_timeout_s = body_timeout_s  # a body trickled slower is a 408
        self.idle_timeout_s = idle_timeout_s  # no whole request head by then: closed
        self.http_front = http_front  # the API routes through front.py (server.py)
        self.max_body_bytes = self.policies.default_limits.max_body_bytes or (
            _DEFAULT_MAX_BODY_BYTES
        )
        self.in_flight = InFlightLimit(self.policies.max_in_flight)
        self._poller: asyncio.Task[None] | None = None
        self._replica_reader: asyncio.Task[None] | None = None

    # -- application -----------------------------------------------------------------

    def build_app(self) -> web.Application:
        app = web.Application(
            middlewares=[json_http_errors(self.max_body_bytes)],
            client_max_size=self.max_body_bytes,
        )
        access_log.install(app)  # x-request-id on every answer; a JSON line per request
        info = InfoEndpoints(self)
        app.router.add_get("/v1/models", info.list_models)
        for path in INPUT_FIELDS:
            app.router.add_post(path, self._proxy_for(path))
        app.router.add_get("/health", info.health)
        app.router.add_get("/metrics", info.prometheus)
        app.router.add_get("/rayfleet/status", info.status)
        app.router.add_get(OPENAPI_PATH, info.openapi)
        for method, path, handler in self.extra_routes:
            app.router.add_route(method, path, handler)
        if self.response_headers:
            app.on_response_prepare.append(self._stamp)
        app.on_startup.append(self._start)
        app.on_cleanup.append(self._stop)
        return app

    def front_routes(self) -> dict[str, FrontHandler]:
        """The routes front.py answers itself, with the app's middleware that matters to
        them: the access log (json_http_errors only rewrites aiohttp's own exceptions,
        which a front request never meets)."""

        def route(path: str) -> FrontHandler:
            proxy = self._proxy_for(path)

            async def handler(request: FrontRequest) -> web.StreamResponse:
                return await access_log.middleware(request.as_aiohttp(), proxy)

            return handler

        return {path: route(path) for path in INPUT_FIELDS}

    async def _stamp(self, _request: web.Request, response: web.StreamResponse) -> None:
        response.headers.update(self.response_headers)

    async def _start(self, _app: web.Application) -> None:
        await self.dispatcher.start()
        needed = self.policies.tokenizers_needed()
        if needed:
            await asyncio.to_thread(self.policies.counter.load, needed)
        if self.source is not None:
            await self.refresh()
            self._poller = asyncio.create_task(self._poll_forever())
        if self.replica_gauges is not None:
            self._replica_reader = asyncio.create_task(self.replica_gauges.run())
        # What the process holds once started (modules, config, Ray's client in the fleet
        # process) lives as long as it does: out of the collector's way, so that its
        # full collections scan only what requests leave behind.
        gc.freeze()
        # A request's objects are nearly all freed by reference counting, yet at the
        # default threshold (700 net allocations) the youngest generation was collected
        # every ~75 requests, each pass walking the requests in flight: 325 ms of
        # collections in a 35 s run at 1,200 req/s, 39 ms at 20,000 (README).
        gc.set_threshold(_GC_YOUNG_THRESHOLD, *gc.get_threshold()[1:])

    async def _stop(self, _app: web.Application) -> None:
        for task in (self._poller, self._replica_reader):
            if task is not None:
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task
        await self.dispatcher.close()

    async def reconfigure(
        self, models: list[str], policies: Policies, hold_s: dict[str, float]
    ) -> None:
        """Serve ``models`` under ``policies`` from now on (``rayfleet apply``). A model
        kept keeps its replica policy and what it learned; a new one gets its own."""
        needed = policies.tokenizers_needed()
        if needed:
            await asyncio.to_thread(policies.counter.load, needed)
        kept = self.dispatcher.replica_policies
        replica_policies = {
            m: kept.get(m)
            or build_replica_policy(policies.routing.get(m), model=m, metrics=self.metrics)
            for m in models
        }
        self.dispatcher.replica_policies = replica_policies
        self.dispatcher.attempts.feedback.policies = replica_policies
        self.policies = self.dispatcher.policies = policies
        self.in_flight.configure(policies.max_in_flight)
        self.dispatcher.hold_s = dict(hold_s)
        self.replica_set.set_models(models)

    async def refresh(self) -> None:
        """Pull replica membership from the source once."""
        if self.source is None:
            return
        try:
            entries = await self.source()
        except Exception as exc:  # noqa: BLE001
            # The registry being briefly away must not stop routing.
            log.warning("could not read the replica registry: %s", exc)
            return
        self.replica_set.update(entries)
        for model in self.replica_set.models:
            for state, count in self.replica_set.states(model).items():
                self.metrics.replicas.labels(model, state).set(count)

    async def _poll_forever(self) -> None:
        while True:
            await asyncio.sleep(self.poll_interval_s)
            try:
                await self.refresh()
            except Exception:  # membership must keep following the registry
                log.exception("replica membership update failed")

    # -- the data path ---------------------------------------------------------------

    def _proxy_for(self, path: str) -> Handler:
        async def handler(request: web.Request) -> web.StreamResponse:
            return await self._proxy(request, path)

        return handler

    async def _proxy(self, request: web.Request, path: str) -> web.StreamResponse:
        started = time.perf_counter()
        policies = self.policies
        try:
            key = policies.authenticate(request.headers)
            if key is not None:
                key.quota.refuse_early(time.monotonic())
            self.in_flight.enter()  # 503 + Retry-After over the process's limit
        except RequestError as exc:
            return self.dispatcher.refuse(exc, "")
        try:
            try:
                raw = await self._body(request)
                parsed = parse_request(path, raw)
                admission = policies.admit(
                    path, parsed, len(raw), request.headers, self._usable, key
                )
            except RequestError as exc:
                return self.dispatcher.refuse(exc, "")
            try:
                return await self.dispatcher.dispatch(request, path, raw, admission, started)
            finally:
                admission.release()
        finally:
            self.in_flight.leave()

    async def _body(self, request: web.Request) -> bytes:
        if isinstance(request, FrontRequest):  # its size was checked by front.py
            return await request.body_within(self.body_timeout_s)
        self._check_declared_size(request)
        return await read_body(request, self.body_timeout_s)

    def _check_declared_size(self, request: web.Request) -> None:
        cap = self.max_body_bytes
        declared = request.content_length  # parsed from the header at each reading
        if declared is not None and declared > cap:
            raise RequestError(
                413,
                f"Request body is {declared} bytes; the limit is {cap} bytes.",
                code="body_too_large",
                reason="body_too_large",
                close=True,  # refused before the body is read: do not read it
            )

    def num_waiting(self, model: str) -> int:
        """Requests held for ``model`` now, by this process or, under gateway.workers,
        by every worker (the shared counts)."""
        slot = self.replica_set.waiting_slots.get(model)
        if self.replica_set.shared is not None and slot is not None:
            return self.replica_set.shared.total(slot)
        return self.dispatcher.waiting.get(model, 0)

    def _usable(self, model: str) -> bool:
        """Whether a route may send a request to ``model`` now."""
        return bool(self.replica_set.candidates(model))
