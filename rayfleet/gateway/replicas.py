"""The gateway's view of the fleet: which replicas serve which model, and their health.

``ReplicaSet.update(entries)`` replaces the membership with what the registry
reports (entries are dicts ``{"replica_id", "model", "url", "node_id", "node_ip",
"pid"}``), keeping the replicas that stay (same url and pid), with their in-flight
counts and flags; a restarted server (new pid) is a new ``Replica``, so policies that
remember replicas (the prefix index) start it afresh.
``candidates(model, exclude)`` are the replicas a request may go to: healthy, not
draining, not already tried; a ``ReplicaPolicy`` (replica_policy.py) picks among them.
``begin`` / ``end`` count a request in and out; ``failed`` takes a replica out of
rotation for ``cooldown_s`` once it has failed ``max_consecutive_failures`` times in
a row, so that a dead server is not picked again before the registry notices it;
after the cool-down it is tried again, and one more failure sends it straight back
(one success resets the count). A replica whose ``draining`` flag is set finishes
what it has in flight and gets nothing new.
"""

from __future__ import annotations

import time
from collections.abc import Collection, Iterable
from dataclasses import dataclass
from typing import Any

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
                )
        self._by_id = fresh
        by_model: dict[str, list[Replica]] = {m: [] for m in self.models}
        for replica in fresh.values():
            by_model[replica.model].append(replica)
        self._by_model = by_model

    def replicas(self, model: str | None = None) -> list[Replica]:
        if model is None:
            return list(self._by_id.values())
        return list(self._by_model.get(model, ()))

    def num_healthy(self, model: str) -> int:
        now = time.monotonic()
        return sum(r.healthy(now) for r in self._by_model.get(model, ()))

    def candidates(self, model: str, exclude: Collection[str] = ()) -> list[Replica]:
        """The replicas of ``model`` a request may go to now: healthy, not draining, and
        not in ``exclude`` (ids already tried)."""
        now = time.monotonic()
        return [
            r
            for r in self._by_model.get(model, ())
            if r.healthy(now) and not r.draining and r.replica_id not in exclude
        ]

    @staticmethod
    def begin(replica: Replica) -> None:
        replica.num_inflight += 1

    @staticmethod
    def end(replica: Replica) -> None:
        replica.num_inflight -= 1

    def succeeded(self, replica: Replica) -> None:
        replica.num_consecutive_failures = 0

    def failed(self, replica: Replica) -> bool:
        """Count a failure; True when it takes the replica out of rotation."""
        replica.num_consecutive_failures += 1
        if replica.num_consecutive_failures >= self.max_consecutive_failures:
            replica.cooldown_until = time.monotonic() + self.cooldown_s
            return True
        return False
