"""The planner's verdicts on well-known public deployments.

Configs in tests/fixtures/planner are written from the published config.json files.
Each row states what practitioners report about that model on that hardware:

- Llama-3.1-8B, bf16 (16 GB of weights): serves on one 24 GB GPU at 8k context, but a
  full 128k-token sequence (16 GiB of KV cache alone) does not fit next to the weights.
- Llama-3.1-70B, bf16 (141 GB): fits neither one 80 GB H100 nor one 141 GB H200;
  TP=2 on an 8xH100 node is the smallest split. In fp8 (~72 GB) it runs on one H200
  but not on one H100.
- Llama-3.1-405B, bf16 (~810 GB): more than one 8xH100 node (640 GB), so Meta's
  reference runs it on two nodes (TP=8 x PP=2); one 8xH200 node (1.1 TB) holds it.
  In fp8 it fits one 8xH100 node (Meta's FP8 release targets exactly that). The
  AWQ int4 build (~203 GiB) needs four 80 GB GPUs, not two.
- Mixtral-8x7B, bf16 (93 GB): two 80 GB GPUs, or one 141 GB H200.
- DeepSeek-V3, fp8 (~671 GB): two 8xH100 nodes (TP=8 x PP=2, as in vLLM's
  multi-node example), or one 8xH200 node; in bf16 (1.3 TB) two 8xH200 nodes.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from rayfleet.planner.hardware import Hardware
from rayfleet.planner.layout import Workload
from rayfleet.planner.memory import MemorySettings
from rayfleet.planner.model_spec import load_model_spec
from rayfleet.planner.plan import make_plan

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "planner"

# model, quantization, nodes, GPUs per node, GiB per GPU, context,
#   expected: fits, (TP, PP) or the smallest fit's (nodes, GPUs per node), needs Ray
DEPLOYMENTS = [
    ("llama-3.1-8b", None, 1, 1, 24, 8192, True, (1, 1), False),
    ("llama-3.1-8b", None, 1, 1, 24, 131072, False, (1, 2), False),
    ("llama-3.1-8b", None, 1, 8, 80, 131072, True, (1, 1), False),
    ("llama-3.1-70b", None, 1, 1, 80, 8192, False, (1, 2), False),
    ("llama-3.1-70b", None, 1, 1, 141, 8192, False, (1, 2), False),
    ("llama-3.1-70b", None, 1, 8, 80, 8192, True, (2, 1), False),
    ("llama-3.1-70b", "fp8", 1, 1, 141, 32768, True, (1, 1), False),
    ("llama-3.1-70b", "fp8", 1, 1, 80, 8192, False, (1, 2), False),
    ("llama-3.1-405b", None, 1, 8, 80, 8192, False, (2, 8), False),
    ("llama-3.1-405b", None, 2, 8, 80, 8192, True, (8, 2), True),
    ("llama-3.1-405b", None, 1, 8, 141, 8192, True, (8, 1), False),
    ("llama-3.1-405b", "fp8", 1, 8, 80, 8192, True, (8, 1), False),
    ("llama-3.1-405b-awq-int4", None, 1, 4, 80, 8192, True, (4, 1), False),
    ("llama-3.1-405b-awq-int4", None, 1, 2, 80, 8192, False, (1, 4), False),
    ("mixtral-8x7b", None, 1, 1, 80, 8192, False, (1, 2), False),
    ("mixtral-8x7b", None, 1, 2, 80, 8192, True, (2, 1), False),
    ("mixtral-8x7b", None, 1, 1, 141, 8192, True, (1, 1), False),
    ("deepseek-v3", None, 1, 8, 80, 8192, False, (2, 8), False),
    ("deepseek-v3", None, 2, 8, 80, 8192, True, (8, 2), True),
    ("deepseek-v3", None, 1, 8, 141, 8192, True, (8, 1), False),
    ("deepseek-v3", "none", 1, 8, 141, 8192, False, (2, 8), False),
    ("deepseek-v3", "none", 2, 8, 141, 8192, True, (8, 2), True),
]


@pytest.mark.parametrize(
    ("model", "quantization", "nodes", "gpus", "gib", "context", "fits", "shape", "ray"),
    DEPLOYMENTS,
    ids=[f"{d[0]}-{d[1] or 'ckpt'}-{d[2]}x{d[3]}x{d[4]}G-{d[5]}" for d in DEPLOYMENTS],
)
def test_public_deployment_verdict(
    model, quantization, nodes, gpus, gib, context, fits, shape, ray
):
    spec = load_model_spec(str(FIXTURES / model), quantization=quantization)
    hardware = Hardware(gpus_per_node=gpus, gpu_memory_gib=gib, nodes=nodes, inter_node_gbps=100)
    plan = make_plan(spec, hardware, Workload(context_len=context), MemorySettings()).to_dict()
    assert plan["fits"] is fits
    assert plan["needs_ray"] is ray
    if fits:
        assert (plan["tensor_parallel"], plan["pipeline_parallel"]) == shape
        assert plan["max_concurrent_seqs"] >= 1
        assert plan["weights_gib_per_gpu"] + plan["kv_cache_gib_per_gpu"] <= gib * 0.9
    else:
        smallest = plan["smallest_fit"]
        assert (smallest["nodes"], smallest["gpus_per_node"]) == shape
        assert plan["max_concurrent_seqs"] == 0
