"""Memory of one GPU in one replica: weights, KV cache, activations and runtime overhead.

A replica of tensor parallel size ``tp`` and pipeline parallel size ``pp`` has ``pp``
stages of ``tp`` GPUs. Every GPU of a stage holds ``1/tp`` of the stage's sharded
weights plus the replicated ones; the first stage also holds the embedding and the last
the output head. vLLM gives every GPU the same number of KV blocks, so a replica's KV
capacity is set by its most crowded GPU.

The budget per GPU is ``gpu_memory_gib * gpu_memory_utilization``, as in vLLM. When
``kv_cache_gib`` is set, the KV cache gets exactly that much per GPU instead (vLLM's
``kv_cache_memory_bytes``; on CPU, ``VLLM_CPU_KVCACHE_SPACE``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from rayfleet.planner.model_spec import ModelSpec
from rayfleet.planner.params import LayerParams, ModelParams, count_params
from rayfleet.planner.weight_format import DTYPE_BYTES

GiB = 1024**3
# CUDA context, CUDA graphs, allocator slack: measured vLLM servers sit near 1 GiB per GPU.
RUNTIME_OVERHEAD_GIB = 1.0
# NCCL buffers and communicator state on each GPU of a multi-GPU replica.
COLLECTIVE_OVERHEAD_GIB = 0.5
# Scale and zero point per group of int4 weights: an fp16 scale and a 4-bit zero.
INT4_GROUP_OVERHEAD_BYTES = 2.5
# Logits are computed in float32 for every sequence in a batch.
LOGIT_BYTES = 4
# Live activation tensors per token during the profiling forward pass, in hidden sizes
# (residual, normed input, attention output, q/k/v) plus the MLP's widest tensors.
ACTIVATION_HIDDEN_COPIES = 4
ACTIVATION_MLP_COPIES = 3


@dataclass(frozen=True)
class MemorySettings:
    """vLLM engine settings that decide how memory is shared out."""

    gpu_memory_utilization: float = 0.9
    kv_cache_dtype: str = "auto"  # auto (the model's dtype) or fp8
    kv_cache_gib: float | None = None  # fixed KV cache per GPU; overrides the utilization
    block_size: int = 16
    max_num_batched_tokens: int = 8192
    max_num_seqs: int = 256


@dataclass(frozen=True)
class GpuMemory:
    """Memory of the most loaded GPU of one replica, and the replica's KV capacity."""

    weights_bytes: int
    activation_bytes: int
    overhead_bytes: int
    kv_cache_bytes: int  # per GPU, on the GPU with the least room
    kv_tokens: int  # tokens the replica can hold in KV cache
    budget_bytes: int  # what the GPU may use in total


def stage_layer_counts(num_layers: int, pp: int) -> list[int]:
    """Layers per pipeline stage, split as vLLM does (extra layers go to the middle stages)."""
    counts = [num_layers // pp] * pp
    for i in range(num_layers % pp):
        counts[-(i + 2) if pp > 1 else 0] += 1
    return counts


def linear_bytes(spec: ModelSpec, num_weights: float) -> float:
    """Bytes of linear-layer weights stored in the model's weight format."""
    fmt = spec.weight_format
    per_weight = DTYPE_BYTES[fmt]
    if fmt == "int4":
        per_weight += INT4_GROUP_OVERHEAD_BYTES / max(spec.quant_group_size, 1)
    return num_weights * per_weight


def dtype_bytes(spec: ModelSpec) -> float:
    return DTYPE_BYTES[spec.dtype]


def total_weight_bytes(spec: ModelSpec) -> int:
    """All weights of the model, as one GPU would hold them with TP=1 and PP=1."""
    return int(sum(stage_weight_bytes(spec, count_params(spec), 1, 1)))


def layer_bytes_per_gpu(spec: ModelSpec, layer: LayerParams, tp: int) -> float:
    kv_heads = spec.attention.num_kv_heads
    kv_share = math.ceil(kv_heads / tp) / kv_heads  # replicated once tp exceeds the KV heads
    linear = layer.sharded_linear / tp + layer.replicated_linear + layer.kv_linear * kv_share
    return linear_bytes(spec, linear) + layer.other * dtype_bytes(spec)


def stage_weight_bytes(spec: ModelSpec, params: ModelParams, tp: int, pp: int) -> list[float]:
    """Weight bytes on one GPU of each pipeline stage."""
    per_dense = layer_bytes_per_gpu(spec, params.dense_layer, tp)
    per_moe = layer_bytes_per_gpu(spec, params.moe_layer, tp)
    is_dense = _dense_layer_flags(spec)
    stages, start = [], 0
    for count in stage_layer_counts(spec.num_layers, pp):
        flags = is_dense[start : start + count]
        stages.append(sum(per_dense if dense else per_moe for dense in flags))
        start += count
    vocab_bytes = params.embedding / tp * dtype_bytes(spec)
    stages[0] += vocab_bytes
    # A tied output head shares the embedding only when both live on the same GPU.
    if params.lm_head or pp > 1:
        stages[-1] += vocab_bytes
    stages[-1] += params.final_norm * dtype_bytes(spec)
    return stages


def _dense_layer_flags(spec: ModelSpec) -> list[bool]:
    experts = spec.experts
    if not experts.is_moe:
        return [True] * spec.num_layers
    return [
        i < experts.num_dense_layers or i % experts.moe_layer_freq != 0
        for i in range(spec.num_layers)
    ]


def kv_bytes_per_token_per_layer(spec: ModelSpec, tp: int, kv_cache_dtype: str = "auto") -> float:
    """KV cache bytes one token needs in one layer on one GPU.

    MHA and GQA store a key and a value per KV head; TP splits the KV heads (each rank
    keeps at least one). MLA stores one compressed latent plus the rotary key per
    token, which every TP rank keeps whole.
    """
    element = 1.0 if kv_cache_dtype == "fp8" else dtype_bytes(spec)
    att = spec.attention
    if att.is_mla:
        return (att.kv_lora_rank + att.qk_rope_head_dim) * element
    return 2 * math.ceil(att.num_kv_heads / tp) * att.head_dim * element


def kv_bytes_per_token(spec: ModelSpec, kv_cache_dtype: str = "auto") -> float:
    """KV cache bytes per token for the whole model (all layers, unsharded)."""
    return kv_bytes_per_token_per_layer(spec, 1, kv_cache_dtype) * spec.num_layers


def activation_bytes(spec: ModelSpec, tp: int, settings: MemorySettings) -> int:
    """Peak activations of the profiling forward pass on one GPU (an estimate)."""
    experts = spec.experts
    mlp_width = spec.intermediate_size
    if experts.is_moe:
        routed = experts.num_experts_per_token * experts.expert_intermediate_size
        mlp_width = max(mlp_width, routed + experts.shared_intermediate_size)
    per_token = ACTIVATION_HIDDEN_COPIES * spec.hidden_size + ACTIVATION_MLP_COPIES * mlp_width / tp
    forward = settings.max_num_batched_tokens * per_token * dtype_bytes(spec)
    logits = settings.max_num_seqs * spec.vocab_size * LOGIT_BYTES
    return int(forward + logits)


def overhead_bytes(tp: int, pp: int) -> int:
    gib = RUNTIME_OVERHEAD_GIB + (COLLECTIVE_OVERHEAD_GIB if tp * pp > 1 else 0.0)
    return int(gib * GiB)


def gpu_memory(
    spec: ModelSpec, tp: int, pp: int, gpu_memory_gib: float, settings: MemorySettings
) -> GpuMemory:
    """Memory of the fullest GPU of a (tp, pp) replica and the replica's KV tokens."""
    params = count_params(spec)
    weights = stage_weight_bytes(spec, params, tp, pp)
    activations = activation_bytes(spec, tp, settings)
    overhead = overhead_bytes(tp, pp)
    per_layer = kv_bytes_per_token_per_layer(spec, tp, settings.kv_cache_dtype)
    if settings.kv_cache_gib is not None:
        budget = gpu_memory_gib * GiB
        kv_room = [settings.kv_cache_gib * GiB] * pp
        if max(weights) + activations + overhead + kv_room[0] > budget:
            kv_room = [0.0] * pp
    else:
        budget = gpu_memory_gib * GiB * settings.gpu_memory_utilization
        kv_room = [max(0.0, budget - w - activations - overhead) for w in weights]
    layer_counts = stage_layer_counts(spec.num_layers, pp)
    blocks = min(
        int(room // (per_layer * layers * settings.block_size))
        for room, layers in zip(kv_room, layer_counts, strict=True)
    )
    return GpuMemory(
        weights_bytes=int(max(weights)),
        activation_bytes=activations,
        overhead_bytes=overhead,
        kv_cache_bytes=int(min(kv_room)),
        kv_tokens=blocks * settings.block_size,
        budget_bytes=int(budget),
    )
