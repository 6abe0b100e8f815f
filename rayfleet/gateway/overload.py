"""The gateway process's own limit on requests in flight, and the open files behind it.

    limit = InFlightLimit(policies.max_in_flight)   # None: what the open files allow
    limit.enter()      # RequestError 503 + Retry-After when ``limit`` are in flight
    try: ... finally: limit.leave()

A gateway process past what its core can carry keeps accepting: each request's wait in
front of the event loop grows, the requests in flight grow with it, and every one of them
holds a client socket and a replica socket. Left alone, throughput falls well below the
ceiling (5,000 offered req/s gave 2,367 on a core that carries 3,500), and at the
open-file limit ``accept`` and ``connect`` fail under requests already admitted.

``InFlightLimit`` refuses the request over the limit at once, before its body is parsed,
with OpenAI's error JSON: a 503 with ``Retry-After: 1``, which the official ``openai``
clients retry by themselves. What is in flight is served as before. The count is this
process's: each process of ``gateway.workers`` holds its own limit (they share no sockets).

The default limit is what the open files allow: two sockets a request, after a reserve
for the replica connections kept idle, the log and the metrics. ``gateway.max_in_flight``
sets a lower one, which holds a process near its ceiling under overload.
"""

from __future__ import annotations

import resource

from rayfleet.gateway.errors import RequestError

RETRY_AFTER_S = 1
_RESERVED_FILES = 512  # idle keep-alive connections to replicas, logs, metrics, Ray
_FILES_PER_REQUEST = 2  # the client's socket and the replica's
_MIN_DEFAULT = 64


def raise_open_file_limit() -> int:
    """Raise this process's soft limit on open files to its hard limit; the new soft
    limit. Left as it is where the system refuses."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard == resource.RLIM_INFINITY or hard > soft:
        target = hard if hard != resource.RLIM_INFINITY else max(soft, 1 << 20)
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
        except (ValueError, OSError):
            return soft
        return target
    return soft


def default_max_in_flight(open_files: int) -> int:
    """The most requests one process can hold without running out of open files."""
    return max(_MIN_DEFAULT, (open_files - _RESERVED_FILES) // _FILES_PER_REQUEST)


class InFlightLimit:
    """Requests this process holds now, refused over ``limit``: ``gateway.max_in_flight``
    when set (``configured``), else what the open files allow. The soft open-file limit is
    raised to the hard one once, at construction; ``configure`` (rayfleet apply) only
    chooses between the two."""

    def __init__(self, configured: int | None = None):
        self.default = default_max_in_flight(raise_open_file_limit())
        self.count = 0
        self.configure(configured)

    def configure(self, configured: int | None) -> None:
        self.configured = configured
        self.limit = configured if configured is not None else self.default

    def enter(self) -> None:
        """Count one more request in flight, or raise the 503 that refuses it."""
        if self.count >= self.limit:
            source = (
                "gateway.max_in_flight" if self.configured is not None else "its open-file limit"
            )
            raise RequestError(
                503,
                f"The gateway is at its limit of {self.limit} requests in flight "
                f"({source}); retry after {RETRY_AFTER_S} s.",
                code="gateway_overloaded",
                reason="gateway_overloaded",
                headers={"Retry-After": str(RETRY_AFTER_S)},
            )
        self.count += 1

    def leave(self) -> None:
        self.count -= 1
