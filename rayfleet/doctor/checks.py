"""The doctor's checks: each reads one node's facts and returns ok / warn / fail with the fix.

Checks are independent and pure (facts in, results out), so they are tested without a
cluster. A node check is ``check(node, facts, ctx) -> list[CheckResult]``; a cluster check
is ``check(ctx) -> list[CheckResult]``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from rayfleet.doctor.needs import FleetNeeds
from rayfleet.doctor.result import CheckResult, Node, Status, cluster_result, result_for

GIB = 1024**3
SHM_FAIL_BYTES = 1 * GIB
SHM_WARN_BYTES = 8 * GIB
DISK_FAIL_BYTES = 2 * GIB
DISK_WARN_BYTES = 20 * GIB
VERSIONED = ("python", "ray", "vllm", "torch", "rayfleet")
CONTAINER_HINT = (
    "run the container with `--gpus all` on the NVIDIA container runtime "
    "(nvidia-container-toolkit), then restart Ray on this node"
)


@dataclass
class Context:
    """What every check may look at beside its own node's facts."""

    nodes: list[Node]
    facts: dict[str, dict[str, Any]]  # node id -> probe facts, for nodes that answered
    needs: FleetNeeds = field(default_factory=FleetNeeds)

    @property
    def head(self) -> Node | None:
        return next((n for n in self.nodes if n.is_head), None)

    @property
    def head_facts(self) -> dict[str, Any] | None:
        head = self.head
        return self.facts.get(head.node_id) if head else None


NodeCheck = Callable[[Node, dict[str, Any], Context], list[CheckResult]]


# --- versions ---------------------------------------------------------------------


def check_versions(node: Node, facts: dict[str, Any], ctx: Context) -> list[CheckResult]:
    mine = _part(facts, "versions")
    head_facts = ctx.head_facts
    head = _part(head_facts, "versions") if head_facts else mine
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


# --- GPUs -------------------------------------------------------------------------


def check_gpus(node: Node, facts: dict[str, Any], ctx: Context) -> list[CheckResult]:
    gpus = _part(facts, "gpus")
    status, value, fix = judge_gpus(
        smi=gpus.get("nvidia_smi") or {},
        driver_gpus=int(gpus.get("driver_gpus") or 0),
        cuda_visible=gpus.get("cuda_visible_devices"),
        ray_gpus=node.num_gpus,
    )
    return [result_for(node, "gpus", status, value, fix)]


def judge_gpus(
    smi: dict[str, Any], driver_gpus: int, cuda_visible: str | None, ray_gpus: float
) -> tuple[Status, str, str]:
    """GPUs the OS sees (nvidia-smi, the kernel driver) against the GPUs Ray registered."""
    os_gpus = len(smi.get("gpus") or [])
    visible = visible_count(cuda_visible, os_gpus)
    names = sorted({g["name"] for g in smi.get("gpus") or []})
    seen = f"OS {os_gpus} ({', '.join(names)})" if os_gpus else "OS 0"
    value = f"{seen}, Ray {ray_gpus:g}" + (
        f", CUDA_VISIBLE_DEVICES={cuda_visible!r}" if cuda_visible is not None else ""
    )
    if smi.get("error"):
        if driver_gpus or ray_gpus:
            return (
                Status.FAIL,
                f"nvidia-smi failed: {smi['error']}",
                "the NVIDIA driver is unreachable here; " + CONTAINER_HINT,
            )
        return Status.WARN, f"nvidia-smi failed: {smi['error']}", "check the NVIDIA driver"
    if os_gpus == 0:
        if driver_gpus:
            return (
                Status.FAIL,
                f"the host driver has {driver_gpus} GPUs, this node sees none",
                CONTAINER_HINT,
            )
        if ray_gpus:
            return (
                Status.FAIL,
                value,
                "Ray was started with --num-gpus but no GPU is visible; "
                "restart Ray on this node without --num-gpus or " + CONTAINER_HINT,
            )
        return Status.OK, "no GPU (CPU node)", ""
    if ray_gpus == 0:
        if visible == 0 and cuda_visible is not None:
            return (
                Status.FAIL,
                value,
                "CUDA_VISIBLE_DEVICES hides every GPU from Ray: unset it "
                "where Ray starts, then restart Ray on this node",
            )
        return (
            Status.FAIL,
            value,
            "Ray registered no GPU although the OS sees them: restart "
            f"Ray on this node with `--num-gpus {visible}`; in a container, " + CONTAINER_HINT,
        )
    if ray_gpus > visible:
        hidden = (
            f"CUDA_VISIBLE_DEVICES={cuda_visible!r} hides {os_gpus - visible} of them: fix "
            "it where Ray starts, or "
            if visible < os_gpus
            else ""
        )
        return (
            Status.FAIL,
            value,
            f"Ray claims {ray_gpus:g} GPU(s) but {visible} are visible; "
            f"{hidden}restart Ray on this node with `--num-gpus {visible}`",
        )
    if ray_gpus < visible:
        return (
            Status.WARN,
            value,
            f"Ray uses {ray_gpus:g} of {visible} visible GPUs: restart Ray "
            f"with `--num-gpus {visible}` to use them all",
        )
    return Status.OK, value, ""


def visible_count(cuda_visible: str | None, os_gpus: int) -> int:
    """GPUs left visible by CUDA_VISIBLE_DEVICES (unset: all of them)."""
    if cuda_visible is None:
        return os_gpus
    entries = [e.strip() for e in cuda_visible.split(",") if e.strip()]
    count = 0
    for entry in entries:
        if entry.lstrip("-").isdigit() and int(entry) < 0:
            break  # CUDA stops at the first invalid index
        count += 1
    return min(count, os_gpus)


def check_gpus_cluster(ctx: Context) -> list[CheckResult]:
    """No GPU anywhere is a fact on a CPU cluster and a failure for a fleet that needs them."""
    answered = [n for n in ctx.nodes if n.node_id in ctx.facts]
    if any(n.num_gpus > 0 for n in ctx.nodes):
        return []
    gpu_models = ctx.needs.gpu_models
    if gpu_models:
        return [
            cluster_result(
                "gpus",
                Status.FAIL,
                f"no node has a GPU; {', '.join(gpu_models)} need them",
                "add GPU nodes or set num_gpus: 0 for a CPU engine",
            )
        ]
    return [
        cluster_result(
            "gpus", Status.INFO, f"CPU-only cluster: no GPU on any of {len(answered)} nodes"
        )
    ]


# --- shared memory ----------------------------------------------------------------


def check_shm(node: Node, facts: dict[str, Any], ctx: Context) -> list[CheckResult]:
    shm = _part(facts, "shm")
    status, value, fix = judge_shm(shm.get("total_bytes"), ctx.needs.parallel_models)
    return [result_for(node, "shm", status, value, fix)]


def judge_shm(total_bytes: int | None, parallel_models: list[str]) -> tuple[Status, str, str]:
    fix = "give the container more shared memory: `docker run --ipc host` or `--shm-size 16g`"
    if total_bytes is None:
        return Status.FAIL if parallel_models else Status.WARN, "/dev/shm missing", fix
    value = f"/dev/shm {_gib(total_bytes)}"
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
    status, value, fix = judge_nccl(_part(facts, "nccl"), node.num_gpus)
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


# --- disk, model sources, ports ---------------------------------------------------


def check_disk(node: Node, facts: dict[str, Any], ctx: Context) -> list[CheckResult]:
    disks = facts.get("disk")
    if not isinstance(disks, list):
        raise ProbeError(_part(facts, "disk"))
    results = []
    for disk in disks:
        free = disk["free_bytes"]
        value = f"{_gib(free)} free under {disk['path']}"
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
        raise ProbeError(_part(facts, "models"))
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
        raise ProbeError(_part(facts, "ports"))
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


class ProbeError(Exception):
    """A part of the node's probe failed; the message is the probe's own reason."""


def _part(facts: dict[str, Any] | None, name: str) -> dict[str, Any]:
    part = (facts or {}).get(name)
    if not isinstance(part, dict):
        raise ProbeError(f"no {name} facts from this node")
    if "error" in part:
        raise ProbeError(part["error"])
    return part


def _reason(exc: Exception) -> str:
    text = str(exc).strip().splitlines()
    return text[0] if text else type(exc).__name__


def _rank(status: Status) -> int:
    return [Status.OK, Status.INFO, Status.WARN, Status.FAIL].index(status)


def _gib(num_bytes: int | float) -> str:
    return f"{num_bytes / GIB:.1f} GiB" if num_bytes >= GIB else f"{num_bytes / 1024**2:.0f} MiB"
