"""One admitted request's journey: pick a replica, send, retry once elsewhere, then fall back.

Data flow (app.py has admitted the request; policies.py decided where it may go)::

    Dispatcher.dispatch(request, path, raw, admission, started)
        a route rule chose a provider     -> _to_provider
        _to_fleet:
            ReplicaSet.candidates(model)   healthy, not draining, not tried yet
            ReplicaPolicy.pick             per model; LeastLoad: fewest in flight, ties
                                           round-robin (replica_policy.py, least_load.py)
            no replica of an elastic model  -> held until one serves (hold_s), unless
                                           a provider takes it (scale from zero)
            none, and no provider allowed  -> a replica cooling down after a failure
                                           (ReplicaSet.cooling), rather than a 503
            first pick over the queue depth          -> fallback provider
            Attempts.run(replica)          the relay (relay_pool.py) for http:// replicas,
                                           aiohttp's client otherwise (upstream.py)
                failure before the first byte -> Unanswered: counted against the replica
                                                 (out of rotation after N in a row), one
                                                 retry on another replica
                failure after the first byte  -> the stream ends with an error event
                client disconnects            -> the handler is cancelled, the upstream
                                                 connection is closed, vLLM aborts
            no replica, or both failed    -> fallback provider when allowed, else 503/502;
                                           the provider failing too -> 503
        _to_provider: Attempts.run(provider) through aiohttp's client; a provider taking
        the overflow of the queue depth that fails before responding leaves the request
        to the replica picked, and one a route rule chose -> 502

``Attempts.run`` (attempt.py) is the one accounting wrapper around any upstream. The
time limits of an attempt are the gateway's (or the provider's) own, narrowed by the
request's priority class (its total and its idle limit).
"""

from __future__ import annotations

from collections.abc import Mapping

from aiohttp import web

from rayfleet.gateway.access_log import REQUEST_ID_HEADER, note_admission, request_id
from rayfleet.gateway.admission import Admission
from rayfleet.gateway.attempt import (
    Attempt,
    Attempts,
    Journey,
    Target,
    Unanswered,
    narrowed_by_class,
)
from rayfleet.gateway.errors import RequestError
from rayfleet.gateway.fallback import Provider
from rayfleet.gateway.metrics import GatewayMetrics
from rayfleet.gateway.policies import Policies
from rayfleet.gateway.relay_pool import RelayPool
from rayfleet.gateway.replica_policy import ReplicaPolicy, RequestInfo
from rayfleet.gateway.replicas import Replica, ReplicaSet
from rayfleet.gateway.upstream import AiohttpUpstream, TimeLimits, Upstream

ROUTE_HEADER = "x-rayfleet-route"
_FORWARDED_REQUEST_HEADERS = ("x-request-id",)
_MAX_REPLICAS_TRIED = 2


class Dispatcher:
    def __init__(
        self,
        replica_set: ReplicaSet,
        policies: Policies,
        metrics: GatewayMetrics,
        limits: TimeLimits,
        replica_policies: Mapping[str, ReplicaPolicy],
        *,
        relay: bool = True,
        hold_s: Mapping[str, float] | None = None,
    ):
        self.replica_set = replica_set
        # Models whose capacity comes and goes (autoscaling, windows): a request that finds
        # no replica waits up to this long for one instead of a 503.
        self.hold_s = dict(hold_s or {})
        self.waiting: dict[str, int] = {}  # requests held now, per model (scaling signal)
        self.policies = policies
        self.metrics = metrics
        self.limits = limits
        self.replica_policies = replica_policies
        self.attempts = Attempts(replica_set, metrics, replica_policies)
        self.refuse = self.attempts.refuse  # an answer of the gateway's own, counted
        self.providers = AiohttpUpstream()
        # Replica responses through relay.py (None: through aiohttp's client, as providers).
        self.relay = RelayPool() if relay else None

    async def start(self) -> None:
        await self.providers.start()

    async def close(self) -> None:
        await self.providers.close()
        if self.relay is not None:
            self.relay.close()

    # -- the journey ------------------------------------------------------------------

    async def dispatch(
        self, request: web.Request, path: str, raw: bytes, admission: Admission, started: float
    ) -> web.StreamResponse:
        """Send an admitted request to the fleet, falling back to a provider when allowed."""
        requested = admission.requested
        note_admission(request, admission)
        if admission.key is not None:
            self.metrics.key_requests.labels(admission.key.name).inc()
        if admission.clamped:
            self.metrics.clamped.labels(requested).inc()
        extra = {}
        if admission.route_rule is not None:
            extra[ROUTE_HEADER] = admission.route_rule
            self.metrics.routes.labels(requested, admission.route_rule, admission.destination).inc()
        journey = Journey(request, path, raw, admission, started, extra)
        if admission.provider is not None and admission.provider_model is not None:
            provider = admission.provider
            result = await self._to_provider(journey, provider, admission.provider_model, "rule")
            if isinstance(result, Unanswered):
                error = RequestError(
                    502,
                    f"Fallback provider '{provider.name}' failed before responding. "
                    "Retry the request.",
                    code="upstream_failed",
                    reason="fallback_failed",
                )
                return self.attempts.refuse(error, admission.requested)
            return result
        assert admission.model is not None  # admit() names a model or a provider
        return await self._to_fleet(journey, admission.model)

    async def _to_fleet(self, journey: Journey, model: str) -> web.StreamResponse:
        admission = journey.admission
        when = self.policies.fallback
        body = admission.fleet_body(journey.raw)
        headers = self._upstream_headers(journey.request, model)
        limits = self._limits_for(admission, self.limits)
        info = RequestInfo(journey.path, model, admission.body, journey.request.headers)
        policy = self.replica_policies[model]
        tried: list[str] = []
        held = False
        while len(tried) < _MAX_REPLICAS_TRIED:
            replica = policy.pick(info, self.replica_set.candidates(model, tried))
            if replica is None and not tried and not held:
                held = True  # once per request: the hold is its whole wait
                if await self._held(journey, model):
                    continue
            if replica is None and not self._fallback_allowed(journey, tried):
                # Every replica left is cooling down and no provider would take the request:
                # one that failed a moment ago is a better bet than a certain error. (Seen
                # here: one connect timeout to a busy single replica turned every request
                # of its 5 s cool-down into a 503.)
                replica = policy.pick(info, self.replica_set.cooling(model, tried))
            if replica is None:
                break
            if (
                not tried
                and when.max_queue_depth is not None
                and replica.num_inflight >= when.max_queue_depth
            ):
                fallback = self.policies.fallback_for(admission)
                if fallback is not None:
                    overflow = await self._to_provider(journey, *fallback, "queue_depth")
                    if not isinstance(overflow, Unanswered):
                        return overflow
                    # The provider is down: the replica, busy as it is, still serves.
            if tried:
                self.metrics.retries.labels(model).inc()
            tried.append(replica.replica_id)
            target = Target(replica.url + journey.path, replica.replica_id, model, replica, info)
            upstream = self._upstream_for(replica)
            result = await self.attempts.run(journey, upstream, target, body, headers, limits)
            if not isinstance(result, Unanswered):
                return result
        return await self._unserved(journey, model, tried)

    async def _held(self, journey: Journey, model: str) -> bool:
        """Hold a request while ``model`` has no replica (scale from zero, a window, a
        replacement starting), unless a provider takes it at once; True when a replica
        appeared in time."""
        hold_s = self.hold_s.get(model, 0.0)
        if hold_s <= 0 or (
            self.policies.fallback.on_no_replica
            and self.policies.fallback_for(journey.admission) is not None
        ):
            return False
        self.waiting[model] = self.waiting.get(model, 0) + 1
        self.replica_set.count_waiting(model, 1)
        try:
            return await self.replica_set.wait_for_candidates(model, hold_s)
        finally:
            self.waiting[model] -= 1
            self.replica_set.count_waiting(model, -1)

    async def _unserved(self, journey: Journey, model: str, tried: list[str]) -> web.StreamResponse:
        """No replica answered: the fallback provider when allowed, else an error."""
        fallback = self._fallback_for(journey, tried)
        if fallback is not None:
            reason = "failure" if tried else "no_replica"
            result = await self._to_provider(journey, *fallback, reason)
            if not isinstance(result, Unanswered):
                return result
            if not tried:
                journey.admission.refund()  # nothing was done for it: the key is not charged
            what = f"failed (tried {', '.join(tried)})" if tried else "is available"
            error = RequestError(
                503,
                f"No replica of model '{model}' {what}, and fallback provider "
                f"'{fallback[0].name}' failed before responding too. Retry shortly, or "
                "check `rayfleet status` and the provider.",
                code="no_healthy_replica",
                reason="fallback_failed",
            )
            return self.attempts.refuse(error, model)
        if tried:
            error = RequestError(
                502,
                f"The replicas of model '{model}' failed before responding "
                f"(tried {', '.join(tried)}). Retry the request.",
                code="upstream_failed",
                reason="upstream_failed",
            )
        else:
            journey.admission.refund()  # nothing was done for it: the key is not charged
            error = RequestError(
                503,
                f"No healthy replica of model '{model}' is available right now. "
                "Retry shortly, or check `rayfleet status`.",
                code="no_healthy_replica",
                reason="no_replica",
            )
        return self.attempts.refuse(error, model)

    def _fallback_for(self, journey: Journey, tried: list[str]) -> tuple[Provider, str] | None:
        """The provider that takes a request the fleet did not serve (after ``tried``
        failed, or with no replica at all), when the fallback rules allow one."""
        when = self.policies.fallback
        allowed = when.on_failure if tried else when.on_no_replica
        return self.policies.fallback_for(journey.admission) if allowed else None

    def _fallback_allowed(self, journey: Journey, tried: list[str]) -> bool:
        return self._fallback_for(journey, tried) is not None

    async def _to_provider(
        self, journey: Journey, provider: Provider, provider_model: str, reason: str
    ) -> Attempt:
        """Send the request to ``provider``: its answer, or ``Unanswered`` when it failed
        before responding (each caller knows what is left to try)."""
        admission = journey.admission
        self.metrics.fallbacks.labels(admission.requested, provider.name, reason).inc()
        body = provider.body_for(admission.body, provider_model)
        limits = self._limits_for(admission, provider.limits)
        target = Target(provider.url(journey.path), provider.label, admission.requested)
        return await self.attempts.run(
            journey, self.providers, target, body, provider.headers, limits
        )

    # -- helpers ----------------------------------------------------------------------

    def _upstream_for(self, replica: Replica) -> Upstream:
        if self.relay is not None and RelayPool.handles(replica.url):
            return self.relay
        return self.providers

    def _upstream_headers(self, request: web.Request, model: str) -> dict[str, str]:
        """What a replica is sent: never the client's ``Authorization`` (a gateway key is
        for the gateway, and without gateway keys a client's token is nobody's business
        upstream), but the model's own vLLM ``api_key`` when its engine args set one."""
        headers = {"Content-Type": "application/json"}
        for name in _FORWARDED_REQUEST_HEADERS:
            if name in request.headers:
                headers[name] = request.headers[name]
        replica_key = self.policies.replica_keys.get(model)
        if replica_key is not None:
            headers["Authorization"] = f"Bearer {replica_key}"
        headers[REQUEST_ID_HEADER] = request_id(request)  # the client's, or the one we made
        return headers

    def _limits_for(self, admission: Admission, base: TimeLimits) -> TimeLimits:
        """``base`` narrowed by the request's priority class, when it sets limits."""
        priority_class = admission.priority_class
        if priority_class is None or not narrowed_by_class(admission):
            return base
        return TimeLimits(
            total_s=min(priority_class.timeout_s or base.total_s, base.total_s),
            connect_s=base.connect_s or self.limits.connect_s,
            idle_s=priority_class.stream_idle_timeout_s,
        )
