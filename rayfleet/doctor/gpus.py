"""The GPU checks: what the OS sees (nvidia-smi, the kernel driver, CUDA_VISIBLE_DEVICES)
against what Ray registered, on each node; and no GPU anywhere for a fleet that needs them."""

from __future__ import annotations

from typing import Any

from rayfleet.doctor.context import Context, part
from rayfleet.doctor.result import CheckResult, Node, Status, cluster_result, result_for

Judgement = tuple[Status, str, str]  # status, value, fix
CONTAINER_HINT = (
    "run the container with `--gpus all` on the NVIDIA container runtime "
    "(nvidia-container-toolkit), then restart Ray on this node"
)


def check_gpus(node: Node, facts: dict[str, Any], ctx: Context) -> list[CheckResult]:
    gpus = part(facts, "gpus")
    status, value, fix = judge_gpus(
        smi=gpus.get("nvidia_smi") or {},
        driver_gpus=int(gpus.get("driver_gpus") or 0),
        cuda_visible=gpus.get("cuda_visible_devices"),
        ray_gpus=node.num_gpus,
    )
    return [result_for(node, "gpus", status, value, fix)]


def judge_gpus(
    smi: dict[str, Any], driver_gpus: int, cuda_visible: str | None, ray_gpus: float
) -> Judgement:
    """GPUs the OS sees (nvidia-smi, the kernel driver) against the GPUs Ray registered."""
    os_gpus = len(smi.get("gpus") or [])
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
        return _judge_no_os_gpus(value, driver_gpus, ray_gpus)
    return _judge_ray_gpus(value, os_gpus, cuda_visible, ray_gpus)


def _judge_no_os_gpus(value: str, driver_gpus: int, ray_gpus: float) -> Judgement:
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


def _judge_ray_gpus(
    value: str, os_gpus: int, cuda_visible: str | None, ray_gpus: float
) -> Judgement:
    """The OS sees GPUs: does Ray use exactly those CUDA_VISIBLE_DEVICES leaves visible?"""
    visible = visible_count(cuda_visible, os_gpus)
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
