"""``LeastLoad``: the replica with the fewest requests in flight; ties go round-robin."""

from __future__ import annotations

import itertools
import operator
from collections.abc import Sequence

from rayfleet.gateway.replica_policy import RequestInfo
from rayfleet.gateway.replicas import Replica

_INFLIGHT = operator.attrgetter("num_inflight")


class LeastLoad:
    """A ``ReplicaPolicy`` that reads nothing of the request, only the counts in flight."""

    def __init__(self) -> None:
        self._tiebreak = itertools.count()

    def pick(self, request: RequestInfo, replicas: Sequence[Replica]) -> Replica | None:
        if not replicas:
            return None
        least = min(map(_INFLIGHT, replicas))
        tied = [r for r in replicas if r.num_inflight == least]
        return tied[next(self._tiebreak) % len(tied)]
