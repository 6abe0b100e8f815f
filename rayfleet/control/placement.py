"""What each replica asks Ray for, where it would fit, and which GPUs its vLLM server sees.

Pure functions over the validated config (no Ray, except ``assigned_gpu_ids``)::

    replica_demand(model)        -> ReplicaDemand   one replica's bundles and strategy
    describe_demand(demand)      -> str             the bundles per node, in words
    fit_replicas(demands, nodes) -> [ReplicaFit]    where each replica would go, or why not
    resources_by_node(demand, fit) -> {node: res}   what a placed replica takes per node
    gpu_env(gpu_ids)             -> env             CUDA_VISIBLE_DEVICES for the vLLM child
    assigned_gpu_ids()           -> [id]            inside a replica: the GPUs Ray gave it

A replica is either one Ray actor (no placement group: its CPU, GPU and memory are one
bundle on one node) or, when it spans ``nodes_per_replica`` nodes, a placement group of
one such bundle per node, STRICT_SPREAD (each on a distinct node). The replica actor
(rank 0, vLLM's API server) takes the first bundle and one rank actor takes each of the
others (rayfleet/control/ranks.py). ``rayfleet up --dry-run`` prints both; with
``--address`` it fits them into the running cluster's free resources as Ray would
(``fit_replicas``), and ``rayfleet up`` refuses a replica that cannot fit even an
empty cluster (``unplaceable``).

The fit is first-fit over the nodes in the order given, all-or-nothing per replica
(Ray reserves a placement group atomically): a plain actor needs one node with room for
its bundle, a replica that spans nodes a distinct node with room for each of its
bundles. It is a capacity check: Ray may choose other nodes of equal fit.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from rayfleet.config import ModelConfig

Bundle = Mapping[str, float]
GIB = 1024**3
SPAN_STRATEGY = "STRICT_SPREAD"  # a replica's ranks, each on a node of its own
_EPSILON = 1e-9


def node_bundle(model: ModelConfig) -> dict[str, float]:
    """What one replica takes on each of its nodes: CPU, GPU and memory."""
    resources = {"CPU": model.num_cpus, "GPU": model.num_gpus}
    if model.memory_gib:
        resources["memory"] = model.memory_gib * GIB
    return resources


def placement_bundles(model: ModelConfig) -> list[dict[str, float]] | None:
    """One bundle per node for a replica that spans nodes; None for a one-node replica.

    A bundle may not be empty, so a node bundle with nothing in it keeps a sliver of CPU.
    """
    if not model.spans_nodes:
        return None
    bundle = {key: value for key, value in node_bundle(model).items() if value}
    return [dict(bundle or {"CPU": 0.01}) for _ in range(model.nodes_per_replica)]


@dataclass(frozen=True)
class ReplicaDemand:
    """What one replica of ``model`` asks Ray for."""

    model: str
    bundles: tuple[Bundle, ...]
    strategy: str | None  # None: one actor, no placement group

    @property
    def gpus(self) -> float:
        return sum(b.get("GPU", 0.0) for b in self.bundles)


def replica_demand(model: ModelConfig) -> ReplicaDemand:
    bundles = placement_bundles(model)
    if bundles is None:
        return ReplicaDemand(model.name, (node_bundle(model),), None)
    return ReplicaDemand(model.name, tuple(bundles), SPAN_STRATEGY)


def fleet_demands(models: Iterable[ModelConfig]) -> list[ReplicaDemand]:
    """One demand per replica of every model, in the order Serve would deploy them."""
    return [replica_demand(m) for m in models for _ in range(m.replicas)]


def format_resources(bundle: Bundle) -> str:
    """``{"CPU": 6, "GPU": 4, "memory": 2**34}`` as ``6 CPU, 4 GPU, 16 GiB memory``."""
    parts = []
    for key, value in bundle.items():
        if key == "memory":
            parts.append(f"{value / GIB:g} GiB memory")
        elif value:
            parts.append(f"{value:g} {key}")
    return ", ".join(parts) or "nothing"


_STRATEGY_WORDS = {"STRICT_SPREAD": "each on a distinct node"}


def describe_demand(demand: ReplicaDemand) -> str:
    """One replica's bundles and where they must go, as ``up --dry-run`` prints it."""
    if demand.strategy is None:
        return f"one actor on one node (no placement group): {format_resources(demand.bundles[0])}"
    words = _STRATEGY_WORDS.get(demand.strategy, demand.strategy)
    return (
        f"a placement group ({demand.strategy}: {words}) of {len(demand.bundles)} bundles, "
        f"one per rank: {len(demand.bundles)} x [{format_resources(demand.bundles[0])}]; "
        "rank 0 runs the API server"
    )


def unplaceable(
    demands: Sequence[ReplicaDemand], nodes: Sequence[NodeResources]
) -> ReplicaFit | None:
    """The first replica that could not be placed even with every node empty, or None.

    Checks each model's replica shape alone against the nodes' total resources: what
    no amount of waiting makes fit (too few nodes, too small a node).
    """
    empty = [NodeResources(n.node_id, n.ip, n.total, dict(n.total)) for n in nodes]
    seen: set[str] = set()
    for demand in demands:
        if demand.model in seen:
            continue
        seen.add(demand.model)
        (fit,) = fit_replicas([demand], empty)
        if not fit.placed:
            return fit
    return None


@dataclass
class NodeResources:
    """One node's total and free resources, as Ray reports them."""

    node_id: str
    ip: str
    total: dict[str, float]
    available: dict[str, float] = field(default_factory=dict)

    @property
    def label(self) -> str:
        return f"{self.ip} ({self.node_id[:8]})" if self.ip else self.node_id[:8]


@dataclass(frozen=True)
class ReplicaFit:
    """Where one replica would go: a node id per bundle, or why it cannot be placed."""

    model: str
    replica: int
    nodes: tuple[str, ...] | None
    reason: str = ""

    @property
    def placed(self) -> bool:
        return self.nodes is not None


def fit_replicas(
    demands: Sequence[ReplicaDemand], nodes: Sequence[NodeResources]
) -> list[ReplicaFit]:
    """Place every replica in turn into what the nodes have free, as Ray would."""
    free = {n.node_id: dict(n.available) for n in nodes}
    fits = []
    index: dict[str, int] = {}
    for demand in demands:
        replica = index[demand.model] = index.get(demand.model, -1) + 1
        placed = _place(demand, free)
        if placed is None:
            fits.append(ReplicaFit(demand.model, replica, None, _why_not(demand, nodes, free)))
            continue
        for bundle, node_id in zip(demand.bundles, placed, strict=True):
            _take(free[node_id], bundle)
        fits.append(ReplicaFit(demand.model, replica, tuple(placed)))
    return fits


def resources_by_node(demand: ReplicaDemand, fit: ReplicaFit) -> dict[str, dict[str, float]]:
    """What a placed replica takes on each of its nodes (its bundles summed per node)."""
    by_node: dict[str, list[Bundle]] = {}
    for bundle, node_id in zip(demand.bundles, fit.nodes or (), strict=True):
        by_node.setdefault(node_id, []).append(bundle)
    return {node_id: _sum(bundles) for node_id, bundles in by_node.items()}


def _place(demand: ReplicaDemand, free: Mapping[str, Mapping[str, float]]) -> list[str] | None:
    """A node per bundle: the first with room, each a distinct node (STRICT_SPREAD)."""
    chosen: list[str] = []
    for bundle in demand.bundles:
        node = next((n for n, res in free.items() if n not in chosen and _fits(res, bundle)), None)
        if node is None:
            return None
        chosen.append(node)
    return chosen


def _why_not(
    demand: ReplicaDemand, nodes: Sequence[NodeResources], free: Mapping[str, Mapping[str, float]]
) -> str:
    shape = format_resources(demand.bundles[0])
    if demand.strategy is None:
        need = f"needs {shape} on one node"
    else:
        count = len(demand.bundles)
        need = f"spans {count} nodes: needs {shape} on each of {count} distinct nodes"
    left = ", ".join(
        f"{n.label} {free[n.node_id].get('GPU', 0.0):g}/{n.total.get('GPU', 0.0):g} GPU "
        f"{free[n.node_id].get('CPU', 0.0):g} CPU"
        for n in nodes
    )
    how_many = f"{len(nodes)} node{'' if len(nodes) == 1 else 's'}"
    return f"{need}; free per node ({how_many}): {left or 'none'}"


def _sum(bundles: Iterable[Bundle]) -> dict[str, float]:
    total: dict[str, float] = {}
    for bundle in bundles:
        for key, value in bundle.items():
            total[key] = total.get(key, 0.0) + value
    return total


def _fits(free: Mapping[str, float], bundle: Bundle) -> bool:
    return all(free.get(key, 0.0) + _EPSILON >= value for key, value in bundle.items() if value)


def _take(free: dict[str, float], bundle: Bundle) -> None:
    for key, value in bundle.items():
        free[key] = free.get(key, 0.0) - value


def gpu_env(gpu_ids: Sequence[str | int]) -> dict[str, str]:
    """``CUDA_VISIBLE_DEVICES`` naming exactly the GPUs Ray assigned, or nothing when none.

    Ray sets it in a GPU actor's own environment, but not when the node runs with
    ``RAY_EXPERIMENTAL_NOSET_CUDA_VISIBLE_DEVICES``, and since Ray 2.5x not for an actor
    with no GPUs (which then sees every GPU of its node); a child inherits whatever the
    actor has, so the replica passes the assignment explicitly. No GPUs (a CPU engine):
    the environment is left as it is.
    """
    if not gpu_ids:
        return {}
    ordered = sorted((str(i) for i in gpu_ids), key=lambda i: (not i.isdigit(), i.zfill(8)))
    return {"CUDA_VISIBLE_DEVICES": ",".join(ordered)}


def assigned_gpu_ids() -> list[str]:
    """The GPU ids Ray assigned to the calling actor (its own or its bundle's)."""
    import ray

    return list(ray.get_runtime_context().get_accelerator_ids().get("GPU", []))
