"""Which (TP, PP) shapes are allowed, what communication they cost, how one is chosen."""

from __future__ import annotations

import json
from pathlib import Path

from rayfleet.planner.hardware import Hardware
from rayfleet.planner.layout import (
    Workload,
    all_layouts,
    candidate_shapes,
    comm_us_per_token,
    rank_layouts,
)
from rayfleet.planner.memory import MemorySettings
from rayfleet.planner.model_spec import load_model_spec

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "planner"


def spec_of(name: str):
    return load_model_spec(str(FIXTURES / name))


def test_tp_divides_heads_and_kv_heads(tmp_path):
    path = tmp_path / "config.json"
    path.write_text(
        json.dumps(
            {
                "hidden_size": 768,
                "num_hidden_layers": 4,
                "num_attention_heads": 12,
                "num_key_value_heads": 4,
                "vocab_size": 100,
                "max_position_embeddings": 512,
            }
        )
    )
    spec = load_model_spec(str(path))
    shapes = candidate_shapes(spec, Hardware(gpus_per_node=8, gpu_memory_gib=80))
    # 12 heads: 1, 2, 3, 4, 6 divide; 3 and 6 neither divide 4 KV heads nor are multiples of 4
    assert sorted({tp for tp, _ in shapes}) == [1, 2, 4]


def test_tp_stays_inside_a_node_unless_the_link_is_fast():
    spec = spec_of("llama-3.1-405b")
    slow = Hardware(gpus_per_node=8, gpu_memory_gib=80, nodes=2, inter_node_gbps=100)
    fast = Hardware(gpus_per_node=8, gpu_memory_gib=80, nodes=2, inter_node_gbps=400)
    assert max(tp for tp, _ in candidate_shapes(spec, slow)) == 8
    assert (16, 1) in candidate_shapes(spec, fast)


def test_multi_node_replicas_take_whole_nodes():
    spec = spec_of("llama-3.1-70b")
    hw = Hardware(gpus_per_node=8, gpu_memory_gib=80, nodes=3)
    for tp, pp in candidate_shapes(spec, hw):
        assert tp * pp <= 8 or (tp * pp) % 8 == 0


def test_pp_over_a_slow_link_costs_more_than_over_a_fast_one():
    spec = spec_of("llama-3.1-405b")
    fast = Hardware(gpus_per_node=8, gpu_memory_gib=80, nodes=2, inter_node_gbps=400)
    slow = Hardware(gpus_per_node=8, gpu_memory_gib=80, nodes=2, inter_node_gbps=1)
    assert comm_us_per_token(spec, 8, 2, 2, slow) > 10 * comm_us_per_token(spec, 8, 2, 2, fast)
    # TP all-reduces twice per layer: far more traffic than one PP hand-off per stage
    assert comm_us_per_token(spec, 16, 1, 2, fast) > comm_us_per_token(spec, 8, 2, 2, fast)


def test_request_rate_becomes_concurrency_by_littles_law():
    workload = Workload(context_len=4096, request_rate=10, output_len=256, tpot_ms=50)
    assert workload.target_concurrency() == 128
    assert Workload(context_len=4096, concurrency=500, request_rate=1).target_concurrency() == 500
    assert Workload(context_len=4096).target_concurrency() is None


def test_ranking_prefers_one_gpu_replicas_when_the_model_fits_one_gpu():
    spec = spec_of("llama-3.1-8b")
    hw = Hardware(gpus_per_node=8, gpu_memory_gib=80)
    ranked = rank_layouts(all_layouts(spec, hw, Workload(context_len=8192), MemorySettings()), None)
    best = ranked[0]
    assert (best.tensor_parallel, best.pipeline_parallel, best.replicas) == (1, 1, 8)
    assert all(layout.fits for layout in ranked)


def test_a_target_load_can_pick_a_wider_replica():
    spec = spec_of("llama-3.1-70b")
    hw = Hardware(gpus_per_node=8, gpu_memory_gib=80)
    layouts = all_layouts(spec, hw, Workload(context_len=8192), MemorySettings())
    assert rank_layouts(layouts, None)[0].tensor_parallel == 2
    assert rank_layouts(layouts, 100)[0].tensor_parallel == 4
