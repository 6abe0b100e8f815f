"""Prometheus metrics of the gateway, in a registry of its own (no global state)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

_LATENCY_BUCKETS_S = (
    0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0,
)


class GatewayMetrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self.requests = Counter(
            "rayfleet_requests_total",
            "Requests answered, by model, replica and HTTP status.",
            ["model", "replica", "status"],
            registry=self.registry,
        )
        self.errors = Counter(
            "rayfleet_request_errors_total",
            "Failed requests by model and reason (bad_request, unknown_model, no_replica, "
            "upstream_connect, upstream_status, stream_broken, client_disconnect, timeout).",
            ["model", "reason"],
            registry=self.registry,
        )
        self.retries = Counter(
            "rayfleet_retries_total",
            "Requests retried on another replica after failing before the first byte.",
            ["model"],
            registry=self.registry,
        )
        self.ttfb = Histogram(
            "rayfleet_time_to_first_byte_seconds",
            "From request received to the first response byte from the replica.",
            ["model", "replica"],
            buckets=_LATENCY_BUCKETS_S,
            registry=self.registry,
        )
        self.latency = Histogram(
            "rayfleet_request_duration_seconds",
            "From request received to the last response byte.",
            ["model", "replica"],
            buckets=_LATENCY_BUCKETS_S,
            registry=self.registry,
        )
        self.inflight = Gauge(
            "rayfleet_inflight_requests",
            "Requests in flight, by model and replica.",
            ["model", "replica"],
            registry=self.registry,
        )
        self.replicas = Gauge(
            "rayfleet_replicas",
            "Replicas registered for a model, by health as seen by the gateway.",
            ["model", "state"],
            registry=self.registry,
        )

    def render(self) -> bytes:
        return generate_latest(self.registry)
