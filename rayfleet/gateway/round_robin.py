"""``RoundRobin``: each request to the next replica in turn, whatever their load."""

from __future__ import annotations

import itertools
from collections.abc import Sequence

from rayfleet.gateway.replica_policy import RequestInfo
from rayfleet.gateway.replicas import Replica


class RoundRobin:
    """A ``ReplicaPolicy`` that reads nothing: the candidates in turn (a baseline)."""

    name = "round_robin"

    def __init__(self) -> None:
        self._turn = itertools.count()

    def pick(self, request: RequestInfo, replicas: Sequence[Replica]) -> Replica | None:
        if not replicas:
            return None
        return replicas[next(self._turn) % len(replicas)]
