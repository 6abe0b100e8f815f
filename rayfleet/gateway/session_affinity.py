"""``SessionAffinity``: a conversation stays on one replica while that replica's load is
bounded (consistent hashing with bounded loads).

The request's session header (``x-session-id`` by default) is hashed onto a ring on which
every replica has ``_POINTS_PER_REPLICA`` points; the conversation goes to the first
replica clockwise whose requests in flight are under the bound
``ceil((1 + load_factor) * (total_in_flight + 1) / num_replicas)``, at least 2. A replica
at the bound passes the key on to the next one on the ring, so a hot conversation spills
over to the same second replica every time instead of scattering, and a replica joining
or leaving moves only the conversations whose points it takes or gave. Since the bound
is above the mean, some replica is always under it. A request without the header goes to
``fallback`` (least load).

The ring's hash is blake2b, not Python's salted ``hash``, so every gateway process puts a
session on the same replica. The ring is rebuilt when a candidate is not on it (about 2 ms
for 64 replicas); replicas on it that are not candidates now (tried, cooling down, gone)
are skipped.
"""

from __future__ import annotations

import bisect
import hashlib
from collections.abc import Mapping, Sequence

from rayfleet.config.routing import RoutingConfig
from rayfleet.gateway.least_load import LeastLoad
from rayfleet.gateway.replica_policy import ReplicaPolicy, RequestInfo, load_bound
from rayfleet.gateway.replicas import Replica

_POINTS_PER_REPLICA = 64  # spreads keys evenly within a few percent at 8 replicas and more


def ring_hash(key: str) -> int:
    return int.from_bytes(hashlib.blake2b(key.encode(), digest_size=8).digest(), "big")


class SessionAffinity:
    """A ``ReplicaPolicy`` keyed on a session header, with bounded load."""

    name = "session"

    def __init__(
        self,
        config: RoutingConfig = RoutingConfig(policy="session"),
        *,
        fallback: ReplicaPolicy | None = None,
    ):
        self.header = config.session_header
        self.load_factor = config.bounded_load_factor
        self.fallback = fallback if fallback is not None else LeastLoad()
        self._on_ring: frozenset[str] = frozenset()
        self._points: list[int] = []
        self._owners: list[str] = []

    def pick(self, request: RequestInfo, replicas: Sequence[Replica]) -> Replica | None:
        if not replicas:
            return None
        key = _header(request.headers, self.header)
        if not key:
            return self.fallback.pick(request, replicas)
        by_id = {r.replica_id: r for r in replicas}
        if not self._on_ring.issuperset(by_id):
            self._build_ring(by_id)
        return self._walk(ring_hash(key), by_id, load_bound(replicas, self.load_factor))

    def _walk(self, point: int, by_id: Mapping[str, Replica], bound: int) -> Replica:
        """The first replica clockwise from ``point`` with fewer than ``bound`` in flight."""
        owners = self._owners
        start = bisect.bisect(self._points, point)
        checked: set[str] = set()
        for step in range(len(owners)):
            owner = owners[(start + step) % len(owners)]
            if owner in checked:
                continue
            checked.add(owner)
            replica = by_id.get(owner)
            if replica is not None and replica.num_inflight < bound:
                return replica
            if len(checked) == len(self._on_ring):
                break
        return min(by_id.values(), key=lambda r: r.num_inflight)  # unreachable: bound > mean

    def _build_ring(self, by_id: Mapping[str, Replica]) -> None:
        ring = sorted(
            (ring_hash(f"{replica_id}#{i}"), replica_id)
            for replica_id in by_id
            for i in range(_POINTS_PER_REPLICA)
        )
        self._points = [point for point, _ in ring]
        self._owners = [owner for _, owner in ring]
        self._on_ring = frozenset(by_id)


def _header(headers: Mapping[str, str], name: str) -> str | None:
    value = headers.get(name)
    if value is None and name.lower() != name:
        value = headers.get(name.lower())
    return value
