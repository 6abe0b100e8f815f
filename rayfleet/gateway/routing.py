"""The replica policy of a model, built from its ``routing`` section of fleet.yaml.

    policy = build_replica_policy(config.routing, model="m", metrics=gateway_metrics)
    replica = policy.pick(request_info, candidates)

    least_load    LeastLoad (least_load.py), the default
    round_robin   RoundRobin (round_robin.py)
    prefix        PrefixRouting (prefix_routing.py, prefix_index.py)
    session       SessionAffinity (session_affinity.py)

With ``metrics``, the policy is wrapped so that every pick's duration goes to
``rayfleet_replica_pick_seconds{model, policy}``; the prefix policy also counts the blocks
it predicted cached and the blocks sent per replica, the tokens replicas reported cached
(``observe_usage``, passed through ``TimedPolicy``), and its index size per replica is
read when ``/metrics`` is scraped (``GatewayMetrics.before_render``). ``observe_engine``
passes the prefix policy what a replica's vLLM /metrics say (as replica_gauges.py reads
them): the KV cache's size bounds its memory of the replica, and a start time that moved
empties it.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence

from prometheus_client import Counter

from rayfleet.config.routing import RoutingConfig
from rayfleet.gateway.least_load import LeastLoad
from rayfleet.gateway.metrics import GatewayMetrics
from rayfleet.gateway.prefix_routing import PickObserver, PrefixRouting, UsageCounter
from rayfleet.gateway.replica_policy import (
    AnswerWanted,
    ReplicaPolicy,
    RequestInfo,
    UsageObserver,
)
from rayfleet.gateway.replicas import Replica
from rayfleet.gateway.round_robin import RoundRobin
from rayfleet.gateway.session_affinity import SessionAffinity

Refresh = Callable[[], None]
IndexSizer = Callable[[Replica, int], None]  # (replica, tokens its KV cache holds)
StartObserver = Callable[[Replica, float], None]  # (replica, when its engine started)


def build_replica_policy(
    config: RoutingConfig | None, *, model: str = "", metrics: GatewayMetrics | None = None
) -> ReplicaPolicy:
    """The policy ``config`` names (least load when None), observed in ``metrics``."""
    config = config if config is not None else RoutingConfig()
    policy: ReplicaPolicy
    if config.policy == "round_robin":
        policy = RoundRobin()
    elif config.policy == "session":
        policy = SessionAffinity(config)
    elif config.policy == "prefix":
        observe = _hit_counter(model, metrics) if metrics is not None else None
        on_usage = _realised_counter(model, metrics) if metrics is not None else None
        policy = prefix = PrefixRouting(config, observe=observe, on_usage=on_usage)
        if metrics is not None:
            metrics.before_render.append(_index_size_reader(prefix, model, metrics))
    else:
        policy = LeastLoad()
    if metrics is None:
        return policy
    return TimedPolicy(policy, metrics, model, config.policy)


class TimedPolicy:
    """A policy whose picks are timed into ``rayfleet_replica_pick_seconds``."""

    def __init__(self, policy: ReplicaPolicy, metrics: GatewayMetrics, model: str, name: str):
        self.policy = policy
        self._observe = metrics.pick_latency.labels(model, name).observe
        # The wrapped policy's optional hooks, found under the same names.
        self.observe_usage: UsageObserver | None = getattr(policy, "observe_usage", None)
        self.wants_answer: AnswerWanted | None = getattr(policy, "wants_answer", None)
        self.size_index: IndexSizer | None = getattr(policy, "size_index", None)
        self.engine_started: StartObserver | None = getattr(policy, "engine_started", None)

    def pick(self, request: RequestInfo, replicas: Sequence[Replica]) -> Replica | None:
        started = time.perf_counter()
        replica = self.policy.pick(request, replicas)
        self._observe(time.perf_counter() - started)
        return replica


def observe_engine(
    policy: ReplicaPolicy | None,
    replica: Replica,
    kv_cache_tokens: int | None,
    start_time: float | None,
) -> None:
    """Tell a prefix policy what ``replica``'s vLLM reports: its KV cache's size in tokens
    bounds the policy's index of it, and its start time moving empties that index. A no-op
    for other policies and for what a server does not say."""
    sizer: IndexSizer | None = getattr(policy, "size_index", None)
    if sizer is not None and kv_cache_tokens:
        sizer(replica, kv_cache_tokens)
    started: StartObserver | None = getattr(policy, "engine_started", None)
    if started is not None and start_time is not None:
        started(replica, start_time)


def _hit_counter(model: str, metrics: GatewayMetrics) -> PickObserver:
    """Count each pick's predicted hit blocks and prompt blocks per replica."""
    children: dict[str, tuple[Counter, Counter]] = {}

    def observe(replica: Replica, hit_blocks: int, num_blocks: int) -> None:
        pair = children.get(replica.replica_id)
        if pair is None:
            pair = children[replica.replica_id] = (
                metrics.prefix_predicted_hit_blocks.labels(model, replica.replica_id),
                metrics.prefix_prompt_blocks.labels(model, replica.replica_id),
            )
        pair[0].inc(hit_blocks)
        pair[1].inc(num_blocks)

    return observe


def _realised_counter(model: str, metrics: GatewayMetrics) -> UsageCounter:
    """Count the prompt and cached tokens replicas reported, per replica."""

    def count(replica: Replica, prompt_tokens: int, cached_tokens: int) -> None:
        labels = (model, replica.replica_id)
        metrics.prefix_realised_hit_tokens.labels(*labels).inc(cached_tokens)
        metrics.prefix_usage_prompt_tokens.labels(*labels).inc(prompt_tokens)

    return count


def _index_size_reader(policy: PrefixRouting, model: str, metrics: GatewayMetrics) -> Refresh:
    """Set the index size per replica when scraped; forgotten replicas drop out."""
    shown: set[str] = set()
    gauge = metrics.prefix_index_blocks

    def refresh() -> None:
        sizes = policy.index.num_blocks()
        for replica_id in shown - sizes.keys():
            gauge.remove(model, replica_id)
        for replica_id, num_blocks in sizes.items():
            gauge.labels(model, replica_id).set(num_blocks)
        shown.clear()
        shown.update(sizes)

    return refresh
