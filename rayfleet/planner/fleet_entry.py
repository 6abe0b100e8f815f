"""The chosen layout as a fleet.yaml model entry (``rayfleet plan --emit fleet.yaml``).

    fleet_entry(plan, name)                      -> {"models": [entry]}
    render_fleet_entry(plan, name, command)      -> the YAML text, comments first
    write_fleet_entry(plan, path, name, command) -> writes it; refuses a plan that does not fit

The file holds a top-level ``models:`` list with one entry, so a user can paste it into a
fleet.yaml, and it validates as one (``parse_fleet``). What it writes is what starts on
the planned hardware:

- ``source``: the model directory (or hub id) the config came from, not the config.json;
- ``accelerator: gpu`` and ``num_gpus``: the GPUs each replica reserves on each of its
  nodes (TP x PP / nodes per replica), so Ray never packs two replicas onto one GPU;
- ``nodes_per_replica`` when the replica spans nodes (vLLM's multi-node launch, one rank
  per node; rayfleet/control/ranks.py);
- ``num_cpus`` and ``memory_gib`` per node, sized for a vLLM server or rank
  (``server_cpus``, ``server_memory_gib``);
- a comment with the plan's verdict and the command that produced it.

Engine arguments use vLLM's flag names with underscores.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from rayfleet.errors import RayfleetError
from rayfleet.planner.plan import Plan

# vLLM's server runs an API server process, an engine core process and one worker per GPU
# (vLLM's architecture overview); each busy-loops on a core of its own.
SERVER_PROCESSES = 2
# Host RAM per such process: torch, a CUDA context and pinned transfer buffers. A budget,
# not a measurement; weights are read through the page cache (mmap), which Ray does not count.
GIB_PER_PROCESS = 4


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
    return args


def model_source(source: str) -> str:
    """What vLLM loads: a config.json's directory, a directory, or the hub id as given."""
    path = Path(source).expanduser()
    if path.is_file():
        return str(path.resolve().parent)
    if path.is_dir():
        return str(path.resolve())
    return source


def server_cpus(gpus: int) -> int:
    return SERVER_PROCESSES + gpus


def server_memory_gib(gpus: int) -> int:
    return GIB_PER_PROCESS * server_cpus(gpus)


def resources(plan: Plan) -> dict[str, Any]:
    """What one replica reserves from Ray on each of its nodes, and how many nodes."""
    layout = plan.chosen
    assert layout is not None
    gpus = layout.gpus_per_replica // layout.nodes_per_replica
    shape = {"num_gpus": gpus, "num_cpus": server_cpus(gpus), "memory_gib": server_memory_gib(gpus)}
    if layout.nodes_per_replica > 1:
        shape["nodes_per_replica"] = layout.nodes_per_replica
    return shape


def fleet_entry(plan: Plan, name: str | None = None) -> dict[str, Any]:
    """``{"models": [entry]}`` for the plan's chosen layout."""
    entry = {
        "name": name or plan.spec.name,
        "source": model_source(plan.spec.source),
        "accelerator": "gpu",
        "replicas": max(plan.replicas, 1),
        **resources(plan),
        "engine_args": engine_args(plan),
    }
    return {"models": [entry]}


def header(plan: Plan, command: str | None) -> list[str]:
    """Comment lines: the verdict, the command, and how the resources were sized."""
    layout = plan.chosen
    assert layout is not None
    lines = [f"rayfleet plan: {plan.verdict}"]
    if command:
        lines.append(f"made by: {command}")
    if layout.needs_ray:
        lines.append(
            f"num_gpus 0: the {layout.gpus_per_replica} GPUs of a replica are one-GPU bundles "
            "of its placement group, one per engine worker (Ray actors)"
        )
    else:
        lines.append("num_gpus: the GPUs each replica reserves on its node (TP x PP)")
    lines.append(
        f"num_cpus: a core for vLLM's API server, one for its engine core, one per GPU worker; "
        f"memory_gib: {GIB_PER_PROCESS} GiB of host RAM for each of those processes"
    )
    return [f"# {line}" for line in lines]


def render_fleet_entry(plan: Plan, name: str | None = None, command: str | None = None) -> str:
    import yaml

    body = yaml.safe_dump(fleet_entry(plan, name), sort_keys=False)
    return "\n".join([*header(plan, command), body])


def write_fleet_entry(
    plan: Plan, path: Path, name: str | None = None, command: str | None = None
) -> None:
    if not plan.fits:
        raise RayfleetError(f"{path}: not written, the model does not fit this hardware")
    try:
        path.write_text(render_fleet_entry(plan, name, command))
    except OSError as exc:
        raise RayfleetError(f"{path}: cannot write the fleet entry ({exc.strerror})") from None
