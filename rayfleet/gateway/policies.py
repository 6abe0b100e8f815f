"""Every gateway policy, compiled once from fleet.yaml, applied to each request once.

``Policies.from_fleet(config)`` builds the key table, limits per model, routes,
fallback providers, priority classes and each model's routing (its replica policy,
built by the app). Per request the app calls
``authenticate`` (before reading the body), then ``admit``, which returns an
``Admission`` (admission.py) saying where the request goes and with which body, or raises a
``RequestError``. The order follows DESIGN.md: auth, limits, route, context
length, key quota, priority. ``Policies.plain(models)`` is the gateway without
any policy (no keys, no routes, no caps beyond the engine's own).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import TYPE_CHECKING
from zoneinfo import ZoneInfo

from rayfleet.gateway.admission import Admission, FallbackWhen, PriorityClass, RequestFacts
from rayfleet.gateway.auth import ApiKey, KeyTable
from rayfleet.gateway.errors import RequestError
from rayfleet.gateway.fallback import Provider, first_provider
from rayfleet.gateway.limits import (
    Limits,
    check_body_size,
    check_context,
    check_request,
    num_items,
    requested_max_tokens,
)
from rayfleet.gateway.rules import Route
from rayfleet.gateway.tokens import TokenCounter, context_length
from rayfleet.gateway.validate import ParsedRequest

if TYPE_CHECKING:
    from rayfleet.config import FleetConfig, RoutingConfig
    from rayfleet.gateway.shared_state import QuotaCells

Clock = Callable[[], datetime]
Headers = Mapping[str, str]


@dataclass
class Policies:
    models: list[str]
    keys: KeyTable = field(default_factory=lambda: KeyTable([]))
    limits: dict[str, Limits] = field(default_factory=dict)
    default_limits: Limits = field(default_factory=Limits)
    contexts: dict[str, int] = field(default_factory=dict)
    routes: dict[str, Route] = field(default_factory=dict)
    providers: list[Provider] = field(default_factory=list)
    fallback: FallbackWhen = field(default_factory=FallbackWhen)
    classes: dict[str, PriorityClass] = field(default_factory=dict)
    default_class: str | None = None
    priority_header: str = "x-rayfleet-priority"
    open_metrics: bool = True
    open_health: bool = True
    zone: ZoneInfo = field(default_factory=lambda: ZoneInfo("UTC"))
    clock: Clock = field(default=lambda: datetime.now().astimezone())
    counter: TokenCounter = field(default_factory=lambda: TokenCounter({}))
    max_consecutive_failures: int = 1
    cooldown_s: float = 5.0
    max_in_flight: int | None = None  # per gateway process; None: what open files allow
    routing: dict[str, RoutingConfig] = field(default_factory=dict)  # least_load if absent
    # A model's vLLM --api-key (its engine args), sent to its replicas in place of the
    # client's Authorization, which is never forwarded.
    replica_keys: dict[str, str] = field(default_factory=dict)

    # -- building ----------------------------------------------------------------------

    @classmethod
    def plain(cls, models: list[str]) -> Policies:
        return cls(models=list(models), default_limits=Limits(check_context=False))

    @classmethod
    def from_fleet(
        cls, fleet: FleetConfig, *, clock: Clock | None = None, quotas: QuotaCells | None = None
    ) -> Policies:
        """Compile ``fleet.gateway`` against ``fleet.models``. Reads key files and provider
        keys from the environment (ConfigError when missing); loads no tokenizer yet.
        ``quotas``: the keys' quota cells that the gateway's workers share."""
        gw = fleet.gateway
        models = [m.name for m in fleet.models]
        routes = {r.name: Route.from_config(r) for r in gw.routes}
        limits = {
            name: Limits.resolve(gw.limits, gw.model_limits.get(name))
            for name in [*models, *routes]
        }
        contexts = {}
        for m in fleet.models:
            length = context_length(m.source, m.engine_args)
            if length is not None:
                contexts[m.name] = length
        policies = cls(
            models=models,
            keys=KeyTable.from_config(gw.api_keys, quotas),
            limits=limits,
            default_limits=Limits.resolve(gw.limits),
            contexts=contexts,
            routes=routes,
            providers=[Provider.from_config(p) for p in gw.fallback.providers],
            fallback=FallbackWhen(
                gw.fallback.on_no_replica, gw.fallback.on_failure, gw.fallback.max_queue_depth
            ),
            classes={
                c.name: PriorityClass(c.name, c.priority, c.timeout_s, c.stream_idle_timeout_s)
                for c in gw.priority_classes
            },
            default_class=gw.default_priority_class,
            priority_header=gw.priority_header,
            open_metrics=gw.open_metrics,
            open_health=gw.open_health,
            zone=ZoneInfo(gw.timezone),
            counter=TokenCounter({m.name: m.source for m in fleet.models}),
            max_consecutive_failures=gw.replica_protection.max_consecutive_failures,
            cooldown_s=gw.replica_protection.cooldown_s,
            max_in_flight=gw.max_in_flight,
            routing={m.name: m.routing for m in fleet.models},
            replica_keys={
                m.name: str(m.engine_args["api_key"])
                for m in fleet.models
                if m.engine_args.get("api_key")
            },
        )
        if clock is not None:
            policies.clock = clock
        return policies

    @property
    def names(self) -> list[str]:
        """What clients may send as ``model``: models, then routes."""
        return [*self.models, *self.routes]

    def tokenizers_needed(self) -> list[str]:
        """Models whose tokenizer a policy may use; load them once at start."""
        needed = {
            m
            for m in self.models
            if m in self.contexts and self.limits.get(m, self.default_limits).check_context
        }
        for route in self.routes.values():
            needed |= {r.tokenizer for r in route.rules if r.counts_tokens and r.tokenizer}
        return sorted(needed & set(self.models))

    # -- per request -------------------------------------------------------------------

    def authenticate(self, headers: Headers) -> ApiKey | None:
        if not self.keys:
            return None
        return self.keys.authenticate(headers.get("Authorization"))

    def admit(
        self,
        path: str,
        parsed: ParsedRequest,
        num_bytes: int,
        headers: Headers,
        usable: Callable[[str], bool],
        key: ApiKey | None = None,
    ) -> Admission:
        requested, body = parsed.model, parsed.body
        self._check_name(requested)
        if key is not None:
            key.check_model(requested)
        limits = self.limits.get(requested, self.default_limits)
        check_body_size(limits, num_bytes, requested)
        admission = Admission(requested=requested, body=body, key=None)
        admission.clamped = admission.changed = check_request(
            limits, body, num_items(path, body), requested
        )
        facts = RequestFacts(path, body, self)
        admission.priority_class = self._priority_class(key, headers)
        facts.priority_class = admission.priority_class.name if admission.priority_class else None

        route = self.routes.get(requested)
        if route is None:
            admission.model = requested
        else:
            self._follow(route, admission, facts, usable)

        target = admission.model
        max_tokens = requested_max_tokens(body)
        if target is not None:
            self._check_context(target, facts, max_tokens)
        if key is not None:
            counted_with = target if target is not None else (route.tokenizer if route else None)
            admission.charged_tokens = self._charge(key, facts, counted_with, max_tokens, limits)
            admission.key = key
        priority_class = admission.priority_class
        if priority_class is not None and priority_class.priority != 0 and target is not None:
            body["priority"] = priority_class.priority
            admission.changed = True
        return admission

    def _follow(
        self,
        route: Route,
        admission: Admission,
        facts: RequestFacts,
        usable: Callable[[str], bool],
    ) -> None:
        """Send ``admission`` where the first rule of ``route`` that holds says."""
        requested = admission.requested
        decision = route.decide(facts, usable)
        if decision is None:
            raise RequestError(
                503,
                f"No rule of route '{requested}' has a healthy target right now, and "
                "the route has no fallback. Retry shortly, or check `rayfleet status`.",
                code="no_route_target",
                reason="no_route_target",
            )
        admission.route_rule = decision.rule
        if decision.provider is not None:
            admission.provider = next(p for p in self.providers if p.name == decision.provider)
            admission.provider_model = admission.provider.model_for([requested])
            if admission.provider_model is None:
                raise RequestError(
                    503,
                    f"Fallback provider '{decision.provider}' maps no model for '{requested}'.",
                    code="no_provider_model",
                    reason="no_provider_model",
                )
        else:
            admission.model = decision.model
            admission.body["model"] = decision.model
            admission.changed = True

    def fallback_for(self, admission: Admission) -> tuple[Provider, str] | None:
        names = [admission.requested]
        if admission.model and admission.model != admission.requested:
            names.insert(0, admission.model)
        return first_provider(self.providers, names)

    def _check_name(self, model: str) -> None:
        if model in self.models or model in self.routes:
            return
        raise RequestError(
            404,
            f"The model '{model}' does not exist. Models served: {', '.join(self.names)}.",
            param="model",
            code="model_not_found",
            reason="unknown_model",
        )

    def _priority_class(self, key: ApiKey | None, headers: Headers) -> PriorityClass | None:
        if not self.classes:
            return None
        name = key.priority_class if key is not None else None
        if name is None:
            name = headers.get(self.priority_header)
            if name is not None and name not in self.classes:
                raise RequestError(
                    400,
                    f"Unknown priority class '{name}' in {self.priority_header}; "
                    f"classes: {', '.join(self.classes)}.",
                    param=self.priority_header,
                    code="unknown_priority_class",
                    reason="bad_request",
                )
        name = name or self.default_class
        return self.classes.get(name) if name else None

    def _check_context(self, model: str, facts: RequestFacts, max_tokens: int | None) -> None:
        context = self.contexts.get(model)
        if context is None or not self.limits.get(model, self.default_limits).check_context:
            return
        bound = facts.prompt.max_tokens_bound()
        if bound + (max_tokens or 0) <= context and bound < context:
            return  # cannot exceed whatever the tokenizer says
        if not self.counter.has_tokenizer(model):
            return
        check_context(model, context, facts.prompt_tokens(model), max_tokens)

    def _charge(
        self,
        key: ApiKey,
        facts: RequestFacts,
        model: str | None,
        max_tokens: int | None,
        limits: Limits,
    ) -> int:
        """Count the request against ``key``'s quota (429 when over it); the tokens
        charged."""
        num_tokens = 0
        if key.quota.counts_tokens:
            output = max_tokens or limits.max_tokens or self.contexts.get(model or "", 0)
            num_tokens = facts.prompt_tokens(model) + output
        key.quota.admit(num_tokens, time.monotonic())
        return num_tokens
