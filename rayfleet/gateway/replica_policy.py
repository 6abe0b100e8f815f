"""Which replica serves a request: a policy object per model, behind one small interface.

    replica = policy.pick(RequestInfo(path, model, body, headers), candidates)

``candidates`` come from ``ReplicaSet.candidates``: healthy, not draining, not already
tried for this request, so that no policy can pick a draining replica. ``pick`` returns
one of them, or None to decline (the dispatcher then answers as for no replica). A
policy may keep state of its own (a rotation, a prefix table), but counts in flight
live on the replicas. Policies: ``LeastLoad`` (least_load.py, the default),
``RoundRobin``, ``PrefixRouting`` and ``SessionAffinity``, built per model from fleet.yaml's
``routing`` by ``build_replica_policy`` (routing.py).

A policy may also learn from what a replica did with a request it placed: when it has a
method ``observe_usage(replica, request, prompt_tokens, cached_tokens, completion_tokens,
answer)``,
the gateway calls it once a response ends with a usage (``Attempts``, attempt.py: the
``usage`` of a whole body or of a stream's usage chunk; ``cached_tokens`` is its
``prompt_tokens_details.cached_tokens``, None when the replica reports none), with the
same ``RequestInfo`` its pick was given (``memo`` holds what the pick worked out), and
with the answer's text when its ``wants_answer(request)`` says so (the gateway then keeps
a stream's whole body to read it from).
``PrefixRouting`` uses it to check its predictions and to count the blocks the answer
takes in the replica's cache; the others have none.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from rayfleet.gateway.replicas import Replica


@dataclass(frozen=True)
class RequestInfo:
    """What a policy may read of the request it places."""

    path: str  # "/v1/chat/completions", ...
    model: str  # the fleet model it goes to (a route already resolved)
    body: Mapping[str, Any]  # the parsed body, as the replica will get it
    headers: Mapping[str, str]
    # What a policy worked out of the request while placing it, kept under the policy
    # itself for its ``observe_usage`` once the response ends (PrefixRouting: the prompt's
    # block hashes), so that the end of a response does not redo the pick's work.
    memo: dict[object, Any] = field(default_factory=dict, compare=False, repr=False)


class ReplicaPolicy(Protocol):
    def pick(self, request: RequestInfo, replicas: Sequence[Replica]) -> Replica | None: ...


# observe_usage(replica, request, prompt_tokens, cached_tokens, completion_tokens, answer),
# when a policy has it; cached_tokens is None when the replica does not report it, answer
# (the first choice's text) None unless the policy's wants_answer(request) asked for it.
UsageObserver = Callable[[Replica, RequestInfo, int, int | None, int, str | None], None]
AnswerWanted = Callable[[RequestInfo], bool]

# Near idle the bound alone is 1 (with 8 replicas, until 6 are in flight): a session or a
# prefix would leave its replica, and its cache, whenever that replica serves one other.
_MIN_BOUND = 2


def load_bound(replicas: Sequence[Replica], load_factor: float) -> int:
    """The requests in flight a replica may have and still take one more, under bounded
    loads: ``ceil((1 + load_factor) * (all in flight + 1) / len(replicas))``, at least 2.
    It is above the mean, so some replica of ``replicas`` is always under it."""
    total = sum(r.num_inflight for r in replicas)
    return max(_MIN_BOUND, math.ceil((1 + load_factor) * (total + 1) / len(replicas)))
