"""The doctor's checks: each reads one node's facts and returns ok / warn / fail with the fix.

Checks are independent and pure (facts in, results out), so they are tested without a
cluster. A node check is ``check(node, facts, ctx) -> list[CheckResult]``; a cluster check
is ``check(ctx) -> list[CheckResult]`` (``Context`` is in ``context.py``). The GPU checks
are in ``gpus.py``; ``run_node_checks`` and ``run_cluster_checks`` run them all.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from rayfleet.doctor.context import GIB, Context, ProbeError, gib, part
from rayfleet.doctor.gpus import check_gpus, check_gpus_cluster
from rayfleet.doctor.needs import FleetNeeds
from rayfleet.doctor.result import CheckResult, Node, Status, cluster_result, result_for

SHM_FAIL_BYTES = 1 * GIB
SHM_WARN_BYTES = 8 * GIB
DISK_FAIL_BYTES = 2 * GIB
DISK_WARN_BYTES = 20 * GIB
VERSIONED = ("python", "ray", "vllm", "torch", "rayfleet")


NodeCheck = Callable[[Node, dict[str, Any], Context], list[CheckResult]]


# --- versions ---------------------------------------------------------------------


def check_versions(node: Node, facts: dict[str, Any], ctx: Context) -> list[CheckResult]:
    mine = part(facts, "versions")
    head_facts = ctx.head_facts
    head = part(head_facts, "versions") if head_facts else mine
    status, problems, fixes = Status.OK, [], []
    for name in VERSIONED:
        have = (mine.get(name) or {}).get("version")
        want = (head.get(name) or {}).get("version")
        where = (mine.get(name) or {}).get("location")
        verdict = compare_versions(name, have, want, needed=_needed(name, ctx.needs))
        if verdict is Status.OK:
            continue
        status = max(status, verdict, key=_rank)
        if want is None:
            problems.append(f"{name} not installed on head or here")
            fixes.append(f"install {name} on every node")
        elif have is None:
            problems.append(f"{name} missing (head {want})")
            fixes.append(f"install {name}=={want} on this node")
        else:
            problems.append(f"{name} {have} (head {want})")
            fixes.append(
                f"this node imports {name} {have} from {where}: install {name}=={want} "
                "there or remove that copy from its PYTHONPATH"
            )
    if status is Status.OK:
        value = ", ".join(f"{n} {(mine.get(n) or {}).get('version') or '-'}" for n in VERSIONED)
        return [result_for(node, "versions", Status.OK, value)]
    return [result_for(node, "versions", status, "; ".join(problems), "; ".join(fixes))]


def compare_versions(name: str, have: str | None, want: str | None, needed: bool) -> Status:
    if want is None and have is None:
        return Status.FAIL if needed else Status.WARN
    if have == want:
        return Status.OK
    if name == "python" and have and want and have.split(".")[:2] == want.split(".")[:2]:
        return Status.WARN  # same minor release: Ray works, but keep them equal
    return Status.FAIL


def _needed(name: str, needs: FleetNeeds) -> bool:
    return name in ("python", "ray", "rayfleet") or (needs.given and name == "vllm")


# --- shared memory ----------------------------------------------------------------


def check_shm(node: Node, facts: dict[str, Any], ctx: Context) -> list[CheckResult]:
    shm = part(facts, "shm")
    status, value, fix = judge_shm(shm.get("total_bytes"), ctx.needs.parallel_models)
    return [result_for(node, "shm", status, value, fix)]


def judge_shm(total_bytes: int | None, parallel_models: list[str]) -> tuple[Status, str, str]:
    fix = "give the container more shared memory: `docker run --ipc host` or `--shm-size 16g`"
    if total_bytes is None:
        return Status.FAIL if parallel_models else Status.WARN, "/dev/shm missing", fix
    value = f"/dev/shm {gib(total_bytes)}"
    if total_bytes < SHM_FAIL_BYTES:
        if parallel_models:
            return (
                Status.FAIL,
                f"{value}; {', '.join(parallel_models)} use TP/PP",
                "NCCL hangs at 'waiting for all workers' with this little; " + fix,
            )
        return Status.WARN, value, "any model with TP or PP will hang or crash; " + fix
    if total_bytes < SHM_WARN_BYTES:
        return Status.WARN, value, "under 8 GiB; " + fix
    return Status.OK, value, ""


# --- NCCL -------------------------------------------------------------------------


def check_nccl(node: Node, facts: dict[str, Any], ctx: Context) -> list[CheckResult]:
    status, value, fix = judge_nccl(part(facts, "nccl"), node.num_gpus)
    return [result_for(node, "nccl", status, value, fix)]


def judge_nccl(nccl: dict[str, Any], num_gpus: float) -> tuple[Status, str, str]:
    env = nccl.get("env") or {}
    interfaces = list(nccl.get("interfaces") or [])
    ib = list(nccl.get("ib_devices") or [])
    shown = [f"{k}={v}" for k, v in sorted(env.items())]
    value = ", ".join([*shown, f"IB: {', '.join(ib) if ib else 'none'}"])
    for variable in ("NCCL_SOCKET_IFNAME", "GLOO_SOCKET_IFNAME"):
        spec = env.get(variable)
        if spec is not None and not match_interfaces(spec, interfaces):
            return (
                Status.FAIL,
                f"{variable}={spec} matches no interface here ({', '.join(interfaces)})",
                f"set {variable} to this node's inter-node interface (one of "
                f"{', '.join(i for i in interfaces if i != 'lo') or 'none'}) or unset it",
            )
    if ib and env.get("NCCL_IB_DISABLE") == "1":
        return (
            Status.WARN,
            value,
            "InfiniBand is present but NCCL_IB_DISABLE=1 sends NCCL over "
            "TCP: unset it unless IB is known broken",
        )
    if env.get("NCCL_P2P_DISABLE") == "1" and num_gpus > 1:
        return (
            Status.WARN,
            value,
            "NCCL_P2P_DISABLE=1 routes GPU-to-GPU traffic through host "
            "memory: unset it unless P2P is known broken",
        )
    return Status.OK, value, ""


def match_interfaces(spec: str, interfaces: list[str]) -> list[str]:
    """Interfaces NCCL would pick for ``NCCL_SOCKET_IFNAME=spec``.

    A comma-separated list of name prefixes; ``=`` before the list means exact names,
    ``^`` means every interface except those.
    """
    exclude = spec.startswith("^")
    spec = spec[1:] if exclude else spec
    exact = spec.startswith("=")
    spec = spec[1:] if exact else spec
    names = [s.strip() for s in spec.split(",") if s.strip()]

    def hit(iface: str) -> bool:
        return any(iface == n if exact else iface.startswith(n) for n in names)

    return [i for i in interfaces if hit(i) != exclude]


# --- Ray worker niceness -----------------------------------------------------------


def check_workers(node: Node, facts: dict[str, Any], ctx: Context) -> list[CheckResult]:
    status, value, fix = judge_niceness(part(facts, "workers")["niceness"])
    return [result_for(node, "worker niceness", status, value, fix)]


def judge_niceness(niceness: int) -> tuple[Status, str, str]:
    """Ray's workers (replica actors among them) at its default niceness of 15 get a
    sliver of a busy node's CPU: a replica starting beside serving engines waits on it."""
    value = f"Ray workers run at niceness {niceness}"
    if niceness <= 0:
        return Status.OK, value, ""
    return (
        Status.WARN,
        f"{value}: a replica starting beside busy engines is starved (its actor took "
        "51-55 s to start at 15, 3-4.5 s at 0, on 2 busy cores)",
        "start Ray on this node with `RAY_worker_niceness=0 ray start ...`",
    )


# --- disk, model sources, ports ---------------------------------------------------


def check_disk(node: Node, facts: dict[str, Any], ctx: Context) -> list[CheckResult]:
    disks = facts.get("disk")
    if not isinstance(disks, list):
        raise ProbeError(part(facts, "disk"))
    results = []
    for disk in disks:
        free = disk["free_bytes"]
        value = f"{gib(free)} free under {disk['path']}"
        fix = f"free space under {disk['path']} or point HF_HOME / RAYFLEET_HOME to a larger disk"
        if free < DISK_FAIL_BYTES:
            results.append(result_for(node, "disk", Status.FAIL, value, fix))
        elif free < DISK_WARN_BYTES:
            results.append(result_for(node, "disk", Status.WARN, value, fix))
        else:
            results.append(result_for(node, "disk", Status.OK, value))
    return results


def check_models(node: Node, facts: dict[str, Any], ctx: Context) -> list[CheckResult]:
    sources = facts.get("models")
    if not isinstance(sources, list):
        raise ProbeError(part(facts, "models"))
    by_name = {s["name"]: s for s in sources}
    results = []
    for model in ctx.needs.models:
        if node not in ctx.needs.hosts_for(model, ctx.nodes) or model.name not in by_name:
            continue
        seen = by_name[model.name]
        check = f"model {model.name}"
        if seen["present"]:
            results.append(result_for(node, check, Status.OK, seen["detail"]))
        elif seen["kind"] == "hub":
            results.append(
                result_for(
                    node,
                    check,
                    Status.FAIL,
                    seen["detail"],
                    f"download it on this node (`hf download {model.source}`) "
                    "or let the node reach the hub",
                )
            )
        else:
            results.append(
                result_for(
                    node,
                    check,
                    Status.FAIL,
                    seen["detail"],
                    f"copy the model to {model.source} on this node, or mount "
                    "shared storage at that path on every node",
                )
            )
    return results


def check_ports(node: Node, facts: dict[str, Any], ctx: Context) -> list[CheckResult]:
    ports = facts.get("ports")
    if not isinstance(ports, list):
        raise ProbeError(part(facts, "ports"))
    results = []
    for port in ports:
        check = f"port {port['port']}"
        if port["free"]:
            results.append(result_for(node, check, Status.OK, "free (gateway)"))
            continue
        holder = f", held by {port['holder']}" if port.get("holder") else ""
        results.append(
            result_for(
                node,
                check,
                Status.FAIL,
                f"in use{holder}",
                f"stop what listens on {port['port']} or set gateway.port to a free port",
            )
        )
    return results


NODE_CHECKS: list[NodeCheck] = [
    check_versions,
    check_gpus,
    check_shm,
    check_nccl,
    check_workers,
    check_disk,
    check_models,
    check_ports,
]
CLUSTER_CHECKS: list[Callable[[Context], list[CheckResult]]] = [check_gpus_cluster]


def run_node_checks(node: Node, facts: dict[str, Any], ctx: Context) -> list[CheckResult]:
    """Every node check on one node; a check that raises becomes a failed line with the reason."""
    results: list[CheckResult] = []
    for check in NODE_CHECKS:
        name = check.__name__.removeprefix("check_")
        try:
            results.extend(check(node, facts, ctx))
        except Exception as exc:  # noqa: BLE001 - a broken check is one line, not a traceback
            results.append(
                result_for(
                    node,
                    name,
                    Status.FAIL,
                    f"could not check: {_reason(exc)}",
                    "see the node's Ray worker logs",
                )
            )
    return results


def run_cluster_checks(ctx: Context) -> list[CheckResult]:
    results: list[CheckResult] = []
    for check in CLUSTER_CHECKS:
        try:
            results.extend(check(ctx))
        except Exception as exc:  # noqa: BLE001 - a broken check is one line, not a traceback
            results.append(
                cluster_result(
                    check.__name__.removeprefix("check_"),
                    Status.FAIL,
                    f"could not check: {_reason(exc)}",
                )
            )
    return results


def _reason(exc: Exception) -> str:
    text = str(exc).strip().splitlines()
    return text[0] if text else type(exc).__name__


def _rank(status: Status) -> int:
    return [Status.OK, Status.INFO, Status.WARN, Status.FAIL].index(status)
