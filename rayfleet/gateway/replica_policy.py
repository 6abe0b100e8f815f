"""Which replica serves a request: a policy object per model, behind one small interface.

    replica = policy.pick(RequestInfo(path, model, body, headers), candidates)

``candidates`` come from ``ReplicaSet.candidates``: healthy, not draining, not already
tried for this request, so that no policy can pick a draining replica. ``pick`` returns
one of them, or None to decline (the dispatcher then answers as for no replica). A
policy may keep state of its own (a rotation, a prefix table), but counts in flight
live on the replicas. Policies: ``LeastLoad`` (least_load.py, the default),
``RoundRobin``, ``PrefixRouting`` and ``SessionAffinity``, built per model from fleet.yaml's
``routing`` by ``build_replica_policy`` (routing.py).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from rayfleet.gateway.replicas import Replica


@dataclass(frozen=True)
class RequestInfo:
    """What a policy may read of the request it places."""

    path: str  # "/v1/chat/completions", ...
    model: str  # the fleet model it goes to (a route already resolved)
    body: Mapping[str, Any]  # the parsed body, as the replica will get it
    headers: Mapping[str, str]


class ReplicaPolicy(Protocol):
    def pick(self, request: RequestInfo, replicas: Sequence[Replica]) -> Replica | None: ...
