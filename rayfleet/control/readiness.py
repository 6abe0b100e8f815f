"""Waiting at start until every model has its replicas, or failing with the reason.

    await wait_until_ready(config, gateway, targets, apps, say)

Once a second: the gateway's healthy replicas per model against its target, said when
the line changes ("replicas ready: chat 1/2, embed 1/1"); a deployment Serve reports
failed ends the wait with the last lines of its error; past
``cluster.placement_timeout_s``, a replica whose placement group Ray still holds back
ends it with the group's state (rayfleet/control/scheduling.py).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING

from rayfleet.config import FleetConfig
from rayfleet.control.deploy import failed_deployments
from rayfleet.control.scheduling import stalled_placement
from rayfleet.errors import RayfleetError

if TYPE_CHECKING:
    from rayfleet.gateway.app import Gateway

POLL_S = 1.0


async def wait_until_ready(
    config: FleetConfig,
    gateway: Gateway,
    targets: Mapping[str, int],
    apps: Mapping[str, str],
    say: Callable[[str], None],
) -> None:
    """Return once each model has ``targets[model]`` healthy replicas in ``gateway``;
    RayfleetError when a deployment (Serve application ``apps[model]``) failed or a
    replica's placement stalled."""
    last = None
    started = time.monotonic()
    while True:
        counts = {
            m.name: (gateway.replica_set.num_healthy(m.name), targets[m.name])
            for m in config.models
        }
        line = ", ".join(f"{name} {have}/{want}" for name, (have, want) in counts.items())
        if line != last:
            say(f"replicas ready: {line}")
            last = line
        if all(have >= want for have, want in counts.values()):
            return
        failed = await asyncio.to_thread(failed_deployments, config, dict(apps))
        if failed:
            name, message = next(iter(failed.items()))
            raise RayfleetError(f"model '{name}' failed to deploy: {_last_lines(message)}")
        waited_s = time.monotonic() - started
        if waited_s > config.cluster.placement_timeout_s:
            await _refuse_stalled(counts, waited_s)
        await asyncio.sleep(POLL_S)


async def _refuse_stalled(counts: dict[str, tuple[int, int]], waited_s: float) -> None:
    """Fail with the placement group's state when Ray still holds replicas back."""
    for name, (have, want) in counts.items():
        if have < want:
            stalled = await asyncio.to_thread(stalled_placement, name, waited_s)
            if stalled:
                raise RayfleetError(stalled)


def _last_lines(message: str, num_lines: int = 12) -> str:
    lines = [line for line in message.strip().splitlines() if line.strip()]
    return "\n".join(lines[-num_lines:])
