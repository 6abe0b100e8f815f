"""Pieces every rendered pod shares: names, labels, quantities, volumes, containers.

The fleet.yaml lives in a ConfigMap mounted read-only at ``CONFIG_DIR`` in the head,
the workers and the gateway, so every process reads the same file at ``CONFIG_PATH``.
Ray pods also mount ``/dev/shm`` as memory (``shm_volume``) and, when the file has
``kubernetes.model_cache``, the model volume (``model_cache_volume``) with ``HF_HOME``
on it. Ray pods start Ray with its workers at niceness 0 (``RAY_WORKER_NICENESS``): at
Ray's default of 15 a replica actor starting beside busy engines is starved (see
rayfleet/cluster.py for the numbers).
"""

from __future__ import annotations

import math
from typing import Any

from rayfleet.config import KubernetesConfig
from rayfleet.config.kubernetes import ModelCacheConfig

CONFIG_DIR = "/etc/rayfleet"
CONFIG_KEY = "fleet.yaml"
CONFIG_PATH = f"{CONFIG_DIR}/{CONFIG_KEY}"
RAY_CLIENT_PORT = 10001
RAY_METRICS_PORT = 8080
PART_OF = "rayfleet"
RAY_WORKER_NICENESS = {"name": "RAY_worker_niceness", "value": "0"}

Obj = dict[str, Any]


def configmap_name(k8s: KubernetesConfig) -> str:
    return f"{k8s.name}-config"


def gateway_name(k8s: KubernetesConfig) -> str:
    return f"{k8s.name}-gateway"


def head_address(k8s: KubernetesConfig) -> str:
    """The Ray client address of the head service KubeRay keeps for a RayService
    (``<name>-head-svc``, stable across the clusters an upgrade creates)."""
    return f"ray://{k8s.name}-head-svc.{k8s.namespace}.svc.cluster.local:{RAY_CLIENT_PORT}"


def labels(k8s: KubernetesConfig, component: str) -> dict[str, str]:
    return {
        "app.kubernetes.io/name": k8s.name,
        "app.kubernetes.io/component": component,
        "app.kubernetes.io/part-of": PART_OF,
    }


def metadata(k8s: KubernetesConfig, name: str, component: str) -> Obj:
    return {"name": name, "namespace": k8s.namespace, "labels": labels(k8s, component)}


def cpu_quantity(cpus: float) -> str:
    """``2`` for whole CPUs, ``500m`` for a fraction."""
    return str(int(cpus)) if float(cpus).is_integer() else f"{math.ceil(cpus * 1000)}m"


def memory_quantity(gib: float) -> str:
    """``16Gi`` for whole GiB, else rounded up to MiB."""
    return f"{int(gib)}Gi" if float(gib).is_integer() else f"{math.ceil(gib * 1024)}Mi"


def resources(cpus: float, memory_gib: float, gpus: int = 0) -> Obj:
    """Requests equal to limits: Ray reads its CPU, GPU and memory from them, and a
    pod never gets less than Ray promised its tasks."""
    amounts: dict[str, str | int] = {
        "cpu": cpu_quantity(cpus),
        "memory": memory_quantity(memory_gib),
    }
    if gpus:
        amounts["nvidia.com/gpu"] = gpus
    return {"requests": dict(amounts), "limits": dict(amounts)}


def config_volume(k8s: KubernetesConfig) -> tuple[Obj, Obj]:
    """The ConfigMap volume and its mount at CONFIG_DIR."""
    volume = {"name": "fleet-config", "configMap": {"name": configmap_name(k8s)}}
    return volume, {"name": "fleet-config", "mountPath": CONFIG_DIR, "readOnly": True}


def shm_volume(size_gib: float) -> tuple[Obj, Obj]:
    volume = {
        "name": "dshm",
        "emptyDir": {"medium": "Memory", "sizeLimit": memory_quantity(size_gib)},
    }
    return volume, {"name": "dshm", "mountPath": "/dev/shm"}


def model_cache_volume(cache: ModelCacheConfig) -> tuple[Obj, Obj]:
    source: Obj
    if cache.pvc is not None:
        source = {"persistentVolumeClaim": {"claimName": cache.pvc, "readOnly": cache.read_only}}
    else:
        source = {"hostPath": {"path": cache.host_path, "type": "Directory"}}
    mount = {"name": "model-cache", "mountPath": cache.mount_path, "readOnly": cache.read_only}
    return {"name": "model-cache", **source}, mount


def ray_volumes(k8s: KubernetesConfig, shm_gib: float) -> tuple[Obj, Obj]:
    """Volumes and container fields (mounts, env) shared by the head and worker pods."""
    pairs = [config_volume(k8s), shm_volume(shm_gib)]
    container: Obj = {"env": [dict(RAY_WORKER_NICENESS)]}
    if k8s.model_cache is not None:
        pairs.append(model_cache_volume(k8s.model_cache))
        container["env"].append({"name": "HF_HOME", "value": hf_home(k8s.model_cache)})
    container["volumeMounts"] = [m for _, m in pairs]
    return {"volumes": [v for v, _ in pairs]}, container


def hf_home(cache: ModelCacheConfig) -> str:
    """Hub downloads land on the model volume, so a restarted pod finds them."""
    return f"{cache.mount_path.rstrip('/')}/huggingface"


def gpu_placement(k8s: KubernetesConfig) -> Obj:
    """nodeSelector, affinity and tolerations of the GPU worker pods, as the file says."""
    placement: Obj = {}
    if k8s.node_selector:
        placement["nodeSelector"] = dict(k8s.node_selector)
    if k8s.node_affinity:
        terms = [r.model_dump(exclude_defaults=False) for r in k8s.node_affinity]
        expressions = [{k: v for k, v in t.items() if v or k != "values"} for t in terms]
        placement["affinity"] = {
            "nodeAffinity": {
                "requiredDuringSchedulingIgnoredDuringExecution": {
                    "nodeSelectorTerms": [{"matchExpressions": expressions}]
                }
            }
        }
    if k8s.tolerations:
        placement["tolerations"] = [t.model_dump(exclude_none=True) for t in k8s.tolerations]
    return placement
