"""The planner's reasons in plain words: what the model is, why this layout, why Ray
is or is not needed, what the links and the target load mean for it.

Pure functions of a ``Plan`` (from ``plan.py``) and its layouts; ``make_plan`` calls
``fit_reasons`` for a plan that fits.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

from rayfleet.planner.layout import CROSS_NODE_TP_MIN_GBPS, SLOW_LINK_GBPS, Layout
from rayfleet.planner.memory import GiB, kv_bytes_per_token, total_weight_bytes
from rayfleet.planner.model_spec import ModelSpec
from rayfleet.planner.params import count_params

if TYPE_CHECKING:
    from rayfleet.planner.plan import Plan


def attention_kind(spec: ModelSpec) -> str:
    att = spec.attention
    if att.is_mla:
        return "MLA"
    if att.num_kv_heads == att.num_heads:
        return "MHA"
    return "MQA" if att.num_kv_heads == 1 else "GQA"


def _gib(value: float) -> str:
    return f"{value:.1f} GiB" if value >= 0.1 else f"{value * 1024:.1f} MiB"


def model_reason(spec: ModelSpec) -> str:
    params = count_params(spec).total
    kv_kib = kv_bytes_per_token(spec) / 1024
    moe = ""
    if spec.experts.is_moe:
        moe = (
            f", {spec.experts.num_experts} experts ({spec.experts.num_experts_per_token} per token)"
        )
    return (
        f"{spec.name}: {params / 1e9:.2f}B parameters{moe}, {spec.weight_format} weights "
        f"{_gib(total_weight_bytes(spec) / GiB)} in all; KV cache {kv_kib:.1f} KiB per token "
        f"({attention_kind(spec)})"
    )


def budget_words(plan: Plan) -> str:
    hw, settings = plan.hardware, plan.settings
    if settings.kv_cache_gib is not None:
        fixed = settings.kv_cache_gib
        return f"{hw.gpu_memory_gib:g} GiB per GPU with {fixed:g} GiB fixed for KV cache"
    usable = hw.gpu_memory_gib * settings.gpu_memory_utilization
    share = settings.gpu_memory_utilization
    return f"{usable:.1f} GiB usable per GPU ({hw.gpu_memory_gib:g} GiB x {share:g})"


def fit_reasons(plan: Plan, layout: Layout, layouts: list[Layout]) -> list[str]:
    """Why ``layout`` (the plan's choice among ``layouts``), in the domain's own words."""
    reasons = [model_reason(plan.spec), layout_reason(plan, layout)]
    reasons += smaller_shape_reasons(plan, layout, layouts)
    reasons += ray_reasons(plan, layout)
    reasons += link_reasons(plan, layout)
    reasons += target_reasons(plan, layout)
    return reasons


def layout_reason(plan: Plan, layout: Layout) -> str:
    where = (
        f"on {layout.nodes_per_replica} nodes"
        if layout.nodes_per_replica > 1
        else "inside one node"
    )
    return (
        f"chose TP={layout.tensor_parallel} x PP={layout.pipeline_parallel} "
        f"({layout.gpus_per_replica} GPU(s) per replica, {where}): weights take "
        f"{_gib(layout.weights_gib_per_gpu)} per GPU of {budget_words(plan)}, leaving "
        f"{_gib(layout.kv_cache_gib_per_gpu)} for KV cache = {layout.kv_tokens_per_replica:,} "
        f"tokens, {layout.max_concurrent_seqs} sequences of {plan.workload.context_len:,} tokens "
        "per replica"
    )


def smaller_shape_reasons(plan: Plan, layout: Layout, layouts: list[Layout]) -> list[str]:
    """Why not fewer GPUs per replica: the largest smaller shape with no more pipeline
    stages, and what it lacked."""
    if layout.gpus_per_replica == 1:
        return ["one GPU holds a whole replica: no tensor or pipeline parallelism needed"]
    smaller = [
        c
        for c in layouts
        if c.gpus_per_replica < layout.gpus_per_replica
        and c.pipeline_parallel <= layout.pipeline_parallel
    ]
    if not smaller:
        return []
    best = max(smaller, key=lambda c: (c.gpus_per_replica, c.kv_tokens_per_replica))
    shape = f"TP={best.tensor_parallel} x PP={best.pipeline_parallel}"
    if best.fits:
        total = best.replicas * best.max_concurrent_seqs
        return [
            f"{shape} also fits but holds {total} concurrent sequences in all "
            f"({best.replicas} replica(s) x {best.max_concurrent_seqs}), under the target"
        ]
    if best.kv_cache_gib_per_gpu <= 0:
        return [
            f"{shape} does not fit: {_gib(best.weights_gib_per_gpu)} of weights per GPU "
            f"plus {_gib(best.activation_gib_per_gpu + best.overhead_gib_per_gpu)} of "
            "activations and runtime leave no room for KV cache"
        ]
    return [
        f"{shape} does not fit: it leaves KV cache for {best.kv_tokens_per_replica:,} tokens, "
        f"less than one {plan.workload.context_len:,}-token sequence"
    ]


def ray_reasons(plan: Plan, layout: Layout) -> list[str]:
    if layout.needs_ray:
        return [
            f"the model must span {layout.nodes_per_replica} nodes: Ray is needed "
            "(it pools the GPUs of all nodes and places each replica's workers with a "
            "placement group; vLLM's Ray executor runs them)"
        ]
    return [
        "each replica fits inside one node: run independent vLLM servers behind a load "
        "balancer; Ray is optional (worth it for many models on mixed GPUs, autoscaling, "
        "restarts, growth to more machines)"
    ]


def link_reasons(plan: Plan, layout: Layout) -> list[str]:
    hw = plan.hardware
    if hw.nodes < 2:
        return []
    gbps = hw.inter_node_gbps
    if layout.nodes_per_replica == 1:
        if gbps < SLOW_LINK_GBPS:
            return [
                f"inter-node link {gbps:g} Gbit/s is under {SLOW_LINK_GBPS:g} Gbit/s: "
                "keep every replica inside one node and scale with data parallelism"
            ]
        return []
    if layout.cross_node_tp:
        return [
            f"inter-node link {gbps:g} Gbit/s is at least {CROSS_NODE_TP_MIN_GBPS:g} Gbit/s: "
            "tensor parallelism across nodes is acceptable"
        ]
    words = [
        f"inter-node link {gbps:g} Gbit/s: tensor parallelism stays inside each node "
        f"and pipeline parallelism spans the nodes (PP sends one hidden state per token per "
        f"stage; TP would all-reduce twice per layer over the link); estimated "
        f"{layout.comm_us_per_token:.2f} us of transfer per token"
    ]
    if gbps < SLOW_LINK_GBPS:
        words.append(
            f"link under {SLOW_LINK_GBPS:g} Gbit/s: no cross-node TP at all, and expect "
            "pipeline stages to wait on the network; faster links or bigger GPUs would help"
        )
    return words


def target_reasons(plan: Plan, layout: Layout) -> list[str]:
    target = plan.workload.target_concurrency()
    if not target or plan.replicas_needed is None:
        return [
            f"{layout.replicas} replica(s) of this shape fill the hardware "
            f"({layout.replicas * layout.max_concurrent_seqs} concurrent sequences in all)"
        ]
    needed = plan.replicas_needed
    words = (
        f"target of {target} concurrent sequences needs {needed} replica(s) of "
        f"{layout.max_concurrent_seqs}"
    )
    if needed <= layout.replicas:
        return [f"{words}; the hardware holds {layout.replicas}"]
    missing = needed - layout.replicas
    per_node = max(1, plan.hardware.gpus_per_node // layout.gpus_per_replica)
    extra_nodes = (
        missing * layout.nodes_per_replica
        if layout.nodes_per_replica > 1
        else math.ceil(missing / per_node)
    )
    return [
        f"{words}, but the hardware holds only {layout.replicas}: add {extra_nodes} node(s) "
        "or accept a longer queue"
    ]
