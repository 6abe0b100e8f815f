"""Prometheus metrics of the gateway, in a registry of its own (no global state).

Values read only when scraped (the prefix index's size) are set by the callables in
``before_render``, so that the data path pays nothing for them. ``series(model, replica)``
hands the data path one replica's per-request children, looked up once: prometheus_client's
``labels()`` checks and joins its arguments under a lock on every call, about 1.3 us, four
times a request.
"""

from __future__ import annotations

from collections.abc import Callable

from prometheus_client import CollectorRegistry, Counter, Gauge, generate_latest

from rayfleet.gateway.loop_metrics import CountChild, LoopCounter, LoopGauge, LoopHistogram

_LATENCY_BUCKETS_S = (
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1.0,
    2.5,
    5.0,
    10.0,
    30.0,
    60.0,
    120.0,
    300.0,
)
_PICK_BUCKETS_S = (1e-6, 2.5e-6, 5e-6, 1e-5, 2.5e-5, 5e-5, 1e-4, 2.5e-4, 5e-4, 1e-3, 1e-2)


class GatewayMetrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        # The series every request touches are loop_metrics' lock-free ones.
        self.requests = LoopCounter(
            "rayfleet_requests_total",
            "Requests answered, by model, replica and HTTP status.",
            ["model", "replica", "status"],
            self.registry,
        )
        self.errors = Counter(
            "rayfleet_request_errors_total",
            "Failed requests by model and reason (bad_request, unknown_model, no_replica, "
            "upstream_connect, upstream_status, stream_broken, client_disconnect, timeout, "
            "unauthorized, forbidden_model, rate_limited_*, limit_*, body_too_large, "
            "context_length, no_route_target, gateway_overloaded).",
            ["model", "reason"],
            registry=self.registry,
        )
        self.retries = Counter(
            "rayfleet_retries_total",
            "Requests retried on another replica after failing before the first byte.",
            ["model"],
            registry=self.registry,
        )
        self.ttfb = LoopHistogram(
            "rayfleet_time_to_first_byte_seconds",
            "From request received to the first response byte from the replica.",
            ["model", "replica"],
            self.registry,
            _LATENCY_BUCKETS_S,
        )
        self.latency = LoopHistogram(
            "rayfleet_request_duration_seconds",
            "From request received to the last response byte.",
            ["model", "replica"],
            self.registry,
            _LATENCY_BUCKETS_S,
        )
        self.inflight = LoopGauge(
            "rayfleet_inflight_requests",
            "Requests in flight, by model and replica.",
            ["model", "replica"],
            self.registry,
        )
        self.replicas = Gauge(
            "rayfleet_replicas",
            "Replicas of a model by state: serving, draining, cooling_down (as the gateway "
            "sees them), starting (wanted, not yet registered).",
            ["model", "state"],
            registry=self.registry,
        )

        self.routes = Counter(
            "rayfleet_route_decisions_total",
            "Requests to a route, by the rule that fired and its target.",
            ["route", "rule", "target"],
            registry=self.registry,
        )
        self.fallbacks = Counter(
            "rayfleet_fallback_requests_total",
            "Requests sent to a fallback provider, by reason (rule, no_replica, queue_depth, "
            "failure).",
            ["model", "provider", "reason"],
            registry=self.registry,
        )
        self.key_requests = Counter(
            "rayfleet_api_key_requests_total",
            "Requests admitted, by API key name.",
            ["key"],
            registry=self.registry,
        )
        self.clamped = Counter(
            "rayfleet_max_tokens_clamped_total",
            "Requests whose max_tokens the gateway lowered to the configured cap.",
            ["model"],
            registry=self.registry,
        )
        self.cooldowns = Counter(
            "rayfleet_replica_cooldowns_total",
            "Times a replica was taken out of rotation after failing in a row.",
            ["model", "replica"],
            registry=self.registry,
        )

        self.pick_latency = LoopHistogram(
            "rayfleet_replica_pick_seconds",
            "Time the replica policy took to pick a replica, by model and policy.",
            ["model", "policy"],
            self.registry,
            _PICK_BUCKETS_S,
        )
        self.prefix_index_blocks = Gauge(
            "rayfleet_prefix_index_blocks",
            "Prompt blocks the prefix policy remembers per replica (routing.index_blocks at most).",
            ["model", "replica"],
            registry=self.registry,
        )
        self.prefix_predicted_hit_blocks = Counter(
            "rayfleet_prefix_predicted_hit_blocks_total",
            "Prompt blocks the prefix policy predicted cached on the replica it picked "
            "(a block is routing.block_chars characters, about 16 tokens at 64).",
            ["model", "replica"],
            registry=self.registry,
        )
        self.prefix_prompt_blocks = Counter(
            "rayfleet_prefix_prompt_blocks_total",
            "Whole prompt blocks of the requests the prefix policy sent to each replica; "
            "predicted hit rate = predicted_hit_blocks / prompt_blocks.",
            ["model", "replica"],
            registry=self.registry,
        )
        self.prefix_realised_hit_tokens = Counter(
            "rayfleet_prefix_realised_hit_tokens_total",
            "Prompt tokens each replica reported cached (usage.prompt_tokens_details."
            "cached_tokens; vLLM needs --enable-prompt-tokens-details) for requests the prefix "
            "policy sent it; only responses that carry a usage count (streams ask for it with "
            "stream_options.include_usage).",
            ["model", "replica"],
            registry=self.registry,
        )
        self.prefix_usage_prompt_tokens = Counter(
            "rayfleet_prefix_usage_prompt_tokens_total",
            "Prompt tokens of the responses counted in realised_hit_tokens; realised hit rate "
            "= realised_hit_tokens / usage_prompt_tokens, to set against the predicted one.",
            ["model", "replica"],
            registry=self.registry,
        )
        self.asyncio_tasks = Gauge(
            "rayfleet_gateway_asyncio_tasks",
            "Tasks alive on the gateway's event loop when scraped: one per open client "
            "connection, one per request being answered, and a few of the gateway's own. "
            "Flat under steady load, or a leak.",
            registry=self.registry,
        )
        self.before_render: list[Callable[[], None]] = []
        self._series: dict[tuple[str, str], Series] = {}

    def series(self, model: str, replica: str) -> Series:
        """The per-request children of ``(model, replica)``, made at its first request."""
        found = self._series.get((model, replica))
        if found is None:
            found = self._series[model, replica] = Series(self, model, replica)
        return found

    def render(self) -> bytes:
        for refresh in self.before_render:
            refresh()
        return generate_latest(self.registry)


class Series:
    """One (model, replica)'s children of the metrics every request touches."""

    __slots__ = ("_by_status", "_labels", "_requests", "inflight", "latency", "ttfb")

    def __init__(self, metrics: GatewayMetrics, model: str, replica: str):
        self.inflight = metrics.inflight.labels(model, replica)
        self.ttfb = metrics.ttfb.labels(model, replica)
        self.latency = metrics.latency.labels(model, replica)
        self._requests = metrics.requests
        self._labels = (model, replica)
        self._by_status: dict[int, CountChild] = {}

    def answered(self, status: int) -> None:
        """Count one request answered with ``status`` (rayfleet_requests_total)."""
        child = self._by_status.get(status)
        if child is None:
            child = self._by_status[status] = self._requests.labels(*self._labels, str(status))
        child.inc()
