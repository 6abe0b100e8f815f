"""The Ray worker pods a fleet needs: one group per distinct GPU count per pod.

A worker pod holds one node's share of one replica: a replica that spans
``nodes_per_replica`` nodes takes that many pods of its group, one rank each (Ray's
STRICT_SPREAD puts each bundle on a node of its own, and a pod is a Ray node).

    gpus     the replica's GPUs per node: ``max(ceil(num_gpus), TP x PP / nodes)``
             for a GPU engine (what Ray reserves and what the engine uses), 0 for a
             CPU engine; models with the same count share a group
    cpus     Ray's num-cpus: the largest ``num_cpus`` of the group's models, rounded
             up, what a replica reserves; the pod's CPU limit is at least the
             planner's sizing for a vLLM server of that many GPUs (``server_cpus``:
             API server, engine core, one per GPU worker), since a limit below what
             the server's processes use throttles them, where bare Ray would not
    memory   the largest ``memory_gib``, or the planner's sizing for a vLLM server
             of that many GPUs (``server_memory_gib``: 4 GiB per process), plus /dev/shm
    shm      ``kubernetes.shm_gib``, else 30% of that memory (at least 2 GiB): Ray's
             object store takes 30% of a node's memory by default and lives in
             /dev/shm, and NCCL's shared-memory transport between the GPUs of a pod
             needs room there too. The object store is told the same size, and tmpfs
             pages count against the pod's memory limit, so the limit adds it.
    counts   pods = sum over the group's models of replicas x nodes_per_replica;
             an autoscaled model counts max(1, min_replicas) to start (Serve refuses
             0), min_replicas at least and max_replicas at most.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from rayfleet.config import FleetConfig, KubernetesConfig, ModelConfig
from rayfleet.planner.fleet_entry import server_cpus, server_memory_gib

OBJECT_STORE_FRACTION = 0.3
MIN_SHM_GIB = 2.0


@dataclass
class WorkerGroup:
    """One KubeRay worker group: its pod shape and how many pods."""

    gpus: int
    cpus: int = 1
    pod_cpus: int = 1
    ray_memory_gib: float = 0.0
    replicas: int = 0
    min_replicas: int = 0
    max_replicas: int = 0
    models: list[str] = field(default_factory=list)
    shm_gib: float = MIN_SHM_GIB

    @property
    def name(self) -> str:
        return f"gpu{self.gpus}" if self.gpus else "cpu"

    @property
    def memory_gib(self) -> float:
        """The pod's memory limit: Ray's memory and the /dev/shm beside it."""
        return self.ray_memory_gib + self.shm_gib


def gpus_per_pod(model: ModelConfig) -> int:
    """GPUs one pod of ``model``'s replica needs (0 for a CPU engine)."""
    if not model.gpu_engine:
        return 0
    return max(math.ceil(model.num_gpus), model.gpus_per_node_needed)


def replica_counts(model: ModelConfig) -> tuple[int, int, int]:
    """(start, fewest, most) replicas of ``model``."""
    if model.autoscaling is None:
        return model.replicas, model.replicas, model.replicas
    scaling = model.autoscaling
    return max(1, scaling.min_replicas), scaling.min_replicas, scaling.max_replicas


def worker_groups(config: FleetConfig, k8s: KubernetesConfig) -> list[WorkerGroup]:
    """The worker groups of ``config``, GPU groups by size, then the CPU group."""
    groups: dict[int, WorkerGroup] = {}
    for model in config.models:
        gpus = gpus_per_pod(model)
        group = groups.setdefault(gpus, WorkerGroup(gpus=gpus))
        start, fewest, most = replica_counts(model)
        nodes = model.nodes_per_replica
        group.replicas += start * nodes
        group.min_replicas += fewest * nodes
        group.max_replicas += most * nodes
        group.cpus = max(group.cpus, math.ceil(model.num_cpus))
        group.pod_cpus = max(group.pod_cpus, group.cpus, server_cpus(gpus))
        memory = model.memory_gib or server_memory_gib(gpus)
        group.ray_memory_gib = max(group.ray_memory_gib, memory)
        group.models.append(model.name)
    for group in groups.values():
        share = max(MIN_SHM_GIB, math.ceil(OBJECT_STORE_FRACTION * group.ray_memory_gib))
        group.shm_gib = k8s.shm_gib or share
    return sorted(groups.values(), key=lambda g: (g.gpus == 0, g.gpus))
