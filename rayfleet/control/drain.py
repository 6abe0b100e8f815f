"""A leaving replica finishes what it has before its vLLM server stops: no planned stop
cuts a stream.

Serve chooses which replica leaves on scale-in, and stops replicas on ``rayfleet
down`` and on an apply that replaces them; in every case it calls the replica's
destructor, which drains first::

    drain(engine, mark_draining, timeout_s)
        mark_draining()       the registry entry says "draining": within one poll
                              (GATEWAY_POLL_S) the gateway stops sending it requests
        wait                  until vLLM's own gauges (running + waiting requests)
                              stay at zero for QUIET_S, longer than a gateway poll,
                              so a request sent just before the gateway saw the
                              state has arrived and finished too; at most timeout_s
        -> DrainResult        how it ended, and how long it took

The replica then stops its server. Serve's graceful shutdown timeout is set above the
drain timeout (``replica.deployment_options``), so Serve never kills a draining
replica first.
"""

from __future__ import annotations

import time
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass

from rayfleet.control.engine import EngineProcess
from rayfleet.control.load_signal import LoadUnavailable, parse_engine_load

GATEWAY_POLL_S = 1.0  # the gateway's registry poll (Gateway.poll_interval_s)
QUIET_S = 2.5 * GATEWAY_POLL_S
POLL_S = 0.25


@dataclass(frozen=True)
class DrainResult:
    ended: str  # "idle": nothing left in flight; "timeout"; "not serving": server gone
    waited_s: float


def requests_in_engine(url: str, timeout_s: float = 2.0) -> float | None:
    """Running + waiting requests of the vLLM server at ``url``; None if it cannot say."""
    try:
        with urllib.request.urlopen(url + "/metrics", timeout=timeout_s) as response:
            text = response.read().decode()
        load = parse_engine_load(text)
    except (urllib.error.URLError, OSError, LoadUnavailable):
        return None
    return load.running + load.waiting


def drain(
    engine: EngineProcess,
    mark_draining: Callable[[], object],
    timeout_s: float,
    *,
    quiet_s: float = QUIET_S,
    poll_s: float = POLL_S,
) -> DrainResult:
    """Take the replica out of rotation and wait until its server has nothing in flight."""
    started = time.monotonic()
    if not engine.healthy(timeout_s=2.0):
        return DrainResult("not serving", 0.0)
    mark_draining()
    quiet_since: float | None = None
    while (now := time.monotonic()) - started < timeout_s:
        in_flight = requests_in_engine(engine.url)
        if in_flight is None and not engine.alive():
            return DrainResult("not serving", now - started)
        if in_flight == 0:
            quiet_since = quiet_since if quiet_since is not None else now
            if now - quiet_since >= quiet_s:
                return DrainResult("idle", now - started)
        else:
            quiet_since = None
        time.sleep(poll_s)
    return DrainResult("timeout", time.monotonic() - started)
