"""What every doctor check is given: the cluster's nodes, each node's probe facts, and
what the fleet needs; ``part(facts, name)`` takes one part of a node's facts or raises
``ProbeError`` with the probe's own reason."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from rayfleet.doctor.needs import FleetNeeds
from rayfleet.doctor.result import Node

GIB = 1024**3


@dataclass
class Context:
    """What every check may look at beside its own node's facts."""

    nodes: list[Node]
    facts: dict[str, dict[str, Any]]  # node id -> probe facts, for nodes that answered
    needs: FleetNeeds = field(default_factory=FleetNeeds)

    @property
    def head(self) -> Node | None:
        return next((n for n in self.nodes if n.is_head), None)

    @property
    def head_facts(self) -> dict[str, Any] | None:
        head = self.head
        return self.facts.get(head.node_id) if head else None


class ProbeError(Exception):
    """A part of the node's probe failed; the message is the probe's own reason."""


def part(facts: dict[str, Any] | None, name: str) -> dict[str, Any]:
    part = (facts or {}).get(name)
    if not isinstance(part, dict):
        raise ProbeError(f"no {name} facts from this node")
    if "error" in part:
        raise ProbeError(part["error"])
    return part


def gib(num_bytes: int | float) -> str:
    return f"{num_bytes / GIB:.1f} GiB" if num_bytes >= GIB else f"{num_bytes / 1024**2:.0f} MiB"
