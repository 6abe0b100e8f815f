"""Whether a model's replica reserves the GPUs its engine uses: one rule, one line.

``gpu_shortfall(model)`` is what ``ModelConfig``'s validator asks; it reads the model's
``gpu_engine``, ``gpus_per_node_needed`` (TP x PP / nodes per
replica, computed once on the model) and ``num_gpus``, and returns the reason with the fix,
or None.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from rayfleet.config.models import ModelConfig


def gpu_shortfall(model: ModelConfig) -> str | None:
    """Why ``model``'s replica cannot hold its GPU engine, in one line, or None.

    CPU engines (vLLM's CPU build) reserve no GPU and are never refused.
    """
    if model.accelerator == "cpu" and model.num_gpus > 0:
        return (
            f"accelerator is cpu but num_gpus is {model.num_gpus:g}; "
            "set num_gpus: 0 for vLLM's CPU build, or accelerator: gpu"
        )
    if not model.gpu_engine:
        return None
    need = model.gpus_per_node_needed
    shape = (
        f"tensor_parallel_size {model.tensor_parallel_size} x "
        f"pipeline_parallel_size {model.pipeline_parallel_size}"
    )
    if model.num_gpus != int(model.num_gpus) and model.world_size > 1:
        return (
            f"num_gpus {model.num_gpus:g} is a fraction of a GPU but {shape} needs "
            f"{need} whole GPUs per node; set num_gpus: {need}"
        )
    # One worker may share a GPU (num_gpus 0.5): only more than one needs whole GPUs.
    if model.num_gpus < need and not (model.world_size == 1 and model.num_gpus > 0):
        return (
            f"engine_args need {need} GPU(s) per node ({shape}) but num_gpus reserves "
            f"{model.num_gpus:g}; set num_gpus: {need}"
            + ("" if model.num_gpus else ", or accelerator: cpu for vLLM's CPU build")
        )
    return None
