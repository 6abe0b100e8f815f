"""The planner's memory model against what a real vLLM reports when it starts the same model.

On CPU, vLLM sizes the KV cache from ``VLLM_CPU_KVCACHE_SPACE`` (GiB), not from
``gpu_memory_utilization``, so the planner is given the same number as
``--kv-cache-gib`` and vLLM CPU's block size (128). What is compared:

- KV capacity: the planner's ``kv_tokens_per_replica`` against vLLM's
  "CPU KV cache size: N tokens" log line.
- Weights: the planner's ``weights_gib_per_gpu`` against vLLM's "Checkpoint size: X GiB"
  log line (two decimals) and, exactly, against the bytes of the tensors vLLM's own
  safetensors loader yields for the model (the CPU backend repacks linear weights
  into oneDNN buffers, so the loaded module's parameters cannot be summed).

One server per model, one at a time, always stopped.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from rayfleet.planner.hardware import Hardware
from rayfleet.planner.layout import Workload
from rayfleet.planner.memory import GiB, MemorySettings
from rayfleet.planner.model_spec import load_model_spec
from rayfleet.planner.plan import make_plan
from tests.integration.fleet import serving_engine

pytestmark = pytest.mark.integration

KV_CACHE_GIB = 1
CONTEXT_LEN = 1024
VLLM_CPU_BLOCK_SIZE = 128
ENGINE_ARGS = {"enforce_eager": True, "max_model_len": CONTEXT_LEN, "dtype": "float32"}
TOLERANCE = 0.10
LOG_GIB_RESOLUTION = 0.005  # the checkpoint line prints GiB with two decimals

KV_TOKENS_LINE = re.compile(r"KV cache size: ([\d,]+) tokens")
CHECKPOINT_LINE = re.compile(r"Checkpoint size: ([\d.]+) GiB")
KV_SPACE_LINE = re.compile(r"Explicitly set \(([\d.]+)/([\d.]+)\) GiB for KV cache")


def vllm_startup_report(model_dir: Path, name: str) -> dict[str, float]:
    """Start vLLM on ``model_dir``, wait until healthy, stop it, and parse its log."""
    env = {"VLLM_CPU_KVCACHE_SPACE": str(KV_CACHE_GIB)}
    with serving_engine(model_dir, name, ENGINE_ARGS, env=env) as engine:
        pass
    log = engine.log_path.read_text(errors="replace")
    kv_tokens = KV_TOKENS_LINE.search(log)
    checkpoint = CHECKPOINT_LINE.search(log)
    kv_space = KV_SPACE_LINE.search(log)
    assert kv_tokens and checkpoint and kv_space, f"startup lines missing in {engine.log_path}"
    return {
        "kv_tokens": int(kv_tokens.group(1).replace(",", "")),
        "checkpoint_gib": float(checkpoint.group(1)),
        "kv_space_gib": float(kv_space.group(1)),
        "node_memory_gib": float(kv_space.group(2)),
    }


def loader_weight_bytes(model_dir: Path) -> int:
    """Bytes of every tensor vLLM's safetensors loader reads for this model."""
    from vllm.model_executor.model_loader.weight_utils import safetensors_weights_iterator

    files = sorted(str(p) for p in model_dir.glob("*.safetensors"))
    return sum(t.numel() * t.element_size() for _, t in safetensors_weights_iterator(files, False))


def planned(model_dir: Path, node_memory_gib: float):
    spec = load_model_spec(str(model_dir), dtype="float32")
    hardware = Hardware(gpus_per_node=1, gpu_memory_gib=node_memory_gib)
    settings = MemorySettings(kv_cache_gib=KV_CACHE_GIB, block_size=VLLM_CPU_BLOCK_SIZE)
    return make_plan(spec, hardware, Workload(context_len=CONTEXT_LEN), settings).to_dict()


@pytest.mark.parametrize("model_fixture", ["tiny_model", "demo_model"])
def test_prediction_matches_vllm_startup(model_fixture, request):
    model_dir = Path(request.getfixturevalue(model_fixture))
    report = vllm_startup_report(model_dir, model_fixture.replace("_", "-"))
    plan = planned(model_dir, report["node_memory_gib"])

    assert plan["fits"] is True
    assert (plan["tensor_parallel"], plan["pipeline_parallel"]) == (1, 1)
    assert report["kv_space_gib"] == KV_CACHE_GIB
    assert plan["kv_tokens_per_replica"] == pytest.approx(report["kv_tokens"], rel=TOLERANCE)
    assert plan["max_concurrent_seqs"] == report["kv_tokens"] // CONTEXT_LEN

    predicted_gib = plan["weights_gib_per_gpu"]
    assert abs(predicted_gib - report["checkpoint_gib"]) <= max(
        TOLERANCE * report["checkpoint_gib"], LOG_GIB_RESOLUTION
    )
    loaded_gib = loader_weight_bytes(model_dir) / GiB
    assert predicted_gib == pytest.approx(loaded_gib, rel=TOLERANCE)
