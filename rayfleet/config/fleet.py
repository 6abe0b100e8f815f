"""fleet.yaml: the one file that describes a fleet.

    cluster:
      address: local              # local (embedded Ray) | auto | ray://head:10001
      placement_timeout_s: 300    # fail `up` when a replica's nodes are not found by then
    gateway:                      # endpoint and policies: rayfleet/config/gateway.py
      host: 127.0.0.1
      port: 8000
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

``load_fleet(path)`` parses and validates a file; ``parse_fleet(data, origin)``
validates an already-loaded mapping; ``default_fleet()`` is what ``rayfleet up``
serves without a file. Every problem is a ``ConfigError`` whose one-line message
names the file, the field path, the reason and, for a misspelt key, the key it
probably meant (rayfleet/config/messages.py).

A GPU engine (``ModelConfig.gpu_engine``: num_gpus > 0 or accelerator gpu) must
reserve what its engine arguments use on each node: ``gpus_per_node_needed`` (TP x PP /
``nodes_per_replica``, computed once there) whole GPUs, else ``gpu_shortfall`` refuses it
in one line with the fix. CPU engines are never refused for GPUs.

A replica spans ``nodes_per_replica`` nodes with vLLM's own multi-node launch
(rayfleet/control/ranks.py); ``num_cpus``, ``num_gpus`` and ``memory_gib`` are per node.
What a replica shape must hold (executor, nodes, GPUs, ``engine: sim``) is
rayfleet/config/shape.py.

Validation never changes what the user wrote. Values the fleet derives from the
whole file are methods: ``FleetConfig.engine_args_for(model)`` is what a model's vLLM
servers start with, its ``engine_args`` plus ``derived_engine_args(model)`` (today:
``scheduling_policy: priority`` when the gateway defines priority classes).
``rayfleet up --dry-run`` prints both. Checking engine arguments against vLLM's own
parser imports vLLM and lives in the control plane (rayfleet/control/engine_args.py).
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any, Literal, NamedTuple

import yaml
from pydantic import Field, ValidationError, field_validator, model_validator

from rayfleet.config.autoscaling import AutoscalingConfig, Schedules, replica_count_problem
from rayfleet.config.base import StrictModel
from rayfleet.config.cluster import ClusterConfig
from rayfleet.config.gateway import GatewayConfig
from rayfleet.config.kubernetes import KubernetesConfig
from rayfleet.config.messages import describe
from rayfleet.config.routing import RoutingConfig
from rayfleet.config.shape import shape_problem
from rayfleet.errors import ConfigError

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


class DerivedArg(NamedTuple):
    """An engine argument the fleet adds to a model's own, and the reason."""

    value: Any
    because: str


class FleetConfig(StrictModel):
    """A whole fleet: where it runs, its endpoint, its models."""

    cluster: ClusterConfig = Field(default_factory=ClusterConfig)
    gateway: GatewayConfig = Field(default_factory=GatewayConfig)
    models: list[ModelConfig] = Field(min_length=1, description="Models to serve.")
    kubernetes: KubernetesConfig | None = Field(default=None, description="`rayfleet k8s render`.")

    @model_validator(mode="after")
    def _unique_names(self) -> FleetConfig:
        seen: set[str] = set()
        for model in self.models:
            if model.name in seen:
                raise ValueError(f"two models are named '{model.name}'; model names must be unique")
            seen.add(model.name)
        return self

    @model_validator(mode="after")
    def _routes_name_models(self) -> FleetConfig:
        """Route targets and tokenizers are models of the fleet, and no route is one."""
        models = [m.name for m in self.models]
        clash = sorted(set(models) & {r.name for r in self.gateway.routes})
        if clash:
            raise ValueError(f"'{clash[0]}' is both a model and a route; rename the route")
        for route in self.gateway.routes:
            for rule in route.rules:
                if not rule.target.startswith("fallback:") and rule.target not in models:
                    raise ValueError(
                        f"route '{route.name}' rule '{rule.name}' targets '{rule.target}', which "
                        f"is not a model of the fleet ({', '.join(models)}) nor 'fallback:<name>'"
                    )
            if route.tokenizer is not None and route.tokenizer not in models:
                raise ValueError(
                    f"route '{route.name}' tokenizer '{route.tokenizer}' is not a "
                    f"model of the fleet ({', '.join(models)})"
                )
        return self

    @model_validator(mode="after")
    def _policies_name_models(self) -> FleetConfig:
        """Per-model limits, keys' models and providers' models are models or routes."""
        gateway = self.gateway
        names = [m.name for m in self.models] + [r.name for r in gateway.routes]
        named = [(f"gateway.model_limits '{n}'", n) for n in gateway.model_limits]
        named += [
            (f"api_keys '{k.name}' models '{n}'", n)
            for k in gateway.api_keys
            for n in k.models or ()
        ]
        named += [
            (f"fallback provider '{p.name}' models '{n}'", n)
            for p in gateway.fallback.providers
            for n in p.models
        ]
        for what, name in named:
            if name not in names:
                raise ValueError(f"{what} is neither a model nor a route ({', '.join(names)})")
        return self

    @model_validator(mode="after")
    def _priority_scheduler_possible(self) -> FleetConfig:
        """Priority classes need vLLM's priority scheduler on every model."""
        if self.gateway.priority_classes:
            for model in self.models:
                policy = model.engine_args.get("scheduling_policy", "priority")
                if policy != "priority":
                    raise ValueError(
                        f"model '{model.name}' sets scheduling_policy '{policy}', but "
                        "gateway.priority_classes need 'priority'; remove it or set 'priority'"
                    )
        return self

    def model(self, name: str) -> ModelConfig:
        for model in self.models:
            if model.name == name:
                return model
        raise KeyError(name)

    def derived_engine_args(self, model: ModelConfig) -> dict[str, DerivedArg]:
        """Engine arguments the fleet adds to ``model``'s own ``engine_args``, with reasons.

        ``scheduling_policy: priority`` when the gateway defines priority classes (vLLM
        honours a request's priority only under that scheduler) and the model does not
        set it; a model that sets another policy fails validation instead.
        """
        derived: dict[str, DerivedArg] = {}
        if self.gateway.priority_classes and "scheduling_policy" not in model.engine_args:
            derived["scheduling_policy"] = DerivedArg(
                "priority", "gateway.priority_classes need vLLM's priority scheduler"
            )
        return derived

    def engine_args_for(self, model: ModelConfig) -> dict[str, Any]:
        """The engine arguments ``model``'s vLLM servers start with: its own, then derived."""
        derived = self.derived_engine_args(model)
        return {**model.engine_args, **{key: arg.value for key, arg in derived.items()}}


DEMO_MODEL_NAME = "smollm2-135m"
DEMO_ENGINE_ARGS = {"max_model_len": 2048, "enforce_eager": True, "dtype": "float32"}


def default_fleet() -> FleetConfig:
    """The demo fleet: SmolLM2-135M-Instruct on an embedded Ray, gateway on :8000."""
    from rayfleet.models.build import DEMO_NAME, default_model_dir

    return FleetConfig(
        models=[
            ModelConfig(
                name=DEMO_MODEL_NAME,
                source=str(default_model_dir(DEMO_NAME)),
                engine_args=dict(DEMO_ENGINE_ARGS),
            )
        ]
    )


def load_fleet(path: str | Path) -> FleetConfig:
    """Read and validate a fleet.yaml; raise ConfigError with a one-line reason."""
    path = Path(path)
    try:
        text = path.read_text()
    except FileNotFoundError:
        raise ConfigError(f"{path}: no such file; pass an existing fleet.yaml with -c") from None
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read ({exc.strerror})") from None
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        problem = getattr(exc, "problem", None) or "not valid YAML"
        raise ConfigError(f"{path}{where}: {problem}") from None
    return parse_fleet(data, origin=str(path))


def parse_fleet(data: Any, origin: str = "fleet.yaml") -> FleetConfig:
    """Validate an already-loaded fleet.yaml mapping; ``origin`` prefixes every message."""
    if not isinstance(data, dict):
        raise ConfigError(
            f"{origin}: expected a mapping with 'models' (and optionally "
            "'cluster', 'gateway') at the top level"
        )
    try:
        return FleetConfig.model_validate(data)
    except ValidationError as exc:
        raise ConfigError(_every_error(exc, data, origin)) from None


MAX_ERRORS_SHOWN = 10


def _every_error(exc: ValidationError, data: Any, origin: str) -> str:
    """One line per invalid field, each prefixed with ``origin``, so that
    a file with several mistakes is mended in one round; past ``MAX_ERRORS_SHOWN``, a
    count of the rest."""
    described = (f"{origin}: {describe(error, data, FleetConfig)}" for error in exc.errors())
    lines = list(dict.fromkeys(described))  # a union's variants can repeat one line
    if len(lines) > MAX_ERRORS_SHOWN:
        rest = len(lines) - MAX_ERRORS_SHOWN
        lines = [*lines[:MAX_ERRORS_SHOWN], f"{origin}: ... and {rest} more"]
    return "\n".join(lines)
