"""The chosen layout as a fleet.yaml model entry (``rayfleet plan --emit fleet.yaml``).

The file holds a top-level ``models:`` list with one entry, so a user can paste it
into a fleet.yaml. Engine arguments use vLLM's flag names with underscores.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from rayfleet.errors import RayfleetError
from rayfleet.planner.plan import Plan


def engine_args(plan: Plan) -> dict[str, Any]:
    """vLLM engine arguments that reproduce the plan."""
    layout = plan.chosen
    assert layout is not None  # only plans that fit are emitted
    args: dict[str, Any] = {
        "tensor_parallel_size": layout.tensor_parallel,
        "pipeline_parallel_size": layout.pipeline_parallel,
        "max_model_len": plan.workload.context_len,
    }
    settings = plan.settings
    if settings.kv_cache_gib is None:
        args["gpu_memory_utilization"] = settings.gpu_memory_utilization
    else:
        args["kv_cache_memory_bytes"] = int(settings.kv_cache_gib * 1024**3)
    if settings.kv_cache_dtype != "auto":
        args["kv_cache_dtype"] = settings.kv_cache_dtype
    if plan.spec.dtype_override:
        args["dtype"] = plan.spec.dtype_override
    if plan.spec.online_quantization:
        args["quantization"] = plan.spec.online_quantization
    if layout.needs_ray:
        args["distributed_executor_backend"] = "ray"
    return args


def placement_strategy(plan: Plan) -> str:
    layout = plan.chosen
    assert layout is not None
    # One node's GPUs must stay together; a multi-node replica packs as tightly as it can.
    if layout.gpus_per_replica > 1 and layout.nodes_per_replica == 1:
        return "STRICT_PACK"
    return "PACK"


def fleet_entry(plan: Plan, name: str | None = None) -> dict[str, Any]:
    """``{"models": [entry]}`` for the plan's chosen layout."""
    return {
        "models": [
            {
                "name": name or plan.spec.name,
                "source": plan.spec.source,
                "engine_args": engine_args(plan),
                "replicas": max(plan.replicas, 1),
                "num_cpus": 1,
                "num_gpus": 0,
                "placement_strategy": placement_strategy(plan),
            }
        ]
    }


def write_fleet_entry(plan: Plan, path: Path, name: str | None = None) -> None:
    import yaml

    if not plan.fits:
        raise RayfleetError(f"{path}: not written, the model does not fit this hardware")
    text = yaml.safe_dump(fleet_entry(plan, name), sort_keys=False)
    try:
        path.write_text(text)
    except OSError as exc:
        raise RayfleetError(f"{path}: cannot write the fleet entry ({exc.strerror})") from None
