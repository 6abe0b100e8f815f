"""The gateway's view of the fleet: which replicas serve which model, and their health.

``ReplicaSet.update(entries)`` replaces the membership with what the registry
reports (entries are dicts ``{"replica_id", "model", "url", "node_id", "node_ip",
"pid"}``), keeping the replicas that stay (same url and pid), with their in-flight
counts and flags; a restarted server (new pid) is a new ``Replica``, so policies that
remember replicas (the prefix index) start it afresh.
``candidates(model, exclude)`` are the replicas a request may go to: healthy, not
draining, not already tried; a ``ReplicaPolicy`` (replica_policy.py) picks among them.
They are worked out once per model and kept until the membership changes or a replica
enters or leaves a cool-down, not for every request (a pass over 64 replicas was about
2.3 us of every request on the 2-core machine).
``begin`` / ``end`` count a request in and out; ``failed`` takes a replica out of
rotation for ``cooldown_s`` once it has failed ``max_consecutive_failures`` times in
a row, so that a dead server is not picked again before the registry notices it;
after the cool-down it is tried again, and one more failure sends it straight back
(one success resets the count). A replica whose ``draining`` flag is set (its registry
entry's ``state``) finishes what it has in flight and gets nothing new.
Under ``gateway.workers`` each entry also names the replica's ``slot`` in the workers'
shared counts: ``begin``/``end`` count there too, and ``refresh_shared`` sets each
replica's ``num_inflight`` to the sum over every worker.
``wait_for_candidates(model, timeout_s)`` waits for a replica to send to, for requests
the gateway holds while a model has no capacity (scale from zero, a window).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Collection, Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from rayfleet.gateway.shared_state import SharedCounts

Entry = dict[str, Any]


@dataclass
class Replica:
    replica_id: str
    model: str
    url: str
    node_id: str = ""
    node_ip: str = ""
    pid: int = 0
    ranks: tuple[dict[str, Any], ...] = ()  # each node of an engine that spans nodes
    app: str = ""  # the Serve application it belongs to (two during a rollout)
    slot: int = -1  # its column in the workers' shared counts (gateway.workers), or none
    num_inflight: int = 0
    num_consecutive_failures: int = 0
    cooldown_until: float = 0.0
    draining: bool = False  # out of rotation for new requests; every policy respects it

    def healthy(self, now: float) -> bool:
        return now >= self.cooldown_until

    def as_dict(self, now: float) -> dict[str, Any]:
        return {
            "replica_id": self.replica_id,
            "model": self.model,
            "url": self.url,
            "node_id": self.node_id,
            "node_ip": self.node_ip,
            "pid": self.pid,
            "ranks": list(self.ranks),
            "app": self.app,
            "healthy": self.healthy(now),
            "draining": self.draining,
            "inflight": self.num_inflight,
            "consecutive_failures": self.num_consecutive_failures,
            "cooldown_remaining_s": round(max(0.0, self.cooldown_until - now), 1),
        }


class ReplicaSet:
    def __init__(
        self, models: Iterable[str], *, cooldown_s: float = 5.0, max_consecutive_failures: int = 1
    ):
        self.models = list(models)
        self.cooldown_s = cooldown_s
        self.max_consecutive_failures = max_consecutive_failures
        self._by_model: dict[str, list[Replica]] = {m: [] for m in self.models}
        self._by_id: dict[str, Replica] = {}
        self._updated = asyncio.Event()  # set (and replaced) by every update
        # The workers' shared in-flight counts (shared_state.py), under gateway.workers.
        self.shared: SharedCounts | None = None
        self.waiting_slots: dict[str, int] = {}  # by model: its held requests' slot there
        # By model: its replicas in rotation (healthy, not draining), and until when that
        # holds (the end of the first cool-down under way). Dropped when membership changes.
        self._rotation: dict[str, tuple[list[Replica], float]] = {}

    def set_models(self, models: Iterable[str]) -> None:
        """Track ``models`` from now on; replicas of a model dropped are forgotten at the
        next ``update``."""
        self.models = list(models)
        self._by_model = {m: self._by_model.get(m, []) for m in self.models}
        self._rotation.clear()

    def update(self, entries: Iterable[Entry]) -> None:
        fresh: dict[str, Replica] = {}
        for entry in entries:
            if entry["model"] not in self._by_model:
                continue
            known = self._by_id.get(entry["replica_id"])
            # Same url and pid: the same server; a restart (new pid) is a new replica.
            if known is not None and (known.url, known.pid) == (entry["url"], entry.get("pid", 0)):
                fresh[known.replica_id] = known
            else:
                fresh[entry["replica_id"]] = Replica(
                    replica_id=entry["replica_id"],
                    model=entry["model"],
                    url=entry["url"],
                    node_id=entry.get("node_id", ""),
                    node_ip=entry.get("node_ip", ""),
                    pid=entry.get("pid", 0),
                    ranks=tuple(entry.get("ranks", ())),
                    app=entry.get("app", ""),
                    slot=entry.get("slot", -1),
                )
            # A leaving replica finishes what it has; the gateway sends it nothing new.
            fresh[entry["replica_id"]].draining = entry.get("state") == "draining"
        self._by_id = fresh
        by_model: dict[str, list[Replica]] = {m: [] for m in self.models}
        for replica in fresh.values():
            by_model[replica.model].append(replica)
        self._by_model = by_model
        self._rotation.clear()
        self._updated.set()
        self._updated = asyncio.Event()

    async def wait_for_candidates(self, model: str, timeout_s: float) -> bool:
        """Wait until ``model`` has a replica to send to (after a membership update);
        False when ``timeout_s`` passes first."""
        deadline = time.monotonic() + timeout_s
        while not self.candidates(model):
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return False
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._updated.wait(), remaining)
        return True

    def replicas(self, model: str | None = None) -> list[Replica]:
        if model is None:
            return list(self._by_id.values())
        return list(self._by_model.get(model, ()))

    def states(self, model: str) -> dict[str, int]:
        """``model``'s replicas by state: serving, draining, cooling_down."""
        now = time.monotonic()
        counts = {"serving": 0, "draining": 0, "cooling_down": 0}
        for replica in self._by_model.get(model, ()):
            if replica.draining:
                counts["draining"] += 1
            elif not replica.healthy(now):
                counts["cooling_down"] += 1
            else:
                counts["serving"] += 1
        return counts

    def num_healthy(self, model: str) -> int:
        """Replicas of ``model`` serving now: healthy and not draining."""
        now = time.monotonic()
        return sum(r.healthy(now) and not r.draining for r in self._by_model.get(model, ()))

    def candidates(self, model: str, exclude: Collection[str] = ()) -> list[Replica]:
        """The replicas of ``model`` a request may go to now: healthy, not draining, and
        not in ``exclude`` (ids already tried). A list of the caller's own."""
        now = time.monotonic()
        kept = self._rotation.get(model)
        if kept is None or now >= kept[1]:
            in_rotation = self._not_draining(model, (), healthy=True, now=now)
            ends = [
                r.cooldown_until for r in self._by_model.get(model, ()) if r.cooldown_until > now
            ]
            kept = self._rotation[model] = (in_rotation, min(ends, default=float("inf")))
        if exclude:
            return [r for r in kept[0] if r.replica_id not in exclude]
        return list(kept[0])

    def set_draining(self, replica: Replica, draining: bool = True) -> None:
        """Take ``replica`` out of rotation for new requests (or back in)."""
        replica.draining = draining
        self._rotation.pop(replica.model, None)

    def cooling(self, model: str, exclude: Collection[str] = ()) -> list[Replica]:
        """The replicas of ``model`` out of rotation after failing (cooling down), not
        draining and not in ``exclude``: a last resort when no other can serve."""
        return self._not_draining(model, exclude, healthy=False, now=time.monotonic())

    def _not_draining(
        self, model: str, exclude: Collection[str], healthy: bool, now: float
    ) -> list[Replica]:
        return [
            r
            for r in self._by_model.get(model, ())
            if (now >= r.cooldown_until) is healthy
            and not r.draining
            and r.replica_id not in exclude
        ]

    def begin(self, replica: Replica) -> None:
        replica.num_inflight += 1
        if self.shared is not None and replica.slot >= 0:
            self.shared.add(replica.slot, 1)

    def end(self, replica: Replica) -> None:
        replica.num_inflight -= 1
        if self.shared is not None and replica.slot >= 0:
            self.shared.add(replica.slot, -1)

    def count_waiting(self, model: str, delta: int) -> None:
        """A request held for ``model`` (+1) or no longer (-1), in the shared counts."""
        slot = self.waiting_slots.get(model)
        if self.shared is not None and slot is not None:
            self.shared.add(slot, delta)

    def refresh_shared(self) -> None:
        """Every replica's in-flight count over all the gateway's workers, from the
        shared counts (``gateway.workers``): what each policy weighs as its load."""
        shared = self.shared
        if shared is None:
            return
        for replica in self._by_id.values():
            if replica.slot >= 0:
                replica.num_inflight = shared.total(replica.slot)

    def succeeded(self, replica: Replica) -> None:
        replica.num_consecutive_failures = 0

    def failed(self, replica: Replica) -> bool:
        """Count a failure; True when it takes the replica out of rotation."""
        replica.num_consecutive_failures += 1
        if replica.num_consecutive_failures >= self.max_consecutive_failures:
            replica.cooldown_until = time.monotonic() + self.cooldown_s
            self._rotation.pop(replica.model, None)
            return True
        return False
