"""Every way to split a model into (TP, PP, DP) over some hardware, and what each gives.

Rules (vLLM's, and the network's):
- TP must divide the attention heads; with GQA it must also divide the KV heads or be
  a multiple of them.
- TP stays inside a node unless the inter-node link reaches ``CROSS_NODE_TP_MIN_GBPS``.
- A replica is either part of one node or whole nodes; PP stages split the layers.
- Data-parallel replicas fill the GPUs that are left.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from rayfleet.planner.hardware import Hardware
from rayfleet.planner.memory import GiB, MemorySettings, dtype_bytes, gpu_memory
from rayfleet.planner.model_spec import ModelSpec

# TP all-reduces twice per layer per token: only RDMA-class links (InfiniBand, RoCE) keep up.
CROSS_NODE_TP_MIN_GBPS = 200.0
# Below this a link is too slow even to carry TP as a choice worth listing reasons for.
SLOW_LINK_GBPS = 10.0
ALL_REDUCES_PER_LAYER = 2


@dataclass(frozen=True)
class Workload:
    """What the deployment must serve."""

    context_len: int
    concurrency: int | None = None  # target concurrent sequences
    request_rate: float | None = None  # target requests per second
    output_len: int = 256  # output tokens per request, for the request rate
    tpot_ms: float = 50.0  # assumed time per output token, for the request rate

    def target_concurrency(self) -> int | None:
        """Sequences in flight the target load needs (Little's law for a request rate)."""
        from_rate = None
        if self.request_rate:
            seconds_per_request = self.output_len * self.tpot_ms / 1000.0
            from_rate = math.ceil(self.request_rate * seconds_per_request)
        targets = [t for t in (self.concurrency, from_rate) if t]
        return max(targets) if targets else None


@dataclass(frozen=True)
class Layout:
    """One (TP, PP, DP) split and what it gives per replica."""

    tensor_parallel: int
    pipeline_parallel: int
    replicas: int  # replicas of this shape the hardware holds
    gpus_per_replica: int
    nodes_per_replica: int
    weights_gib_per_gpu: float
    kv_cache_gib_per_gpu: float
    activation_gib_per_gpu: float
    overhead_gib_per_gpu: float
    kv_tokens_per_replica: int
    max_concurrent_seqs: int  # per replica, at the workload's context length
    comm_us_per_token: float
    cross_node_tp: bool
    idle_gpus: int  # GPUs left over once the replicas are placed

    @property
    def needs_ray(self) -> bool:
        return self.nodes_per_replica > 1

    @property
    def fits(self) -> bool:
        return self.max_concurrent_seqs >= 1 and self.replicas >= 1


def tp_allowed_by_heads(spec: ModelSpec, tp: int) -> bool:
    att = spec.attention
    if att.num_heads % tp:
        return False
    kv = att.num_kv_heads
    return att.is_mla or kv % tp == 0 or tp % kv == 0


def candidate_shapes(spec: ModelSpec, hw: Hardware) -> list[tuple[int, int]]:
    """(tp, pp) pairs that the heads, the layers and the node shape allow."""
    shapes = []
    g = hw.gpus_per_node
    for tp in range(1, hw.total_gpus + 1):
        if not tp_allowed_by_heads(spec, tp):
            continue
        if tp > g and (tp % g or hw.inter_node_gbps < CROSS_NODE_TP_MIN_GBPS):
            continue
        for pp in range(1, min(spec.num_layers, hw.total_gpus // tp) + 1):
            gpus = tp * pp
            if gpus > g and (gpus % g or g % min(tp, g)):
                continue
            shapes.append((tp, pp))
    return shapes


def replicas_that_fit(gpus_per_replica: int, hw: Hardware) -> int:
    g = hw.gpus_per_node
    if gpus_per_replica <= g:
        return (g // gpus_per_replica) * hw.nodes
    return hw.nodes // (gpus_per_replica // g)


def comm_us_per_token(spec: ModelSpec, tp: int, pp: int, nodes: int, hw: Hardware) -> float:
    """Time one token's activations spend on the wire, from link bandwidths alone.

    TP: a ring all-reduce of the hidden state twice per layer, over the inter-node
    link when TP spans nodes. PP: one hidden state per stage boundary, over the
    inter-node link where the boundary crosses nodes. Latency is not counted.
    """
    message_bits = spec.hidden_size * dtype_bytes(spec) * 8
    cross_node_tp = tp > hw.gpus_per_node
    tp_gbps = hw.inter_node_gbps if cross_node_tp else hw.intra_node_gbps
    ring_factor = 2 * (tp - 1) / tp
    tp_bits = spec.num_layers * ALL_REDUCES_PER_LAYER * ring_factor * message_bits
    cross_boundaries = pp - 1 if cross_node_tp else nodes - 1
    inner_boundaries = pp - 1 - cross_boundaries
    seconds = (
        tp_bits / (tp_gbps * 1e9)
        + cross_boundaries * message_bits / (hw.inter_node_gbps * 1e9)
        + inner_boundaries * message_bits / (hw.intra_node_gbps * 1e9)
    )
    return seconds * 1e6


def evaluate(
    spec: ModelSpec, tp: int, pp: int, hw: Hardware, workload: Workload, settings: MemorySettings
) -> Layout:
    """Memory, capacity and communication of one (tp, pp) shape on ``hw``."""
    gpus = tp * pp
    nodes = max(1, gpus // hw.gpus_per_node) if gpus > hw.gpus_per_node else 1
    memory = gpu_memory(spec, tp, pp, hw.gpu_memory_gib, settings)
    replicas = replicas_that_fit(gpus, hw)
    return Layout(
        tensor_parallel=tp,
        pipeline_parallel=pp,
        replicas=replicas,
        gpus_per_replica=gpus,
        nodes_per_replica=nodes,
        weights_gib_per_gpu=memory.weights_bytes / GiB,
        kv_cache_gib_per_gpu=memory.kv_cache_bytes / GiB,
        activation_gib_per_gpu=memory.activation_bytes / GiB,
        overhead_gib_per_gpu=memory.overhead_bytes / GiB,
        kv_tokens_per_replica=memory.kv_tokens,
        max_concurrent_seqs=memory.kv_tokens // workload.context_len,
        comm_us_per_token=comm_us_per_token(spec, tp, pp, nodes, hw),
        cross_node_tp=tp > hw.gpus_per_node,
        idle_gpus=hw.total_gpus - replicas * gpus,
    )


def all_layouts(
    spec: ModelSpec, hw: Hardware, workload: Workload, settings: MemorySettings
) -> list[Layout]:
    return [evaluate(spec, tp, pp, hw, workload, settings) for tp, pp in candidate_shapes(spec, hw)]


def preference_key(
    layout: Layout, target: int | None
) -> tuple[int, bool, bool, int, bool, int, float, int]:
    """Sort key: span the fewest nodes, avoid cross-node TP, meet the target load, use
    the fewest pipeline stages (inside a node TP's all-reduces are cheap and PP only
    adds bubbles; across nodes TP fills each node and PP spans them), leave no GPU idle,
    use the fewest GPUs per replica (more independent replicas), then the least
    communication and the most KV cache."""
    capacity = layout.replicas * layout.max_concurrent_seqs
    misses_target = target is not None and capacity < target
    return (
        layout.nodes_per_replica,
        layout.cross_node_tp,
        misses_target,
        layout.pipeline_parallel,
        layout.idle_gpus > 0,
        layout.gpus_per_replica,
        layout.comm_us_per_token,
        -layout.kv_tokens_per_replica,
    )


def rank_layouts(layouts: list[Layout], target: int | None) -> list[Layout]:
    """Feasible layouts, best first."""
    feasible = [layout for layout in layouts if layout.fits]
    return sorted(feasible, key=lambda layout: preference_key(layout, target))
