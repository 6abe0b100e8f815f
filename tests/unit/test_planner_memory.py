"""KV cache per token (MHA, GQA, MLA), weights per GPU, and capacity under a budget."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from rayfleet.planner.memory import (
    GiB,
    MemorySettings,
    gpu_memory,
    kv_bytes_per_token,
    kv_bytes_per_token_per_layer,
    stage_layer_counts,
    total_weight_bytes,
)
from rayfleet.planner.model_spec import load_model_spec

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "planner"


def spec_of(name: str, **overrides):
    return load_model_spec(str(FIXTURES / name), **overrides)


def mha_spec(tmp_path: Path):
    config = {
        "hidden_size": 256,
        "intermediate_size": 512,
        "num_hidden_layers": 4,
        "num_attention_heads": 4,
        "head_dim": 64,
        "vocab_size": 1000,
        "max_position_embeddings": 2048,
        "torch_dtype": "bfloat16",
    }
    path = tmp_path / "config.json"
    path.write_text(json.dumps(config))
    return load_model_spec(str(path))


def test_mha_kv_per_token(tmp_path):
    # K and V for 4 heads x 64 dims, 2 bytes each, 4 layers
    assert kv_bytes_per_token(mha_spec(tmp_path)) == 2 * 4 * 64 * 2 * 4


@pytest.mark.parametrize(
    ("name", "expected"),
    [
        ("llama-3.1-8b", 128 * 1024),  # 32 layers x 2 x 8 KV heads x 128 x 2 bytes
        ("llama-3.1-70b", 320 * 1024),  # 80 layers x 2 x 8 x 128 x 2
        ("deepseek-v3", (512 + 64) * 61 * 2),  # MLA: latent + rotary key, 61 layers
    ],
)
def test_kv_per_token_gqa_and_mla(name, expected):
    assert kv_bytes_per_token(spec_of(name)) == expected


def test_fp8_kv_cache_halves_bf16():
    spec = spec_of("llama-3.1-8b")
    assert kv_bytes_per_token_per_layer(spec, 1, "fp8") * 2 == kv_bytes_per_token_per_layer(spec, 1)


def test_tp_splits_kv_heads_until_one_per_rank():
    spec = spec_of("llama-3.1-8b")
    assert kv_bytes_per_token_per_layer(spec, 8) == 2 * 1 * 128 * 2
    assert kv_bytes_per_token_per_layer(spec, 16) == kv_bytes_per_token_per_layer(spec, 8)


def test_mla_latent_is_replicated_on_every_tp_rank():
    spec = spec_of("deepseek-v3")
    assert kv_bytes_per_token_per_layer(spec, 8) == kv_bytes_per_token_per_layer(spec, 1)


def test_stage_layers_split_like_vllm():
    assert stage_layer_counts(61, 2) == [31, 30]
    assert stage_layer_counts(126, 4) == [31, 32, 32, 31]
    assert stage_layer_counts(32, 1) == [32]


def test_weights_by_format():
    bf16 = total_weight_bytes(spec_of("llama-3.1-8b"))
    assert bf16 / GiB == pytest.approx(14.96, abs=0.01)
    fp8 = total_weight_bytes(spec_of("llama-3.1-8b", quantization="fp8"))
    kept_bf16 = (2 * 128256 * 4096 + (2 * 32 + 1) * 4096) * 2  # embeddings, head and norms
    assert fp8 == pytest.approx((bf16 - kept_bf16) / 2 + kept_bf16, rel=1e-9)
    awq = total_weight_bytes(spec_of("llama-3.1-405b-awq-int4"))
    assert 200 * 1e9 < awq < 225 * 1e9  # ~203 GiB of 4-bit weights plus scales, fp16 embeddings


def test_weights_shard_over_tp_and_pp():
    spec = spec_of("llama-3.1-70b")
    settings = MemorySettings()
    one = gpu_memory(spec, 1, 1, 1000, settings).weights_bytes
    tp4 = gpu_memory(spec, 4, 1, 1000, settings).weights_bytes
    pp4 = gpu_memory(spec, 1, 4, 1000, settings).weights_bytes
    assert tp4 == pytest.approx(one / 4, rel=0.01)
    assert pp4 == pytest.approx(one / 4, rel=0.05)


def test_fixed_kv_space_sets_capacity_in_whole_blocks():
    spec = spec_of("llama-3.1-8b")
    memory = gpu_memory(spec, 1, 1, 80, MemorySettings(kv_cache_gib=1, block_size=16))
    assert memory.kv_tokens == (GiB // (128 * 1024 * 16)) * 16 == 8192
    assert memory.kv_cache_bytes == GiB


def test_utilization_budget_leaves_kv_after_weights():
    spec = spec_of("llama-3.1-8b")
    memory = gpu_memory(spec, 1, 1, 80, MemorySettings(gpu_memory_utilization=0.9))
    left = memory.budget_bytes - memory.weights_bytes - memory.activation_bytes
    left -= memory.overhead_bytes
    assert memory.kv_cache_bytes == pytest.approx(left, abs=1)
    assert memory.kv_tokens == pytest.approx(left / (128 * 1024), rel=0.001)


def test_no_room_gives_no_tokens():
    memory = gpu_memory(spec_of("llama-3.1-70b"), 1, 1, 80, MemorySettings())
    assert (memory.kv_tokens, memory.kv_cache_bytes) == (0, 0)
