"""Where replicas announce themselves and the gateway finds them.

``FleetRegistry`` is a small named Ray actor (``REGISTRY_NAME`` in the fleet's
namespace). A replica calls ``register(entry)`` once its vLLM server is healthy,
``heartbeat(replica_id)`` from every Ray Serve health check, and
``deregister(replica_id)`` when it stops or finds its server dead. ``entries()``
returns the live entries: a replica whose heartbeats stopped for ``stale_after_s``
(its process was killed outright, its node died) drops out by itself.
A registry that Ray restarted (its process died) starts empty and refuses ``entries()``
for ``warmup_s`` (``RegistryRestarting``), time for every replica to register again on
its next health check (``heartbeat`` answers False to an unknown replica): a gateway
keeps routing to the replicas it last knew while the registry is away, and would drop
them all if it read an empty list instead.
``claim_core`` spreads the CPU engines of one node over its cores. ``lead_scaling``
picks the one gateway that scales where several serve one fleet (`rayfleet gateway`).

An entry: ``{"replica_id", "model", "url", "node_id", "node_ip", "pid", "ranks",
"state"}``, as the gateway's ``ReplicaSet.update`` reads it; ``state`` is ``serving``,
or ``draining`` once the replica is leaving (``set_state``: the gateway sends it no new
requests); ``ranks`` lists ``{"rank", "node_id",
"node_ip", "pid"}`` for each node the replica's engine runs on (rank 0 first).
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from typing import Any

import ray
from ray.actor import ActorHandle

REGISTRY_NAME = "rayfleet-registry"
NAMESPACE = "rayfleet"

Entry = dict[str, Any]


class RegistryRestarting(RuntimeError):
    """The registry restarted moments ago: its entries are not complete yet."""


@ray.remote(num_cpus=0, max_restarts=-1)
class FleetRegistry:
    def __init__(self, stale_after_s: float = 20.0, warmup_s: float = 8.0):
        self.stale_after_s = stale_after_s
        restarted = ray.get_runtime_context().was_current_actor_reconstructed
        # Replicas heartbeat every 2 s (replica.HEALTH_CHECK_PERIOD_S); four periods.
        self.warm_at = time.monotonic() + (warmup_s if restarted else 0.0)
        self._entries: dict[str, Entry] = {}
        self._seen: dict[str, float] = {}
        self._cores: dict[str, tuple[str, str, int]] = {}  # claim -> (machine, model, core)
        self._scaler: tuple[str, float] | None = None  # (holder, last renewed)

    def claim_core(self, machine: str, claim_id: str, model: str, num_cores: int) -> int:
        """The core of ``machine`` (a node's address) with the fewest claims, then fewest of
        ``model``; ``claim_id`` is a replica id, or ``<replica id>/rank<R>`` for a rank.

        vLLM's CPU backend pins its engine thread to core 0 of the node unless told
        otherwise, so without this every replica on a node would share one core.
        Replicas of one model take the same traffic, so they are spread first. Claims
        are per address, not per Ray node: raylets sharing one machine share its cores.
        """
        self._cores.pop(claim_id, None)
        core = pick_core(self._cores.values(), machine, model, num_cores)
        self._cores[claim_id] = (machine, model, core)
        return core

    def lead_scaling(self, holder: str, ttl_s: float) -> bool:
        """Whether ``holder`` is the one gateway that scales, where several run: the first
        to ask leads, and keeps leading while it asks again within ``ttl_s``; another takes
        over once it has gone quiet that long."""
        now = time.monotonic()
        if self._scaler is None or self._scaler[0] == holder or now - self._scaler[1] > ttl_s:
            self._scaler = (holder, now)
            return True
        return False

    def register(self, entry: Entry) -> None:
        self._entries[entry["replica_id"]] = dict(entry)
        self._seen[entry["replica_id"]] = time.monotonic()

    def set_state(self, replica_id: str, state: str) -> bool:
        """Mark a replica ``serving`` or ``draining``; False when it is unknown."""
        entry = self._entries.get(replica_id)
        if entry is None:
            return False
        entry["state"] = state
        self._seen[replica_id] = time.monotonic()
        return True

    def heartbeat(self, replica_id: str) -> bool:
        """False when the replica is unknown (the registry restarted): it should register."""
        if replica_id not in self._entries:
            return False
        self._seen[replica_id] = time.monotonic()
        return True

    def deregister(self, replica_id: str) -> None:
        self._entries.pop(replica_id, None)
        self._seen.pop(replica_id, None)
        for claim in [c for c in self._cores if c == replica_id or c.startswith(replica_id + "/")]:
            del self._cores[claim]

    def entries(self) -> list[Entry]:
        if time.monotonic() < self.warm_at:
            raise RegistryRestarting(
                f"the replica registry restarted; {len(self._entries)} replica(s) registered "
                "again so far, the others will on their next health check"
            )
        cutoff = time.monotonic() - self.stale_after_s
        return [e for rid, e in self._entries.items() if self._seen.get(rid, 0) >= cutoff]


def pick_core(
    claims: Iterable[tuple[str, str, int]], node_id: str, model: str, num_cores: int
) -> int:
    """Least-claimed core of a node; ties go to the core with fewer replicas of ``model``."""
    num_cores = max(1, num_cores)
    load = [0] * num_cores
    same_model = [0] * num_cores
    for node, other_model, core in claims:
        if node == node_id and core < num_cores:
            load[core] += 1
            same_model[core] += other_model == model
    return min(range(num_cores), key=lambda c: (load[c], same_model[c], c))


def get_or_create_registry(*, detached: bool = False) -> ActorHandle[Any]:
    """The fleet's registry, made if missing. ``rayfleet up`` owns it (it goes with the
    fleet); where Serve's own config deploys the replicas (control/serve_app.py) no one
    process does, so it is made ``detached`` and lives as long as the cluster."""
    options = FleetRegistry.options(  # type: ignore[attr-defined]
        name=REGISTRY_NAME,
        namespace=NAMESPACE,
        get_if_exists=True,
        lifetime="detached" if detached else None,
    )
    handle: ActorHandle[Any] = options.remote()
    return handle


def get_registry() -> ActorHandle[Any]:
    return ray.get_actor(REGISTRY_NAME, namespace=NAMESPACE)
