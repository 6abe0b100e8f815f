"""Connecting to Ray, the same way for every command.

``address`` is what users write in ``--address`` or ``cluster.address``: ``local`` starts
an embedded Ray in this process; ``auto`` joins the cluster ``ray start`` runs on this
machine; ``host:port`` or ``ray://host:port`` join a remote head. Callers pass only what
differs between them::

    connect(address, hint="...", namespace=..., num_cpus=...)   # the fleet process
    with connected(address, hint="..."):                        # doctor, plan --from-cluster
        ray_nodes(), node_resources()                           # what the cluster has, free
    on_each_node(fn, node_ids, timeout_s)                       # a pinned task on each node

A local Ray runs its workers at niceness 0 (``WORKER_NICENESS``), not Ray's default of 15.
A replica actor is such a worker: at niceness 15, its start (a new process importing Ray,
Serve and rayfleet) got a sliver of the CPU beside engines already serving at niceness 0,
and a scale-up waited on it. Measured on 2 cores with two busy niceness-0 processes: an
actor importing the replica module started in 51-55 s at 15, 3.0-4.5 s at 0
(benchmarks/actor_start.py). A cluster that ``ray start`` runs keeps what its nodes were
started with; ``rayfleet up`` (``niced_workers``) and ``rayfleet doctor`` warn about a node
whose workers are niced, with the fix (``RAY_worker_niceness=0 ray start ...``).

When there is no cluster at the address, the error is one line that names the address,
says how to start a cluster, and ends with the caller's ``hint`` (the fix in that
command's own terms). An explicit address with nothing listening fails in seconds, not
after Ray's own minutes of retries.
"""

from __future__ import annotations

import contextlib
import logging
import os
import socket
from collections.abc import Callable, Iterable, Iterator
from typing import Any

from rayfleet.errors import RayfleetError

LOCAL = "local"
AUTO = "auto"
REACHABLE_TIMEOUT_S = 5.0
CLIENT_ATTEMPTS = 3  # Ray client connections (see _join)
WORKER_NICENESS = 0  # a local Ray's workers, replica actors among them (see above)
NICENESS_TIMEOUT_S = 60.0  # niced_workers: a node's answer later than this is left out


def connect(
    address: str,
    *,
    hint: str,
    namespace: str | None = None,
    num_cpus: int | None = None,
    logging_level: int = logging.ERROR,
) -> None:
    """Start a local Ray (``address`` is ``local``, with ``num_cpus`` logical CPUs) or join
    the cluster at ``address``; ``RayfleetError`` naming the address and ``hint`` if none."""
    import ray

    check_reachable(address, hint)
    try:
        if address == LOCAL:
            ray.init(
                address=LOCAL,
                num_cpus=num_cpus,
                include_dashboard=False,
                namespace=namespace,
                log_to_driver=False,
                logging_level=logging_level,
                _system_config={"worker_niceness": WORKER_NICENESS},
            )
        else:
            _join(address, namespace, logging_level)
    except (ConnectionError, RuntimeError) as exc:
        if address == LOCAL:
            raise RayfleetError(
                f"could not start a local Ray ({_first_line(exc)}); its logs are under "
                "/tmp/ray/session_latest/logs"
            ) from None
        raise RayfleetError(no_cluster(address, _first_line(exc), hint)) from None


def _join(address: str, namespace: str | None, logging_level: int) -> None:
    """``ray.init`` on a running cluster. A Ray client connection is tried up to
    ``CLIENT_ATTEMPTS`` times: the head's client server starts one server process per
    client, and on a busy head that start can miss its deadline ("Initialization failure
    from server") while the next attempt succeeds."""
    import ray

    attempts = CLIENT_ATTEMPTS if address.startswith("ray://") else 1
    for attempt in range(1, attempts + 1):
        try:
            ray.init(
                address=address,
                namespace=namespace,
                log_to_driver=False,
                logging_level=logging_level,
            )
            return
        except ConnectionError:
            if attempt == attempts:
                raise
            ray.shutdown()


@contextlib.contextmanager
def connected(address: str, *, hint: str) -> Iterator[None]:
    """Connected to Ray for the block: this process's connection if it has one (left
    open), else ``connect(address)`` and a disconnect at the end."""
    import ray

    if ray.is_initialized():
        yield
        return
    connect(address, hint=hint)
    try:
        yield
    finally:
        ray.shutdown()


def ray_nodes() -> list[dict[str, Any]]:
    """``ray.nodes()``: one record per node the cluster knows, alive or not."""
    import ray

    nodes: list[dict[str, Any]] = ray.nodes()  # type: ignore[no-untyped-call]
    return nodes


def node_resources() -> list[dict[str, Any]]:
    """Alive nodes as ``{node_id, ip, total, available}``: Ray's resources now, per node."""
    from ray._private.state import available_resources_per_node  # Ray's DeveloperAPI

    available: dict[str, dict[str, float]] = available_resources_per_node()  # type: ignore[no-untyped-call]
    return [
        {
            "node_id": node["NodeID"],
            "ip": node.get("NodeManagerAddress", ""),
            "total": dict(node.get("Resources") or {}),
            "available": dict(available.get(node["NodeID"], {})),
        }
        for node in ray_nodes()
        if node.get("Alive")
    ]


def on_each_node(
    fn: Callable[..., Any], nodes: Iterable[str], timeout_s: float, *args: Any
) -> tuple[dict[str, Any], dict[str, Exception], list[str]]:
    """``fn(*args)`` in a task of no CPU pinned to each of ``nodes`` (Ray node ids), run at
    once; ``(results, failures, late)`` by node id. A task not done within ``timeout_s``
    is cancelled and its node listed as late."""
    import ray
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    task = ray.remote(num_cpus=0, max_retries=0)(fn)
    pending: dict[Any, str] = {
        task.options(
            scheduling_strategy=NodeAffinitySchedulingStrategy(node_id=node, soft=False)
        ).remote(*args): node
        for node in nodes
    }
    if not pending:
        return {}, {}, []
    done, late = ray.wait(list(pending), num_returns=len(pending), timeout=timeout_s)
    for ref in late:
        ray.cancel(ref, force=True)
    results: dict[str, Any] = {}
    failures: dict[str, Exception] = {}
    for ref in done:
        try:
            results[pending[ref]] = ray.get(ref)
        except Exception as exc:  # noqa: BLE001 - one node's failure must not hide the others
            failures[pending[ref]] = exc
    return results, failures, [pending[ref] for ref in late]


def niced_workers(timeout_s: float = NICENESS_TIMEOUT_S) -> dict[str, tuple[str, int]]:
    """The alive nodes whose Ray workers run niced, as ``{node_id: (ip, niceness)}``: one
    task pinned to each node reads its own worker's niceness. A node that has not answered
    within ``timeout_s`` (busy, or gone) or whose task failed is left out, not guessed."""
    nodes = {n["NodeID"]: n.get("NodeManagerAddress", "") for n in ray_nodes() if n.get("Alive")}
    values, _failed, _late = on_each_node(_niceness, nodes, timeout_s)
    return {node: (nodes[node], value) for node, value in values.items() if value > 0}


def _niceness() -> int:
    return os.getpriority(os.PRIO_PROCESS, 0)


def niced_warning(timeout_s: float = NICENESS_TIMEOUT_S) -> str | None:
    """One line naming the nodes whose workers run niced, with the fix; None when none
    does, or when the check itself failed (it must not stop what asked)."""
    import ray

    try:
        niced = niced_workers(timeout_s)
    except ray.exceptions.RayError:
        return None
    if not niced:
        return None
    where = ", ".join(f"{ip} (node {node[:8]}) at {value}" for node, (ip, value) in niced.items())
    return (
        f"warning: Ray workers run niced on {where}: a replica actor starting there beside "
        "busy engines waits for the CPU (a scale-up took minutes on 2 cores); start Ray on "
        "those nodes with `RAY_worker_niceness=0 ray start ...`"
    )


def no_cluster(address: str, reason: str, hint: str) -> str:
    """The one message for 'nothing to join at this address'."""
    return f"no Ray cluster at '{address}' ({reason}): start one with `ray start --head`, {hint}"


def check_reachable(address: str, hint: str) -> None:
    """Fail in seconds when an explicit ``host:port`` address has nothing listening."""
    if address in (AUTO, LOCAL):
        return
    host, _, port = address.removeprefix("ray://").rpartition(":")
    host = host.strip("[]")
    if not host or not port.isdigit():
        raise RayfleetError(
            f"Ray address '{address}' is not 'auto', 'local', host:port or ray://host:port"
        )
    try:
        socket.create_connection((host, int(port)), timeout=REACHABLE_TIMEOUT_S).close()
    except OSError as exc:
        raise RayfleetError(no_cluster(address, exc.strerror or str(exc), hint)) from None


def _first_line(exc: Exception) -> str:
    lines = str(exc).strip().splitlines()
    return lines[0] if lines else type(exc).__name__
