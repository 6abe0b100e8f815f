"""Parameter counts computed from a model's shape, split the way GPUs hold them.

Weights fall into two groups because quantized checkpoints treat them differently:
*linear* weights (attention projections, MLPs, experts) take the checkpoint's
weight format (fp8, int4, ...), while embeddings, the output head, norms and MoE
routers stay in the model's dtype. Each layer's linear weights are further split
into the part tensor parallelism shards and the part every TP rank replicates.
"""

from __future__ import annotations

from dataclasses import dataclass

from rayfleet.planner.model_spec import ModelSpec

GATED_MLP_MATRICES = 3  # gate, up and down projections (Llama, Mistral, Qwen, DeepSeek)


@dataclass(frozen=True)
class LayerParams:
    """One decoder layer's parameters."""

    sharded_linear: int  # divided over TP ranks
    replicated_linear: int  # held whole by every TP rank (MLA's down projections)
    kv_linear: int  # K and V projections: sharded, but replicated once TP exceeds KV heads
    other: int  # norms and routers, in the model's dtype, replicated


@dataclass(frozen=True)
class ModelParams:
    """Every parameter of a model, by where it lives."""

    embedding: int
    lm_head: int  # 0 when tied to the embedding
    dense_layer: LayerParams
    moe_layer: LayerParams
    num_dense_layers: int
    num_moe_layers: int
    final_norm: int

    @property
    def total(self) -> int:
        return (
            self.embedding
            + self.lm_head
            + self.final_norm
            + self.num_dense_layers * layer_total(self.dense_layer)
            + self.num_moe_layers * layer_total(self.moe_layer)
        )


def layer_total(layer: LayerParams) -> int:
    return layer.sharded_linear + layer.replicated_linear + layer.kv_linear + layer.other


def count_params(spec: ModelSpec) -> ModelParams:
    """Count a model's parameters from its config (speculative MTP layers excluded)."""
    embedding = spec.vocab_size * spec.hidden_size
    attention = _attention_params(spec)
    dense = _with_mlp(attention, dense_mlp_params(spec, spec.intermediate_size), 0)
    moe = _with_mlp(attention, *_moe_mlp_params(spec))
    return ModelParams(
        embedding=embedding,
        lm_head=0 if spec.tie_word_embeddings else embedding,
        dense_layer=dense,
        moe_layer=moe,
        num_dense_layers=spec.num_dense_layers,
        num_moe_layers=spec.num_moe_layers,
        final_norm=spec.hidden_size,
    )


def dense_mlp_params(spec: ModelSpec, intermediate_size: int) -> int:
    return GATED_MLP_MATRICES * spec.hidden_size * intermediate_size


def _with_mlp(attention: LayerParams, mlp_linear: int, router: int) -> LayerParams:
    return LayerParams(
        sharded_linear=attention.sharded_linear + mlp_linear,
        replicated_linear=attention.replicated_linear,
        kv_linear=attention.kv_linear,
        other=attention.other + router,
    )


def _moe_mlp_params(spec: ModelSpec) -> tuple[int, int]:
    """(expert and shared-expert linear weights, router weights) of one MoE layer."""
    experts = spec.experts
    if not experts.is_moe:
        return 0, 0
    routed = experts.num_experts * dense_mlp_params(spec, experts.expert_intermediate_size)
    shared = dense_mlp_params(spec, experts.shared_intermediate_size)
    router = experts.num_experts * spec.hidden_size
    return routed + shared, router


def _attention_params(spec: ModelSpec) -> LayerParams:
    att = spec.attention
    hidden = spec.hidden_size
    norms = 2 * hidden
    if att.is_mla:
        return _mla_params(spec, norms)
    q_and_o = 2 * hidden * att.num_heads * att.head_dim
    k_and_v = 2 * hidden * att.num_kv_heads * att.head_dim
    if att.bias:
        q_and_o += att.num_heads * att.head_dim
        k_and_v += 2 * att.num_kv_heads * att.head_dim
    return LayerParams(sharded_linear=q_and_o, replicated_linear=0, kv_linear=k_and_v, other=norms)


def _mla_params(spec: ModelSpec, norms: int) -> LayerParams:
    """DeepSeek's Multi-head Latent Attention: low-rank Q and KV, decompressed per head."""
    att = spec.attention
    hidden = spec.hidden_size
    q_head = att.qk_nope_head_dim + att.qk_rope_head_dim
    if att.q_lora_rank:
        q_down, q_up = hidden * att.q_lora_rank, att.q_lora_rank * att.num_heads * q_head
        norms += att.q_lora_rank
    else:
        q_down, q_up = 0, hidden * att.num_heads * q_head
    kv_down = hidden * (att.kv_lora_rank + att.qk_rope_head_dim)
    kv_up = att.kv_lora_rank * att.num_heads * (att.qk_nope_head_dim + att.v_head_dim)
    out = att.num_heads * att.v_head_dim * hidden
    return LayerParams(
        sharded_linear=q_up + kv_up + out,
        replicated_linear=q_down + kv_down,
        kv_linear=0,
        other=norms + att.kv_lora_rank,
    )
