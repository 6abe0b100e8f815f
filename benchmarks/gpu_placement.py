"""Do replicas see exactly the GPUs Ray gave them? A check for a machine with NVIDIA GPUs.

    python benchmarks/gpu_placement.py [--json results/gpu_placement.json]

Needs Ray, rayfleet's pure-Python dependencies, an NVIDIA driver (libcuda) and nvidia-smi;
not vLLM, not torch. It starts a local Ray with every GPU of this machine, then:

1. For each request size of 1 and 2 GPUs (those the machine has), it starts at once as
   many replica-shaped actors as fit (``num_gpus=size``, as a replica's
   ``ray_actor_options``). Inside each it reads the GPU ids Ray assigned
   (``placement.assigned_gpu_ids``, as ``VLLMReplica`` does), builds the environment a
   replica gives its vLLM child (the engine's environment plus ``placement.gpu_env``), and
   in a child process under that environment asks the CUDA driver (libcuda through
   ctypes: what vLLM's CUDA runtime would see) for its devices and their UUIDs, and runs
   ``nvidia-smi -L``. PASS when the child sees exactly ``size`` devices, and no UUID is
   seen by two actors that run at the same time.
2. A CPU-engine actor (``num_gpus=0``): rayfleet adds no CUDA_VISIBLE_DEVICES (its env is
   as before this check existed); informational, what that child would see is printed.
3. The planner's cluster read (``read_cluster``, what ``rayfleet plan --from-cluster``
   uses): PASS when the GPU memory it reports equals the smallest GPU nvidia-smi lists.

nvidia-smi talks to the driver through NVML, which does not apply CUDA_VISIBLE_DEVICES:
its ``-L`` list names the machine's GPUs, and serves here to put names to the UUIDs that
the CUDA driver reports. Prints a PASS/FAIL table and exits 1 on any FAIL, 2 when the
machine has no GPU Ray can see.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

# Runs in the vLLM child's place: count the devices CUDA shows under this environment.
CUDA_PROBE = r"""
import ctypes, json
cuda = ctypes.CDLL("libcuda.so.1")
out = {"error": None, "uuids": []}
rc = cuda.cuInit(0)
count = ctypes.c_int(0)
if rc == 0:
    rc = cuda.cuDeviceGetCount(ctypes.byref(count))
if rc == 100:  # CUDA_ERROR_NO_DEVICE: an empty CUDA_VISIBLE_DEVICES
    rc = 0
if rc != 0:
    out["error"] = f"CUDA driver error {rc}"
for i in range(count.value):
    dev, raw = ctypes.c_int(0), (ctypes.c_ubyte * 16)()
    cuda.cuDeviceGet(ctypes.byref(dev), i)
    cuda.cuDeviceGetUuid(raw, dev)
    h = bytes(raw).hex()
    out["uuids"].append(f"GPU-{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:]}")
print(json.dumps(out))
"""

SMI_LINE = re.compile(r"^GPU (\d+): (.+?) \(UUID: (GPU-[0-9a-f-]+)\)", re.MULTILINE)


def probe_child(env: dict[str, str]) -> dict[str, Any]:
    """What a child process started with ``env`` sees: CUDA's devices, nvidia-smi's list."""
    done = subprocess.run(
        [sys.executable, "-c", CUDA_PROBE], env=env, capture_output=True, text=True, timeout=60
    )
    try:
        cuda: dict[str, Any] = json.loads(done.stdout)
    except json.JSONDecodeError:
        tail = (done.stderr or done.stdout).strip().splitlines()[-1:]
        cuda = {"error": f"CUDA probe failed: {tail}", "uuids": []}
    try:
        smi = subprocess.run(
            ["nvidia-smi", "-L"], env=env, capture_output=True, text=True, timeout=60
        ).stdout
    except FileNotFoundError:
        smi = ""
    listed = {uuid: f"GPU {index}: {name}" for index, name, uuid in SMI_LINE.findall(smi)}
    return {
        "cuda_visible_devices": env.get("CUDA_VISIBLE_DEVICES"),
        "cuda_uuids": cuda["uuids"],
        "cuda_error": cuda["error"],
        "smi_names": [listed.get(u, u) for u in cuda["uuids"]],
        "smi_listed": len(listed),
    }


def replica_shaped(num_gpus: float) -> Any:
    """An actor holding ``num_gpus`` as a replica does, reporting what its child sees."""
    import ray

    @ray.remote(num_cpus=0, num_gpus=num_gpus)
    class ReplicaShaped:
        def look(self) -> dict[str, Any]:
            from rayfleet.control.engine import _engine_env  # the env EngineProcess uses
            from rayfleet.control.placement import assigned_gpu_ids, gpu_env

            ids = assigned_gpu_ids()
            seen = probe_child(_engine_env(gpu_env(ids)))
            return {"ray_gpu_ids": ids, **seen}

    return ReplicaShaped


@dataclass
class Row:
    check: str
    ok: bool | None  # None: informational
    detail: str


def check_size(size: int, total: int) -> tuple[list[Row], list[dict[str, Any]]]:
    """Start ``total // size`` actors of ``size`` GPUs together; check each, and overlaps."""
    import ray

    actor = replica_shaped(size)
    handles = [actor.remote() for _ in range(total // size)]
    looks = ray.get([h.look.remote() for h in handles], timeout=300)
    rows = []
    for i, look in enumerate(looks):
        seen = len(look["cuda_uuids"])
        ok = seen == size and not look["cuda_error"]
        detail = (
            f"Ray ids {look['ray_gpu_ids']}, CUDA_VISIBLE_DEVICES={look['cuda_visible_devices']}, "
            f"CUDA sees {seen}: {', '.join(look['smi_names']) or look['cuda_error'] or 'none'}"
        )
        rows.append(Row(f"{size}-GPU actor {i + 1}/{len(looks)} sees {size}", ok, detail))
    uuids = [u for look in looks for u in look["cuda_uuids"]]
    shared = sorted({u for u in uuids if uuids.count(u) > 1})
    rows.append(
        Row(
            f"{len(looks)} concurrent {size}-GPU actors share no GPU",
            not shared,
            f"shared: {shared}" if shared else f"{len(uuids)} distinct device UUIDs",
        )
    )
    for h in handles:
        ray.kill(h)
    return rows, looks


def check_cpu_engine() -> tuple[list[Row], dict[str, Any]]:
    import ray

    look = ray.get(replica_shaped(0).remote().look.remote(), timeout=120)
    detail = (
        f"rayfleet adds no CUDA_VISIBLE_DEVICES (Ray ids {look['ray_gpu_ids']}); the child "
        f"inherits CUDA_VISIBLE_DEVICES={look['cuda_visible_devices']!r} and CUDA sees "
        f"{len(look['cuda_uuids'])} device(s)"
    )
    return [Row("CPU-engine actor (num_gpus 0): env as before", None, detail)], look


def check_cluster_read(address: str) -> tuple[list[Row], dict[str, Any]]:
    from rayfleet.doctor.probe import run_nvidia_smi
    from rayfleet.planner.hardware import Hardware, read_cluster, smallest_gpu_memory_gib

    hardware = read_cluster(address, Hardware(gpus_per_node=1, gpu_memory_gib=0.0))
    expected = smallest_gpu_memory_gib(run_nvidia_smi())
    ok = expected is not None and abs(hardware.gpu_memory_gib - expected) < 1e-6
    detail = (
        f"{hardware.nodes} node(s) x {hardware.gpus_per_node} GPU(s) of "
        f"{hardware.gpu_memory_gib:.1f} GiB (nvidia-smi here: "
        f"{expected if expected is None else f'{expected:.1f}'} GiB); " + "; ".join(hardware.notes)
    )
    return [Row("plan --from-cluster reads the GPU memory", ok, detail)], asdict(hardware)


def print_table(rows: list[Row]) -> None:
    width = max(len(r.check) for r in rows)
    for r in rows:
        mark = "INFO" if r.ok is None else ("PASS" if r.ok else "FAIL")
        print(f"{mark:4}  {r.check:<{width}}  {r.detail}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", type=Path, help="also write every reading to this file")
    parser.add_argument(
        "--num-gpus",
        type=int,
        help="GPUs to declare to Ray (default: what Ray detects). On a machine without GPUs "
        "this exercises the Ray side alone; every CUDA check then fails.",
    )
    args = parser.parse_args()

    import ray

    from rayfleet.cluster import connect

    if args.num_gpus is None:
        connect("local", hint="this check starts its own local Ray")
    else:
        ray.init(num_gpus=args.num_gpus, include_dashboard=False, log_to_driver=False)
    total = int(ray.cluster_resources().get("GPU", 0))  # type: ignore[no-untyped-call]
    print(
        f"Ray sees {total} GPU(s) on this machine; driver env CUDA_VISIBLE_DEVICES="
        f"{os.environ.get('CUDA_VISIBLE_DEVICES')!r}"
    )
    if total == 0:
        print("FAIL  no GPU resource in Ray: run this on a machine with NVIDIA GPUs")
        return 2
    rows: list[Row] = []
    readings: dict[str, Any] = {"ray_gpus": total}
    try:
        for size in (s for s in (1, 2) if s <= total):
            size_rows, readings[f"actors_{size}_gpu"] = check_size(size, total)
            rows += size_rows
        cpu_rows, readings["cpu_engine_actor"] = check_cpu_engine()
        rows += cpu_rows
        read_rows, readings["cluster_read"] = check_cluster_read(
            ray.get_runtime_context().gcs_address
        )
        rows += read_rows
    finally:
        ray.shutdown()
    print_table(rows)
    failed = [r for r in rows if r.ok is False]
    print(
        f"{'FAIL' if failed else 'PASS'}: {len(failed)} of "
        f"{sum(r.ok is not None for r in rows)} checks failed"
    )
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        readings["rows"] = [asdict(r) for r in rows]
        args.json.write_text(json.dumps(readings, indent=2))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
