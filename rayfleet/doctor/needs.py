"""What a fleet.yaml asks of the cluster: parallelism, GPUs, model sources, ports."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from rayfleet.doctor.result import Node

if TYPE_CHECKING:
    from rayfleet.config import FleetConfig, ModelConfig


@dataclass(frozen=True)
class ModelNeed:
    name: str
    source: str
    needs_gpus: bool
    world_size: int
    cross_node: bool


@dataclass(frozen=True)
class FleetNeeds:
    """Empty when no fleet.yaml is given: the checks then judge the cluster alone."""

    models: list[ModelNeed] = field(default_factory=list)
    gateway_port: int | None = None
    given: bool = False

    @property
    def parallel_models(self) -> list[str]:
        """Models that use tensor or pipeline parallelism (NCCL, shared memory)."""
        return [m.name for m in self.models if m.world_size > 1]

    @property
    def cross_node_models(self) -> list[str]:
        return [m.name for m in self.models if m.cross_node]

    @property
    def gpu_models(self) -> list[str]:
        return [m.name for m in self.models if m.needs_gpus]

    def hosts_for(self, model: ModelNeed, nodes: Sequence[Node]) -> list[Node]:
        """Nodes that may run a replica (or a worker) of ``model``."""
        if model.needs_gpus:
            return [n for n in nodes if n.num_gpus > 0]
        return list(nodes)


def fleet_needs(fleet: FleetConfig | None, nodes: Sequence[Node]) -> FleetNeeds:
    if fleet is None:
        return FleetNeeds()
    max_node_gpus = max((n.num_gpus for n in nodes), default=0.0)
    return FleetNeeds(
        models=[_model_need(m, max_node_gpus) for m in fleet.models],
        gateway_port=fleet.gateway.port,
        given=True,
    )


def _model_need(model: ModelConfig, max_node_gpus: float) -> ModelNeed:
    needs_gpus = model.gpu_engine
    gpus_per_replica = (
        max(model.num_gpus * model.nodes_per_replica, model.world_size) if needs_gpus else 0
    )
    # A replica crosses nodes when it says so, or when no node holds its GPUs.
    cross_node = model.spans_nodes or (
        needs_gpus and model.world_size > 1 and gpus_per_replica > max_node_gpus
    )
    return ModelNeed(model.name, model.source, needs_gpus, model.world_size, cross_node)
