"""Whether a model's replica shape can hold its engine: one rule set, one line each.

``shape_problem(model)`` is what ``ModelConfig``'s validator asks: the executor (vLLM's
multiprocessing one; the Ray executor is refused), the nodes (``nodes_per_replica``
divides TP x PP; the multi-node flags are rayfleet's to set), then the GPUs
(``gpu_shortfall``, rayfleet/config/gpus.py). It returns the first reason, with the
fix, or None.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from rayfleet.config.gpus import gpu_shortfall

if TYPE_CHECKING:
    from rayfleet.config.models import ModelConfig

# vLLM's multi-node flags: rayfleet sets them for every rank of a replica.
RANK_ENGINE_ARGS = ("nnodes", "node_rank", "master_addr", "master_port", "headless")


def shape_problem(model: ModelConfig) -> str | None:
    return (
        _simulator_problem(model)
        or _executor_problem(model)
        or _nodes_problem(model)
        or gpu_shortfall(model)
    )


def _simulator_problem(model: ModelConfig) -> str | None:
    if model.engine != "sim":
        return None
    if model.engine_args:
        return (
            f"engine sim takes no engine_args (got {', '.join(model.engine_args)}); remove them, "
            "or put a calibrated spec (`rayfleet sim calibrate --out spec.json`) in source"
        )
    if model.nodes_per_replica > 1 or model.gpu_engine:
        return "engine sim runs on one node with no GPU; set nodes_per_replica: 1 and num_gpus: 0"
    return None


def _executor_problem(model: ModelConfig) -> str | None:
    backend = model.engine_args.get("distributed_executor_backend")
    if backend == "ray":
        return (
            "engine_args.distributed_executor_backend 'ray' is not supported: the vLLM "
            "server is a process of its own, outside the replica's placement group; remove "
            "it (vLLM's default multiprocessing executor), and set nodes_per_replica to span nodes"
        )
    return None


def _nodes_problem(model: ModelConfig) -> str | None:
    nodes, world = model.nodes_per_replica, model.world_size
    if nodes > 1 and world % nodes:
        return (
            f"nodes_per_replica {nodes} does not divide tensor_parallel_size "
            f"{model.tensor_parallel_size} x pipeline_parallel_size "
            f"{model.pipeline_parallel_size} = {world} workers evenly; set nodes_per_replica "
            f"to a divisor of {world}"
        )
    taken = [key for key in RANK_ENGINE_ARGS if key in model.engine_args]
    if taken:
        return (
            f"engine_args.{taken[0]} is set by rayfleet for each rank of a replica; "
            "use nodes_per_replica instead"
        )
    return None
