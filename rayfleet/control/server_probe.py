"""Whether a replica's server still serves, as its health check asks every period.

    probe = ServerProbe(engine, timeout_s=5.0)
    problem = probe.problem()       # None, or why the replica must be replaced

A server whose process has exited is a problem at once. One that runs but leaves
``GET /health`` unanswered for ``timeout_s`` is a problem only after ``limit`` such probes
in a row (3 unless told, as Ray Serve counts failed checks before it restarts a
replica); an answer in between starts the count again. A live server is slow to answer
when its node is loaded: on two cores, with the engine's busy loop decoding a queue,
vLLM's API server has taken over 20 s to answer its /metrics
(tests/integration/test_control_faults.py), and a replica that stopped its server at the
first /health left unanswered for 5 s dropped every request that server had queued.
"""

from __future__ import annotations

import logging

from rayfleet.control.engine import EngineProcess

log = logging.getLogger("rayfleet.replica")

SLOW_ANSWERS_LIMIT = 3


class SlowAnswers:
    """Checks in a row that ``who`` left unanswered within ``timeout_s``: a problem at
    ``limit``, a warning on the log before; an answer starts the count again. The replica's
    /health probe (below) and its ranks' checks (ranks.py) count the same way."""

    def __init__(
        self, what: str, timeout_s: float, limit: int = SLOW_ANSWERS_LIMIT, where: str = ""
    ):
        self.what = what  # what goes unanswered: "/health", "its checks"
        self.timeout_s = timeout_s
        self.limit = limit
        self.where = f"{where}: " if where else ""  # the warning's prefix
        self.count = 0

    def answered(self) -> None:
        self.count = 0

    def unanswered(self, who: str) -> str | None:
        """Count one more; the problem once ``limit`` are in a row, else None."""
        self.count += 1
        if self.count >= self.limit:
            return (
                f"{who} does not answer {self.what} "
                f"({self.count} checks of {self.timeout_s:g} s in a row)"
            )
        log.warning(
            "%s%s left %s unanswered for %g s (%d of %d in a row)",
            self.where,
            who,
            self.what,
            self.timeout_s,
            self.count,
            self.limit,
        )
        return None


class ServerProbe:
    def __init__(
        self, engine: EngineProcess, timeout_s: float, limit: int = SLOW_ANSWERS_LIMIT
    ) -> None:
        self.engine = engine
        self.timeout_s = timeout_s
        self.slow = SlowAnswers("/health", timeout_s, limit)

    def problem(self) -> str | None:
        """Why the server cannot serve, or None (also while it is slow, below the limit)."""
        engine = self.engine
        if engine.healthy(timeout_s=self.timeout_s):  # False at once for an exited one
            self.slow.answered()
            return None
        if not engine.alive():  # exited, before the probe or while it waited
            return f"rank 0 (pid {engine.pid}) has exited"
        return self.slow.unanswered(f"rank 0 (pid {engine.pid})")
