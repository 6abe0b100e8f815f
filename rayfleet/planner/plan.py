"""The planner's answer: the chosen layout, the alternatives, and the reasons in plain words.

``make_plan(spec, hardware, workload, settings)`` ranks every layout and returns a Plan
with its reasons (``reasons.py`` words them); for a model that fits nowhere, the smallest
hardware of the same GPU that would hold it. It never prints; ``report.py`` turns a Plan
into tables or JSON, ``options.plan_model`` builds the inputs from ``rayfleet plan``'s flags.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field, replace
from typing import Any

from rayfleet.errors import ConfigError
from rayfleet.planner.hardware import Hardware
from rayfleet.planner.layout import (
    Layout,
    Workload,
    all_layouts,
    rank_layouts,
)
from rayfleet.planner.memory import GiB, MemorySettings, kv_bytes_per_token, total_weight_bytes
from rayfleet.planner.model_spec import ModelSpec
from rayfleet.planner.params import count_params
from rayfleet.planner.reasons import attention_kind, budget_words, fit_reasons, model_reason

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

    @property
    def verdict(self) -> str:
        """One line: fits or not, on what, with which split."""
        hw = self.hardware
        where = f"{hw.nodes} node(s) x {hw.gpus_per_node} GPU(s) of {hw.gpu_memory_gib:g} GiB"
        layout = self.chosen
        if layout is None:
            return f"Does not fit on {where}."
        ray = "Ray needed" if layout.needs_ray else "Ray optional"
        return (
            f"Fits on {where}: TP={layout.tensor_parallel} x "
            f"PP={layout.pipeline_parallel}, {self.replicas} replica(s), {ray}."
        )

    def to_dict(self) -> dict[str, Any]:
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


def _layout_dict(layout: Layout) -> dict[str, Any]:
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


def _empty_layout() -> dict[str, Any]:
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


def _model_dict(spec: ModelSpec) -> dict[str, Any]:
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


def no_fit_reasons(plan: Plan) -> list[str]:
    hw = plan.hardware
    reasons = [
        model_reason(plan.spec),
        f"no layout fits on {hw.nodes} node(s) x {hw.gpus_per_node} GPU(s) with "
        f"{budget_words(plan)}: weights, activations and one {plan.workload.context_len:,}-token "
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
