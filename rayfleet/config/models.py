"""fleet.yaml ``models``: one model the fleet serves, as a group of identical replicas.

    models:
      - name: smollm2-135m        # the model name clients send
        source: /models/smollm2   # local directory or hub id
        engine_args:              # vLLM server flags, underscores or dashes, unchanged
          max_model_len: 2048
          enforce_eager: true
        replicas: 2               # or autoscaling: and schedules: (rayfleet/config/autoscaling.py)
        num_cpus: 1
        num_gpus: 0               # GPUs per replica per node; 0: vLLM's CPU build
        memory_gib: 8             # optional Ray memory reservation per replica
        accelerator: auto         # auto | gpu | cpu
        nodes_per_replica: 1      # nodes one replica's engine spans (vLLM --nnodes)
        engine: vllm              # vllm | sim (a simulated engine, rayfleet sim)

A GPU engine (``ModelConfig.gpu_engine``: num_gpus > 0 or accelerator gpu) must
reserve what its engine arguments use on each node: ``gpus_per_node_needed`` (TP x PP /
``nodes_per_replica``, computed once there) whole GPUs, else ``gpu_shortfall`` refuses it
in one line with the fix. CPU engines are never refused for GPUs.

A replica spans ``nodes_per_replica`` nodes with vLLM's own multi-node launch
(rayfleet/control/ranks.py); ``num_cpus``, ``num_gpus`` and ``memory_gib`` are per node.
What a replica shape must hold (executor, nodes, GPUs, ``engine: sim``) is
rayfleet/config/shape.py. What the fleet adds to a model's ``engine_args`` is
``FleetConfig.derived_engine_args`` (rayfleet/config/fleet.py).
"""

from __future__ import annotations

import math
from typing import Any, Literal

from pydantic import Field, field_validator, model_validator

from rayfleet.config.autoscaling import AutoscalingConfig, Schedules, replica_count_problem
from rayfleet.config.base import StrictModel
from rayfleet.config.routing import RoutingConfig
from rayfleet.config.shape import shape_problem

Accelerator = Literal["auto", "gpu", "cpu"]

# Flags rayfleet sets itself for every replica; a user value would be silently lost.
RESERVED_ENGINE_ARGS = {"model", "served_model_name", "host", "port"}


class ModelConfig(StrictModel):
    """One model served by the fleet, as a group of identical replicas."""

    name: str = Field(min_length=1, description="Model name clients put in requests.")
    source: str = Field(
        min_length=1,
        description="Local model directory or hub id; '~' expands on the node that loads it.",
    )
    engine: Literal["vllm", "sim"] = Field(
        default="vllm",
        description="vllm: a vLLM server per replica; sim: a simulated engine (rayfleet sim: "
        "vLLM's endpoints and metric names, no model), its spec from source when that is a "
        "JSON file from `rayfleet sim calibrate`; engine_args must be empty.",
    )
    engine_args: dict[str, Any] = Field(
        default_factory=dict,
        description="vLLM server arguments, passed unchanged (checked by vLLM's parser); "
        "the fleet may add derived ones (FleetConfig.derived_engine_args), never change these.",
    )
    replicas: int = Field(default=1, ge=1, description="Number of identical vLLM servers.")
    num_cpus: float = Field(default=1.0, ge=0, description="Ray CPUs reserved per replica.")
    num_gpus: float = Field(
        default=0.0,
        ge=0,
        description="Ray GPUs the replica reserves on its node; its vLLM server sees exactly "
        "those (CUDA_VISIBLE_DEVICES). A GPU engine needs tensor x pipeline parallel size.",
    )
    memory_gib: float | None = Field(
        default=None,
        gt=0,
        description="Ray memory (GiB of host RAM) reserved per replica (per node); none by "
        "default.",
    )
    accelerator: Accelerator = Field(
        default="auto",
        description="gpu: a GPU engine even with num_gpus 0 (then refused with the fix); cpu: "
        "vLLM's CPU build; auto: a GPU engine when num_gpus > 0.",
    )
    nodes_per_replica: int = Field(
        default=1,
        ge=1,
        description="Nodes one replica's engine spans (vLLM's --nnodes): one placement group "
        "bundle per node, each on a distinct node; num_cpus, num_gpus and memory_gib are per "
        "node, and tensor x pipeline parallel size must divide evenly among the nodes.",
    )
    drain_timeout_s: float = Field(
        default=60.0,
        gt=0,
        description="Longest a leaving replica (scale-in, apply, down) waits for its requests "
        "in flight to finish after the gateway stops sending it new ones.",
    )
    startup_timeout_s: float = Field(
        default=900.0, gt=0, description="Longest a replica may take to load its model."
    )
    env: dict[str, str] = Field(
        default_factory=dict, description="Extra environment variables for the vLLM server."
    )
    routing: RoutingConfig = Field(
        default_factory=RoutingConfig, description="How the gateway picks a replica."
    )
    autoscaling: AutoscalingConfig | None = Field(
        default=None, description="Bounds and load target instead of a fixed replicas."
    )
    schedules: Schedules = Field(
        default_factory=list, description="Weekly windows that bound the replica count."
    )

    @field_validator("engine_args")
    @classmethod
    def _no_reserved(cls, args: dict[str, Any]) -> dict[str, Any]:
        normal = {k.replace("-", "_"): v for k, v in args.items()}
        taken = sorted(RESERVED_ENGINE_ARGS & normal.keys())
        if taken:
            raise ValueError(
                f"{', '.join(taken)} is set by rayfleet for each replica; use the model's "
                "'name' and 'source' fields instead"
            )
        return normal

    @model_validator(mode="before")
    @classmethod
    def _no_placement_strategy(cls, data: Any) -> Any:
        if isinstance(data, dict) and "placement_strategy" in data:
            raise ValueError(
                "placement_strategy is no longer a field: a replica that spans "
                "nodes_per_replica nodes takes one bundle on each of that many distinct "
                "nodes; remove placement_strategy"
            )
        return data

    @model_validator(mode="after")
    def _engine_fits_replica(self) -> ModelConfig:
        problem = shape_problem(self) or replica_count_problem(self)
        if problem:
            raise ValueError(problem)
        return self

    @property
    def gpu_engine(self) -> bool:
        """Whether the replica's vLLM server runs on GPUs (the CPU build runs on none)."""
        if self.accelerator != "auto":
            return self.accelerator == "gpu"
        return self.num_gpus > 0

    @property
    def spans_nodes(self) -> bool:
        return self.nodes_per_replica > 1

    @property
    def gpus_per_node_needed(self) -> int:
        """GPUs a GPU engine's replica needs on each of its nodes: TP x PP / nodes."""
        return math.ceil(self.world_size / self.nodes_per_replica)

    @property
    def tensor_parallel_size(self) -> int:
        return int(self.engine_args.get("tensor_parallel_size", 1))

    @property
    def pipeline_parallel_size(self) -> int:
        return int(self.engine_args.get("pipeline_parallel_size", 1))

    @property
    def world_size(self) -> int:
        """Engine workers (GPUs) one replica needs."""
        return self.tensor_parallel_size * self.pipeline_parallel_size
