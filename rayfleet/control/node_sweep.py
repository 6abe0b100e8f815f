"""The engines a fleet spawned on other nodes, stopped there through Ray when it stops.

    stopped = sweep_other_nodes(pid_dir)    # {node id: [process group, ...]}

A replica records its vLLM server in ``pid_dir`` on its own node (process_groups.py)
and stops it when it stops. What a replica could not stop (it was killed while its
server started, or its server lost its engine core's parent) stays recorded on that
node. The fleet process sweeps its own node's records itself; the other nodes' files
are not on its disk. So at shutdown, once Serve's replicas are gone and while Ray is
still connected, it runs one task on every other alive node (pinned to it, no CPU
asked) that stops every group still recorded there (``kill_recorded_engines``). Where
every node shares one disk (several raylets on one machine), the tasks find the same
records, and the first to reach a group stops it.

A node with no replica left keeps such leftovers until then: a replica placed there
later stops them before starting its own server (``stop_leaderless_engines``).
"""

from __future__ import annotations

import logging
from pathlib import Path

log = logging.getLogger("rayfleet.control")

SWEEP_TIMEOUT_S = 60.0


def sweep_other_nodes(pid_dir: Path, timeout_s: float = SWEEP_TIMEOUT_S) -> dict[str, list[int]]:
    """Stop every engine group recorded in ``pid_dir`` on each alive Ray node other than
    this process's; returns the groups stopped, by node id. A node that does not answer
    within ``timeout_s`` is logged and left (``rayfleet down`` must not hang on it)."""
    import ray

    from rayfleet.cluster import on_each_node

    here = ray.get_runtime_context().get_node_id()
    nodes = ray.nodes()  # type: ignore[no-untyped-call]
    others = [n["NodeID"] for n in nodes if n.get("Alive") and n["NodeID"] != here]
    stopped, failed, late = on_each_node(_stop_recorded, others, timeout_s, str(pid_dir))
    for node in late:
        log.warning("node %s did not sweep its engine records in %g s", node, timeout_s)
    for node, exc in failed.items():
        log.warning("node %s could not sweep its engine records: %s", node, exc)
    return stopped


def _stop_recorded(pid_dir: str) -> list[int]:
    from rayfleet.control.process_groups import kill_recorded_engines

    return kill_recorded_engines(Path(pid_dir))
