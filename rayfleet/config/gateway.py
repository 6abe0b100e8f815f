"""fleet.yaml's ``gateway`` section: the endpoint and the policies it applies to requests.

``GatewayConfig`` is the section; each policy has a model of its own: ``LimitsConfig``
(request caps), ``RouteConfig`` with its ordered ``RuleConfig``s (and ``TimeWindow``; all
three in rayfleet/config/route_rules.py), ``FallbackConfig`` with its ``ProviderConfig``s,
``PriorityClassConfig``, ``ApiKeyConfig`` and ``ReplicaProtectionConfig``.
``GatewayConfig`` checks that every class and provider its rules, keys and defaults name
is defined in the section; that every model a route or a limit names is in the fleet is
checked by ``FleetConfig`` (rayfleet/config/fleet.py).
The gateway reads these models through ``rayfleet.gateway.policies.Policies.from_fleet``.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field, field_validator, model_validator

from rayfleet.config.base import StrictModel
from rayfleet.config.route_rules import RouteConfig


class LimitsConfig(StrictModel):
    """Caps on what one request may ask for (OWASP API4). Unset fields impose no cap."""

    max_tokens: int | None = Field(
        default=None,
        ge=1,
        description="Largest max_tokens (or max_completion_tokens) a request may ask for.",
    )
    max_tokens_action: Literal["reject", "clamp"] = Field(
        default="reject",
        description="Over max_tokens: 'reject' with a 400 stating the cap, or "
        "'clamp' the request down to the cap.",
    )
    max_n: int | None = Field(default=None, ge=1, description="Largest 'n' (choices per request).")
    max_body_bytes: int | None = Field(
        default=None, ge=1, description="Largest request body in bytes; larger is a 413."
    )
    max_messages: int | None = Field(
        default=None,
        ge=1,
        description="Most chat messages per request (or prompts per completion).",
    )
    check_context: bool = Field(
        default=True,
        description="Refuse a request whose prompt plus max_tokens exceeds the model's "
        "context length with a 400 giving both numbers, before it reaches the engine.",
    )


class ProviderConfig(StrictModel):
    """An external OpenAI-compatible provider used as the degradation channel."""

    name: str = Field(min_length=1, description="Named in rules as 'fallback:<name>'.")
    base_url: str = Field(
        min_length=1, description="The provider's OpenAI base URL, e.g. https://api.example.com/v1."
    )
    api_key_env: str | None = Field(
        default=None,
        description="Environment variable holding the provider's API key (sent as Bearer).",
    )
    models: dict[str, str] = Field(
        default_factory=dict,
        description="Model or route name clients send -> the provider's model name. "
        "Only names listed here (or any, with default_model) fall back to this provider.",
    )
    default_model: str | None = Field(
        default=None, description="Provider model for names not in 'models'."
    )
    timeout_s: float = Field(
        default=600.0, gt=0, description="Longest a provider request may take."
    )

    @field_validator("base_url")
    @classmethod
    def _http_url(cls, value: str) -> str:
        if not value.startswith(("http://", "https://")):
            raise ValueError(f"'{value}' is not an http(s) URL")
        return value.rstrip("/")


class FallbackConfig(StrictModel):
    """When requests go to a provider instead of the fleet."""

    providers: list[ProviderConfig] = Field(
        default_factory=list, description="In order of preference."
    )
    on_no_replica: bool = Field(default=True, description="When a model has no healthy replica.")
    on_failure: bool = Field(
        default=True,
        description="When a request failed before its first byte after the in-fleet retry.",
    )
    max_queue_depth: int | None = Field(
        default=None,
        ge=1,
        description="When every healthy replica already has this many requests in flight.",
    )


class PriorityClassConfig(StrictModel):
    """A class of traffic: vLLM priority (lower runs first, as in vLLM) and its timeouts."""

    name: str = Field(min_length=1, description="Class name, used by keys, rules and the header.")
    priority: int = Field(description="vLLM per-request priority; lower is served first.")
    timeout_s: float | None = Field(
        default=None,
        gt=0,
        description="Longest a request may take end to end; then 408 (or an error "
        "event ending the stream) and the upstream request is aborted.",
    )
    stream_idle_timeout_s: float | None = Field(
        default=None,
        gt=0,
        description="Longest gap between two bytes of a response; then as timeout_s.",
    )


class ApiKeyConfig(StrictModel):
    """A client key: who it is, what it may use, how much."""

    name: str = Field(min_length=1, description="Shown in metrics; never the key itself.")
    key_sha256: str | None = Field(
        default=None,
        description="'sha256:<64 hex>' of the key (make one with `rayfleet keys hash`).",
    )
    key_file: str | None = Field(
        default=None, description="File holding the key itself (first line); hashed at start."
    )
    priority_class: str | None = Field(default=None, description="Priority class of its requests.")
    models: list[str] | None = Field(
        default=None, description="Models and routes it may use (default: all)."
    )
    requests_per_minute: int | None = Field(default=None, ge=1, description="Request rate cap.")
    tokens_per_minute: int | None = Field(
        default=None,
        ge=1,
        description="Token rate cap: prompt tokens plus max_tokens, charged at admission.",
    )
    max_concurrent: int | None = Field(
        default=None, ge=1, description="Requests in flight at once."
    )

    @field_validator("key_sha256")
    @classmethod
    def _hash_form(cls, value: str | None) -> str | None:
        if value is None:
            return value
        digest = value.removeprefix("sha256:")
        if (
            value.startswith("sha256:")
            and len(digest) == 64
            and all(c in "0123456789abcdef" for c in digest.lower())
        ):
            return "sha256:" + digest.lower()
        raise ValueError(
            "must be 'sha256:' followed by 64 hex digits (the key's hash, not the key)"
        )

    @model_validator(mode="after")
    def _one_source(self) -> ApiKeyConfig:
        if (self.key_sha256 is None) == (self.key_file is None):
            raise ValueError(
                f"key '{self.name}' needs exactly one of key_sha256 and key_file "
                f"(got key_sha256={'set' if self.key_sha256 else 'unset'}, "
                f"key_file={'set' if self.key_file else 'unset'})"
            )
        return self


class ReplicaProtectionConfig(StrictModel):
    """Taking failing replicas out of rotation."""

    max_consecutive_failures: int = Field(
        default=1, ge=1, description="Failures in a row that take a replica out of rotation."
    )
    cooldown_s: float = Field(
        default=5.0, gt=0, description="How long it stays out before being tried again."
    )


class GatewayConfig(StrictModel):
    """The OpenAI-compatible endpoint and its policies."""

    host: str = Field(default="127.0.0.1", description="Interface the gateway listens on.")
    port: int = Field(default=8000, ge=1, le=65535, description="Port the gateway listens on.")
    workers: int = Field(
        default=1,
        ge=1,
        le=256,
        description="Gateway processes serving the port (SO_REUSEPORT), about one a core "
        "for more than ~3,000 requests a second; they share in-flight counts, key quotas "
        "and the prefix index. Read by rayfleet up.",
    )
    http_front: Literal["rayfleet", "aiohttp"] = Field(
        default="rayfleet",
        description="What serves the API routes (POST /v1/...): 'rayfleet', the gateway's "
        "own HTTP/1.1 front on httptools, with aiohttp's server for anything else; "
        "'aiohttp', aiohttp's server for everything (about 33 us more CPU a request).",
    )
    request_timeout_s: float = Field(
        default=600.0, gt=0, description="Longest a request may take end to end."
    )
    connect_timeout_s: float = Field(
        default=5.0, gt=0, description="Longest the gateway waits to connect to a replica."
    )
    max_in_flight: int | None = Field(
        default=None,
        ge=1,
        description="Requests one gateway process holds at once; over it, a 503 with "
        "Retry-After: 1. Unset: what the process's open-file limit allows (two sockets a "
        "request). Set it near the process's ceiling to hold throughput there under overload.",
    )
    timezone: str = Field(default="UTC", description="IANA time zone of time_of_day rules.")
    limits: LimitsConfig = Field(default_factory=LimitsConfig, description="Caps for every model.")
    model_limits: dict[str, LimitsConfig] = Field(
        default_factory=dict,
        description="Per model or route: caps that override 'limits' field by field.",
    )
    routes: list[RouteConfig] = Field(default_factory=list, description="Virtual model names.")
    fallback: FallbackConfig = Field(default_factory=FallbackConfig)
    priority_classes: list[PriorityClassConfig] = Field(default_factory=list)
    default_priority_class: str | None = Field(
        default=None,
        description="Class of requests with neither a keyed class nor the priority header.",
    )
    priority_header: str = Field(
        default="x-rayfleet-priority",
        description="Request header naming a class (a key's class wins).",
    )
    api_keys: list[ApiKeyConfig] = Field(
        default_factory=list, description="When any is given, /v1 requests need one (Bearer)."
    )
    open_metrics: bool = Field(default=True, description="/metrics answers without a key.")
    open_health: bool = Field(default=True, description="/health answers without a key.")
    replica_protection: ReplicaProtectionConfig = Field(default_factory=ReplicaProtectionConfig)

    @field_validator("timezone")
    @classmethod
    def _known_zone(cls, value: str) -> str:
        from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

        try:
            ZoneInfo(value)
        except (ZoneInfoNotFoundError, ValueError):
            raise ValueError(
                f"'{value}' is not an IANA time zone (e.g. 'UTC', 'Europe/Paris')"
            ) from None
        return value

    @model_validator(mode="after")
    def _references_resolve(self) -> GatewayConfig:
        """Every class and provider a rule, key or default names must be defined here."""
        classes = [c.name for c in self.priority_classes]
        providers = [p.name for p in self.fallback.providers]
        for kind, names in (
            ("priority class", classes),
            ("fallback provider", providers),
            ("route", [r.name for r in self.routes]),
        ):
            dup = next((n for n in names if names.count(n) > 1), None)
            if dup:
                raise ValueError(f"two {kind}s are named '{dup}'; names must be unique")
        wanted_classes = [
            (f"default_priority_class '{self.default_priority_class}'", self.default_priority_class)
        ]
        wanted_classes += [
            (f"api_keys '{k.name}' priority_class '{k.priority_class}'", k.priority_class)
            for k in self.api_keys
        ]
        wanted_providers = [
            (f"routes '{r.name}' fallback '{r.fallback}'", r.fallback) for r in self.routes
        ]
        for route in self.routes:
            for rule in route.rules:
                wanted_classes += [
                    (f"rule '{rule.name}' priority class '{c}'", c)
                    for c in rule.priority_classes or ()
                ]
                if rule.target.startswith("fallback:"):
                    wanted_providers.append(
                        (
                            f"rule '{rule.name}' target '{rule.target}'",
                            rule.target.removeprefix("fallback:"),
                        )
                    )
                low, high = rule.prompt_tokens_at_least, rule.prompt_tokens_below
                if low is not None and high is not None and low >= high:
                    raise ValueError(
                        f"rule '{rule.name}': prompt_tokens_at_least ({low}) must be below "
                        f"prompt_tokens_below ({high}), or no prompt can match; lower the first "
                        "or raise the second"
                    )
        for what, name in wanted_classes:
            if name is not None and name not in classes:
                raise ValueError(
                    f"{what} is not defined; priority_classes has: {', '.join(classes) or 'none'}"
                )
        for what, name in wanted_providers:
            if name is not None and name not in providers:
                raise ValueError(
                    f"{what} is not a fallback provider; fallback.providers has: "
                    f"{', '.join(providers) or 'none'}"
                )
        return self
