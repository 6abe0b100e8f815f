"""The GPUs and links a plan is made for: from flags, or read from a running Ray cluster.

``read_cluster(address)`` asks Ray for its alive nodes and their "GPU" resources, runs
the doctor's ``nvidia-smi`` reading as one small task per GPU node for the GPU memory,
and takes the inter-node bandwidth from the doctor's measurement
(``$RAYFLEET_HOME/doctor/network.json``, the slowest measured pair). What it cannot
read it takes from the flags and says so in ``notes``.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from rayfleet.doctor.network import network_file
from rayfleet.errors import ConfigError, RayfleetError

MIB_PER_GIB = 1024


@dataclass(frozen=True)
class Hardware:
    """Identical nodes of identical GPUs, and the links inside and between them."""

    gpus_per_node: int
    gpu_memory_gib: float
    nodes: int = 1
    intra_node_gbps: float = 900.0 * 8  # NVLink 4, 900 GB/s, in Gbit/s
    inter_node_gbps: float = 100.0
    notes: tuple[str, ...] = field(default=())

    @property
    def total_gpus(self) -> int:
        return self.gpus_per_node * self.nodes


def read_network_gbps(path: Path) -> float | None:
    """The slowest measured pair in the doctor's network.json, or None if absent."""
    if not path.exists():
        return None
    try:
        data = json.loads(path.read_text())
        pairs = data["pairs"]
        speeds = [float(pair["gbps"]) for pair in pairs]
    except (json.JSONDecodeError, KeyError, TypeError, ValueError) as exc:
        raise ConfigError(
            f"{path}: field 'pairs[].gbps' unreadable ({exc.__class__.__name__}: {exc}); "
            "run `rayfleet doctor` again to measure the network"
        ) from None
    return min(speeds) if speeds else None


def gpus_by_node(nodes: list[dict[str, Any]]) -> dict[str, int]:
    """GPU count per alive node id, from ``ray.nodes()`` records; nodes without GPUs left out."""
    counts = {}
    for node in nodes:
        if not node.get("Alive", node.get("alive", False)):
            continue
        gpus = int((node.get("Resources") or {}).get("GPU", 0))
        if gpus:
            counts[node["NodeID"]] = gpus
    return counts


def accelerator_types(nodes: list[dict[str, Any]]) -> set[str]:
    """Accelerator names Ray advertises (``accelerator_type:H100`` resources)."""
    names = set()
    for node in nodes:
        for key in node.get("Resources") or {}:
            if key.startswith("accelerator_type:"):
                names.add(key.split(":", 1)[1])
    return names


def hardware_from_nodes(
    nodes: list[dict[str, Any]],
    gpu_memory_gib_by_node: dict[str, float | None],
    network_gbps: float | None,
    defaults: Hardware,
) -> Hardware:
    """Turn what a cluster reported into a Hardware; gaps are filled from ``defaults``.

    Mixed nodes are planned as the smallest of them: the fewest GPUs per node and
    the least memory per GPU, which every node can honour.
    """
    counts = gpus_by_node(nodes)
    if not counts:
        raise RayfleetError(
            "no GPUs in this cluster (Ray reports no 'GPU' resource on any alive node); "
            "start Ray on GPU nodes, or plan without --from-cluster using --gpus-per-node"
        )
    notes = [f"read {len(counts)} GPU node(s) from Ray: {sorted(set(counts.values()))} GPUs each"]
    types = accelerator_types(nodes)
    if types:
        notes.append(f"accelerator types: {', '.join(sorted(types))}")
    if len(set(counts.values())) > 1:
        notes.append(f"nodes differ; planning for {min(counts.values())} GPUs on every node")
    memory = _cluster_gpu_memory(counts, gpu_memory_gib_by_node, defaults, notes)
    inter = defaults.inter_node_gbps
    if network_gbps is None:
        notes.append(
            f"no doctor measurement at {network_file()}; "
            f"inter-node bandwidth {inter:g} Gbit/s from --inter-node-gbps"
        )
    else:
        inter = network_gbps
        notes.append(f"inter-node bandwidth {inter:g} Gbit/s: the slowest pair the doctor measured")
    return replace(
        defaults,
        gpus_per_node=min(counts.values()),
        gpu_memory_gib=memory,
        nodes=len(counts),
        inter_node_gbps=inter,
        notes=tuple(notes),
    )


def _cluster_gpu_memory(
    counts: dict[str, int],
    memory_by_node: dict[str, float | None],
    defaults: Hardware,
    notes: list[str],
) -> float:
    known = [gib for n in counts if (gib := memory_by_node.get(n))]
    if len(known) == len(counts):
        notes.append(f"GPU memory {min(known):.1f} GiB from nvidia-smi on every GPU node")
        return min(known)
    if defaults.gpu_memory_gib <= 0:
        raise RayfleetError(
            "could not read GPU memory from the cluster (nvidia-smi failed on "
            f"{len(counts) - len(known)} GPU node(s)); pass --gpu-memory-gib"
        )
    notes.append(
        f"GPU memory not readable on every node (nvidia-smi); "
        f"{defaults.gpu_memory_gib:g} GiB from --gpu-memory-gib"
    )
    return defaults.gpu_memory_gib


def smallest_gpu_memory_gib(smi: dict[str, Any]) -> float | None:
    """The smallest GPU's memory in GiB from the doctor's nvidia-smi reading
    (``probe.run_nvidia_smi``), or None when nvidia-smi failed or left a size unknown."""
    sizes: list[int | None] = [gpu.get("memory_mib") for gpu in smi.get("gpus") or []]
    known = [size for size in sizes if size is not None]
    if not known or len(known) < len(sizes):
        return None
    return min(known) / MIB_PER_GIB


def read_cluster(address: str, defaults: Hardware, *, network_path: Path | None = None) -> Hardware:
    """Read GPUs per node, GPU memory and bandwidth from the Ray cluster at ``address``."""
    from rayfleet.cluster import connected, ray_nodes

    with connected(address, hint="or plan without --from-cluster"):
        nodes = ray_nodes()
        memory = _probe_gpu_memory(gpus_by_node(nodes))
    network = read_network_gbps(network_path or network_file())
    return hardware_from_nodes(nodes, memory, network, defaults)


def _probe_gpu_memory(counts: dict[str, int]) -> dict[str, float | None]:
    """Run the doctor's nvidia-smi reading once on every GPU node, pinned there."""
    import ray
    from ray.exceptions import RayError
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    from rayfleet.doctor.probe import run_nvidia_smi

    # num_gpus=0: nvidia-smi sees every GPU anyway, and busy GPUs must not block the probe.
    probe = ray.remote(num_cpus=0, num_gpus=0)(run_nvidia_smi)
    refs = {
        node_id: probe.options(
            scheduling_strategy=NodeAffinitySchedulingStrategy(node_id, soft=False)
        ).remote()
        for node_id in counts
    }
    try:
        readings = ray.get(list(refs.values()), timeout=120)
    except RayError:  # a busy or broken node: fall back to the flag, say so in the notes
        return {node_id: None for node_id in refs}
    return {
        node_id: smallest_gpu_memory_gib(smi) for node_id, smi in zip(refs, readings, strict=True)
    }
