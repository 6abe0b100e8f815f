"""Runs the doctor on a Ray cluster: probes on every node, checks, link tests, report.

Everything a node does runs as a Ray task or actor pinned to that node with zero CPUs,
so a fully booked node is probed too. Every wait has a deadline: a node that does not
answer in time, or dies during the run, becomes a failed line for that node.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from rayfleet import _home
from rayfleet.cluster import connected, ray_nodes
from rayfleet.doctor import checks, network, probe
from rayfleet.doctor.context import Context
from rayfleet.doctor.needs import FleetNeeds, fleet_needs
from rayfleet.doctor.network import LinkMeasurement
from rayfleet.doctor.result import CheckResult, Node, Status, result_for

if TYPE_CHECKING:
    from rayfleet.config import FleetConfig

Progress = Callable[[str, int, int], None]  # (phase, done, total)
ADDRESS_HINT = "or pass the head's --address (host:port or ray://host:port)"


@dataclass
class DoctorOptions:
    address: str = "auto"
    timeout_s: float = 30.0
    network: bool = True
    net_max_s: float = 2.0
    net_max_bytes: int = 256 * 1024**2


@dataclass
class DoctorReport:
    address: str
    nodes: list[Node]
    results: list[CheckResult]
    links: list[LinkMeasurement] = field(default_factory=list)
    network_file: str | None = None

    @property
    def failed(self) -> bool:
        return any(r.status is Status.FAIL for r in self.results)


def run_doctor(
    options: DoctorOptions, fleet: FleetConfig | None = None, progress: Progress | None = None
) -> DoctorReport:
    """Check every node of the cluster at ``options.address`` (and what ``fleet`` needs)."""
    progress = progress or (lambda phase, done, total: None)
    with connected(options.address, hint=ADDRESS_HINT):
        nodes = alive_nodes()
        needs = fleet_needs(fleet, nodes)
        facts, results = probe_nodes(nodes, needs, options.timeout_s, progress)
        ctx = Context(nodes=nodes, facts=facts, needs=needs)
        for node in nodes:
            if node.node_id in facts:
                results.extend(checks.run_node_checks(node, facts[node.node_id], ctx))
        results.extend(checks.run_cluster_checks(ctx))
        links: list[LinkMeasurement] = []
        saved = None
        if options.network:
            answered = [n for n in nodes if n.node_id in facts]
            links, link_results = measure_links(answered, needs, options, progress)
            results.extend(link_results)
            if links or len(answered) == 1:
                saved = str(network.save_links(links))
        results.extend(departed_nodes(nodes))
    return DoctorReport(options.address, nodes, results, links, saved)


# --- nodes -----------------------------------------------------------------------


def alive_nodes() -> list[Node]:
    nodes = []
    for info in ray_nodes():
        if not info.get("Alive"):
            continue
        resources = info.get("Resources", {})
        nodes.append(
            Node(
                node_id=info["NodeID"],
                ip=info["NodeManagerAddress"],
                is_head="node:__internal_head__" in resources,
                num_gpus=float(resources.get("GPU", 0.0)),
                num_cpus=float(resources.get("CPU", 0.0)),
            )
        )
    nodes.sort(key=lambda n: (not n.is_head, n.ip, n.node_id))
    return nodes


def departed_nodes(nodes: Sequence[Node]) -> list[CheckResult]:
    """Nodes alive when the run started and gone by its end."""
    alive = {info["NodeID"] for info in ray_nodes() if info.get("Alive")}
    return [
        result_for(
            n,
            "node",
            Status.FAIL,
            "left the cluster during the run",
            "see the node's raylet.out / dmesg (killed, OOM, lost network), then restart Ray on it",
        )
        for n in nodes
        if n.node_id not in alive
    ]


# --- probes -----------------------------------------------------------------------


def probe_nodes(
    nodes: Sequence[Node], needs: FleetNeeds, timeout_s: float, progress: Progress
) -> tuple[dict[str, dict[str, Any]], list[CheckResult]]:
    """Run ``probe_node`` on every node at once; return facts of those that answered."""
    import ray
    from ray.exceptions import RayError

    _pickle_by_value()
    task = ray.remote(num_cpus=0, max_retries=0)(probe.probe_node)
    pending: dict[Any, Node] = {}
    for node in nodes:
        request = probe_request(node, needs)
        pinned = task.options(scheduling_strategy=_pinned(node), name="rayfleet-doctor-probe")
        pending[pinned.remote(request)] = node
    facts: dict[str, dict[str, Any]] = {}
    failures: list[CheckResult] = []
    deadline = time.monotonic() + timeout_s
    progress("probing nodes", 0, len(nodes))
    while pending and (left := deadline - time.monotonic()) > 0:
        ready, _ = ray.wait(list(pending), num_returns=1, timeout=left)
        for ref in ready:
            node = pending.pop(ref)
            try:
                facts[node.node_id] = ray.get(ref)
            except RayError as exc:
                failures.append(
                    result_for(
                        node,
                        "node",
                        Status.FAIL,
                        f"probe failed: {_ray_reason(exc)}",
                        "check that Ray and Python work on this node "
                        "(`ray status`, its raylet.out)",
                    )
                )
            progress("probing nodes", len(nodes) - len(pending), len(nodes))
    for ref, node in pending.items():
        ray.cancel(ref, force=True)
        failures.append(
            result_for(
                node,
                "node",
                Status.FAIL,
                f"did not answer within {timeout_s:g} s",
                "the node is hung or overloaded: check it (`ray status`, its "
                "raylet.out), or raise --timeout-s",
            )
        )
    return facts, failures


def probe_request(node: Node, needs: FleetNeeds) -> dict[str, Any]:
    sources = [{"name": m.name, "source": m.source} for m in needs.models]
    ports = [needs.gateway_port] if needs.gateway_port and node.is_head else []
    return {"model_sources": sources, "ports": ports}


# --- links ------------------------------------------------------------------------


def measure_links(
    nodes: Sequence[Node], needs: FleetNeeds, options: DoctorOptions, progress: Progress
) -> tuple[list[LinkMeasurement], list[CheckResult]]:
    """Measure every pair of ``nodes``, disjoint pairs at once; results for each pair."""
    if len(nodes) < 2:
        return [], []
    import ray

    by_id = {n.node_id: n for n in nodes}
    rounds = network.pair_rounds(list(by_id))
    total = sum(len(r) for r in rounds)
    io_timeout_s = options.net_max_s + 10
    peer_class = ray.remote(num_cpus=0, max_restarts=0)(network.LinkPeer)
    peers: dict[str, Any] = {
        n.node_id: peer_class.options(scheduling_strategy=_pinned(n), name=None).remote(
            io_timeout_s
        )
        for n in nodes
    }
    links: list[LinkMeasurement] = []
    results: list[CheckResult] = []
    done = 0
    progress("measuring links", 0, total)
    try:
        endpoints = _listen_all(peers, options.timeout_s)
        for pairs in rounds:
            calls, failed = _start_round(pairs, by_id, peers, endpoints, options)
            measured, answers = _collect_round(
                calls, needs, timeout_s=options.net_max_s + io_timeout_s + 5
            )
            links.extend(measured)
            results.extend(failed + answers)
            done += len(pairs)
            progress("measuring links", done, total)
    finally:
        for peer in peers.values():
            ray.kill(peer)
    return links, results


def _start_round(
    pairs: Sequence[tuple[str, str]],
    by_id: dict[str, Node],
    peers: dict[str, Any],
    endpoints: dict[str, Any],
    options: DoctorOptions,
) -> tuple[dict[Any, tuple[Node, Node]], list[CheckResult]]:
    """Start one round's measurements; ``ref -> (src, dst)``, and pairs without a peer."""
    calls: dict[Any, tuple[Node, Node]] = {}
    failures: list[CheckResult] = []
    for src_id, dst_id in pairs:
        if dst_id not in endpoints or src_id not in endpoints:
            dead = dst_id if dst_id not in endpoints else src_id
            reason = f"no peer on {by_id[dead].label}: {endpoints.get(dead + '!', 'did not start')}"
            failures.append(_link_failure(by_id[src_id], by_id[dst_id], reason))
            continue
        host, port = endpoints[dst_id]
        ref = peers[src_id].measure.remote(host, port, options.net_max_s, options.net_max_bytes)
        calls[ref] = (by_id[src_id], by_id[dst_id])
    return calls, failures


def _collect_round(
    calls: dict[Any, tuple[Node, Node]], needs: FleetNeeds, *, timeout_s: float
) -> tuple[list[LinkMeasurement], list[CheckResult]]:
    """Wait for one round's measurements; a late or failed pair is a failed line."""
    import ray
    from ray.exceptions import RayError

    links: list[LinkMeasurement] = []
    results: list[CheckResult] = []
    ready, late = ray.wait(list(calls), num_returns=len(calls), timeout=timeout_s)
    for ref in ready:
        src, dst = calls[ref]
        try:
            measured = ray.get(ref)
        except RayError as exc:
            results.append(_link_failure(src, dst, _ray_reason(exc)))
            continue
        link = LinkMeasurement(
            src.node_id, dst.node_id, src.ip, dst.ip, measured["gbps"], measured["rtt_ms"]
        )
        links.append(link)
        results.append(network.link_result(src, dst, link, needs))
    results.extend(_link_failure(*calls[ref], "no answer in time") for ref in late)
    return links, results


def _listen_all(peers: dict[str, Any], timeout_s: float) -> dict[str, Any]:
    """Start every peer's server; ``id -> (ip, port)``, and ``id + '!' -> reason`` on failure."""
    import ray
    from ray.exceptions import RayError

    refs = {peers[node_id].listen.remote(): node_id for node_id in peers}
    ready, late = ray.wait(list(refs), num_returns=len(refs), timeout=timeout_s)
    endpoints: dict[str, Any] = {}
    for ref in ready:
        try:
            endpoints[refs[ref]] = tuple(ray.get(ref))
        except RayError as exc:
            endpoints[refs[ref] + "!"] = _ray_reason(exc)
    for ref in late:
        endpoints[refs[ref] + "!"] = "did not start in time"
    return endpoints


def _link_failure(src: Node, dst: Node, reason: str) -> CheckResult:
    return CheckResult(
        f"{src.label} -> {dst.label}",
        "network",
        Status.FAIL,
        f"not measured: {reason}",
        "check that both nodes are up and reach each other on any TCP port",
    )


# --- helpers ----------------------------------------------------------------------


def _pinned(node: Node) -> Any:
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    return NodeAffinitySchedulingStrategy(node_id=node.node_id, soft=False)


def _pickle_by_value() -> None:
    """Ship the probe and the link peer as code, so nodes need no matching rayfleet."""
    from ray import cloudpickle

    for module in (probe, network, _home):
        with contextlib.suppress(ValueError):
            cloudpickle.register_pickle_by_value(module)  # type: ignore[no-untyped-call]


def _ray_reason(exc: Exception) -> str:
    """One line out of a Ray exception (they carry tracebacks)."""
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
    interesting = [line for line in lines if not line.startswith(("Traceback", "File ", "^"))]
    text = interesting[-1] if interesting else type(exc).__name__
    return f"{type(exc).__name__}: {text}"[:300]
