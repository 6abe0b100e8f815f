"""The planner's answer: the chosen layout, the alternatives, and the reasons in plain words.

``make_plan(spec, hardware, workload, settings)`` is the library entry point that
``rayfleet plan`` calls. It never prints; ``report.py`` turns a Plan into tables or JSON.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field, replace

from rayfleet.errors import ConfigError
from rayfleet.planner.hardware import Hardware
from rayfleet.planner.layout import (
    CROSS_NODE_TP_MIN_GBPS,
    SLOW_LINK_GBPS,
    Layout,
    Workload,
    all_layouts,
    rank_layouts,
)
from rayfleet.planner.memory import GiB, MemorySettings, kv_bytes_per_token, total_weight_bytes
from rayfleet.planner.model_spec import ModelSpec
from rayfleet.planner.params import count_params

MAX_ALTERNATIVES = 10
MAX_SEARCH_NODES = 64
SEARCH_GPUS_PER_NODE = (1, 2, 4, 8)


@dataclass(frozen=True)
class SmallestFit:
    """The least hardware of the same GPU that would hold the model."""

    nodes: int
    gpus_per_node: int
    gpu_memory_gib: float
    tensor_parallel: int
    pipeline_parallel: int


@dataclass
class Plan:
    """Everything ``rayfleet plan`` reports."""

    spec: ModelSpec
    hardware: Hardware
    workload: Workload
    settings: MemorySettings
    chosen: Layout | None
    alternatives: list[Layout]
    replicas: int  # replicas to deploy: enough for the target, or all that fit
    replicas_needed: int | None
    reasons: list[str] = field(default_factory=list)
    smallest_fit: SmallestFit | None = None

    @property
    def fits(self) -> bool:
        return self.chosen is not None

    def to_dict(self) -> dict:
        """The ``--json`` document."""
        chosen = _layout_dict(self.chosen) if self.chosen else _empty_layout()
        return {
            "fits": self.fits,
            **chosen,
            "replicas": self.replicas,
            "replicas_needed": self.replicas_needed,
            "max_concurrent_seqs_total": (
                self.replicas * self.chosen.max_concurrent_seqs if self.chosen else 0
            ),
            "reasons": list(self.reasons),
            "alternatives": [_layout_dict(layout) for layout in self.alternatives],
            "smallest_fit": asdict(self.smallest_fit) if self.smallest_fit else None,
            "model": _model_dict(self.spec),
            "hardware": {k: v for k, v in asdict(self.hardware).items() if k != "notes"},
            "hardware_notes": list(self.hardware.notes),
            "workload": asdict(self.workload),
            "engine": asdict(self.settings),
        }


def _layout_dict(layout: Layout) -> dict:
    return {
        "tensor_parallel": layout.tensor_parallel,
        "pipeline_parallel": layout.pipeline_parallel,
        "replicas": layout.replicas,
        "nodes_per_replica": layout.nodes_per_replica,
        "gpus_per_replica": layout.gpus_per_replica,
        "needs_ray": layout.needs_ray,
        "weights_gib_per_gpu": round(layout.weights_gib_per_gpu, 6),
        "kv_cache_gib_per_gpu": round(layout.kv_cache_gib_per_gpu, 6),
        "activation_gib_per_gpu": round(layout.activation_gib_per_gpu, 6),
        "overhead_gib_per_gpu": round(layout.overhead_gib_per_gpu, 6),
        "kv_tokens_per_replica": layout.kv_tokens_per_replica,
        "max_concurrent_seqs": layout.max_concurrent_seqs,
        "comm_us_per_token": round(layout.comm_us_per_token, 3),
        "cross_node_tp": layout.cross_node_tp,
    }


def _empty_layout() -> dict:
    return {
        "tensor_parallel": None,
        "pipeline_parallel": None,
        "nodes_per_replica": None,
        "gpus_per_replica": None,
        "needs_ray": False,
        "weights_gib_per_gpu": None,
        "kv_cache_gib_per_gpu": None,
        "kv_tokens_per_replica": 0,
        "max_concurrent_seqs": 0,
    }


def _model_dict(spec: ModelSpec) -> dict:
    return {
        "name": spec.name,
        "source": spec.source,
        "model_type": spec.model_type,
        "parameters": count_params(spec).total,
        "layers": spec.num_layers,
        "hidden_size": spec.hidden_size,
        "attention_heads": spec.attention.num_heads,
        "kv_heads": spec.attention.num_kv_heads,
        "head_dim": spec.attention.head_dim,
        "attention": attention_kind(spec),
        "experts": spec.experts.num_experts,
        "experts_per_token": spec.experts.num_experts_per_token,
        "dtype": spec.dtype,
        "weight_format": spec.weight_format,
        "max_context": spec.max_context,
        "weights_gib": round(total_weight_bytes(spec) / GiB, 6),
        "kv_bytes_per_token": kv_bytes_per_token(spec),
    }


def attention_kind(spec: ModelSpec) -> str:
    att = spec.attention
    if att.is_mla:
        return "MLA"
    if att.num_kv_heads == att.num_heads:
        return "MHA"
    return "MQA" if att.num_kv_heads == 1 else "GQA"


def check_workload(spec: ModelSpec, workload: Workload) -> None:
    if workload.context_len < 1:
        raise ConfigError(f"--context-len must be at least 1, got {workload.context_len}")
    if workload.context_len > spec.max_context:
        raise ConfigError(
            f"--context-len {workload.context_len} exceeds the model's max context "
            f"{spec.max_context} (max_position_embeddings in {spec.source}); lower --context-len"
        )


def make_plan(
    spec: ModelSpec, hardware: Hardware, workload: Workload, settings: MemorySettings
) -> Plan:
    """Choose a layout for ``spec`` on ``hardware`` and explain the choice."""
    check_workload(spec, workload)
    target = workload.target_concurrency()
    layouts = all_layouts(spec, hardware, workload, settings)
    ranked = rank_layouts(layouts, target)
    if not ranked:
        return _no_fit_plan(spec, hardware, workload, settings)
    chosen = ranked[0]
    needed = math.ceil(target / chosen.max_concurrent_seqs) if target else None
    replicas = min(needed, chosen.replicas) if needed else chosen.replicas
    plan = Plan(
        spec=spec,
        hardware=hardware,
        workload=workload,
        settings=settings,
        chosen=chosen,
        alternatives=ranked[1 : 1 + MAX_ALTERNATIVES],
        replicas=replicas,
        replicas_needed=needed,
    )
    plan.reasons = fit_reasons(plan, chosen, layouts)
    return plan


def _no_fit_plan(
    spec: ModelSpec, hardware: Hardware, workload: Workload, settings: MemorySettings
) -> Plan:
    plan = Plan(
        spec=spec,
        hardware=hardware,
        workload=workload,
        settings=settings,
        chosen=None,
        alternatives=[],
        replicas=0,
        replicas_needed=None,
        smallest_fit=smallest_fit(spec, hardware, workload, settings),
    )
    plan.reasons = no_fit_reasons(plan)
    return plan


def search_shapes(hardware: Hardware) -> list[tuple[int, int]]:
    """(nodes, GPUs per node) to try, smallest first: one node grown up to 8 GPUs (or
    the given node size), then more nodes of that size."""
    largest = max(hardware.gpus_per_node, max(SEARCH_GPUS_PER_NODE))
    one_node = sorted(
        {g for g in (*SEARCH_GPUS_PER_NODE, hardware.gpus_per_node) if hardware.gpus_per_node <= g}
    )
    return [(1, g) for g in one_node] + [(n, largest) for n in range(2, MAX_SEARCH_NODES + 1)]


def smallest_fit(
    spec: ModelSpec, hardware: Hardware, workload: Workload, settings: MemorySettings
) -> SmallestFit | None:
    """The least hardware of the same GPU (and links) that holds one replica."""
    no_target = replace(workload, concurrency=None, request_rate=None)
    for nodes, gpus in search_shapes(hardware):
        candidate = replace(hardware, nodes=nodes, gpus_per_node=gpus)
        ranked = rank_layouts(all_layouts(spec, candidate, no_target, settings), None)
        if ranked:
            best = ranked[0]
            return SmallestFit(
                nodes=nodes,
                gpus_per_node=gpus,
                gpu_memory_gib=hardware.gpu_memory_gib,
                tensor_parallel=best.tensor_parallel,
                pipeline_parallel=best.pipeline_parallel,
            )
    return None


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


def _budget_words(plan: Plan) -> str:
    hw, settings = plan.hardware, plan.settings
    if settings.kv_cache_gib is not None:
        return f"{hw.gpu_memory_gib:g} GiB per GPU with {settings.kv_cache_gib:g} GiB fixed for KV cache"
    usable = hw.gpu_memory_gib * settings.gpu_memory_utilization
    return f"{usable:.1f} GiB usable per GPU ({hw.gpu_memory_gib:g} GiB x {settings.gpu_memory_utilization:g})"


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
        f"{_gib(layout.weights_gib_per_gpu)} per GPU of {_budget_words(plan)}, leaving "
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
    words = f"target of {target} concurrent sequences needs {needed} replica(s) of {layout.max_concurrent_seqs}"
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


def no_fit_reasons(plan: Plan) -> list[str]:
    hw = plan.hardware
    reasons = [
        model_reason(plan.spec),
        f"no layout fits on {hw.nodes} node(s) x {hw.gpus_per_node} GPU(s) with "
        f"{_budget_words(plan)}: weights, activations and one {plan.workload.context_len:,}-token "
        "sequence of KV cache do not fit",
    ]
    fit = plan.smallest_fit
    if fit is None:
        reasons.append(
            f"nothing up to {MAX_SEARCH_NODES} nodes of these GPUs holds it: use larger GPUs, "
            "quantized weights, or a shorter --context-len"
        )
    else:
        reasons.append(
            f"smallest hardware that fits: {fit.nodes} node(s) x {fit.gpus_per_node} GPU(s) of "
            f"{fit.gpu_memory_gib:g} GiB with TP={fit.tensor_parallel} x PP={fit.pipeline_parallel}"
        )
    return reasons
