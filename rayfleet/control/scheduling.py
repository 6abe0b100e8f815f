"""Whether the fleet's replicas can be placed on the Ray cluster, and whether they are.

Ray Serve waits for resources without end: a replica that needs two nodes on a cluster
of one stays pending forever, and ``rayfleet up`` would hang. Two checks turn that into
one clear line:

    refuse_unplaceable(config)          before deploying: a replica shape that no node
                                        set of the cluster can hold even when empty
                                        (placement.unplaceable) fails at once
    stalled_placement(model, waited_s)  while waiting: the replica placement groups of a
                                        model still PENDING after the deadline
                                        (``cluster.placement_timeout_s``), with Ray's
                                        own state of each group, or None

Both need a connected Ray (the fleet process has one).
"""

from __future__ import annotations

from typing import Any

from rayfleet.config import FleetConfig, ModelConfig
from rayfleet.control.placement import (
    NodeResources,
    fleet_demands,
    format_resources,
    unplaceable,
)
from rayfleet.errors import RayfleetError

SERVE_REPLICA_PREFIX = "SERVE_REPLICA::"  # Serve names a replica's placement group after it


def refuse_unplaceable(config: FleetConfig) -> None:
    """Raise RayfleetError naming the first model whose replica the cluster cannot hold."""
    from rayfleet.cluster import node_resources

    nodes = [NodeResources(**record) for record in node_resources()]
    fit = unplaceable(fleet_demands(config.models), nodes)
    if fit is None:
        return
    model = config.model(fit.model)
    raise RayfleetError(
        f"model '{model.name}' cannot be placed on this Ray cluster even when it is idle: "
        f"one replica {fit.reason}; {_fix(model)}"
    )


def _fix(model: ModelConfig) -> str:
    if model.spans_nodes:
        return (
            f"add nodes to the cluster (`ray start --address ...` on each) or lower "
            f"nodes_per_replica ({model.nodes_per_replica})"
        )
    return "lower num_cpus, num_gpus or memory_gib, or add a node large enough"


def replica_groups(model: str, table: dict[str, dict[str, Any]]) -> list[dict[str, Any]]:
    """The placement groups Serve made for ``model``'s replicas, from Ray's table."""
    prefix = f"{SERVE_REPLICA_PREFIX}{model}#{model}#"
    return [g for g in table.values() if str(g.get("name", "")).startswith(prefix)]


def describe_stall(model: str, groups: list[dict[str, Any]], waited_s: float) -> str | None:
    """One line for the PENDING groups among ``groups``, or None when none is pending."""
    pending = [g for g in groups if g.get("state") == "PENDING"]
    if not pending:
        return None
    group = pending[0]
    bundles = list((group.get("bundles") or {}).values())
    shape = f"{len(bundles)} x [{format_resources(bundles[0])}]" if bundles else "no bundles"
    why = (group.get("stats") or {}).get("scheduling_state", "unknown")
    return (
        f"model '{model}': {len(pending)} replica placement group(s) still PENDING after "
        f"{waited_s:.0f} s (Ray's scheduling state: {why}); each needs {shape}, "
        f"{group.get('strategy', '?')}; free resources on the cluster or add nodes, "
        "or raise cluster.placement_timeout_s"
    )


def stalled_placement(model: str, waited_s: float) -> str | None:
    """Why ``model``'s replicas are not placed yet, if Ray is still holding any back."""
    import ray

    table: dict[str, dict[str, Any]] = ray.util.placement_group_table()
    return describe_stall(model, replica_groups(model, table), waited_s)
