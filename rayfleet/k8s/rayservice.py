"""The RayService (``ray.io/v1``): serveConfigV2 and the Ray cluster that runs it.

    serve_config(config)          serveConfigV2 as a mapping: one application per
                                  model, built by ``rayfleet.control.serve_app:build``
                                  from the fleet.yaml in the ConfigMap, no HTTP proxy and no route
    rayservice(config, k8s)       the RayService object, serveConfigV2 as YAML text

Replicas are reached by the gateway through the registry (the gateway joins the head
over Ray client), never through Serve's proxy, so ``proxy_location`` is Disabled and
no application has a route prefix. The builder picks each model's starting replica
count from the same file (``replicas``, or the autoscaling bound of the moment, at
least 1: Serve refuses 0), and ``rayfleet gateway``'s scaler changes it after through
the Serve config; a ``num_replicas`` written here would override both, so none is.

The head runs GCS, the dashboard and Serve's controller with ``num-cpus: "0"``, so
Serve never schedules a replica there. Worker groups come from ``worker_groups``;
GPU groups take the file's node selector, affinity and tolerations. The Ray
autoscaler is on when any model autoscales: the pods then follow the replicas Serve
asks for, within each group's bounds.
"""

from __future__ import annotations

from importlib.metadata import PackageNotFoundError, version
from typing import Any

import yaml

from rayfleet.config import FleetConfig, KubernetesConfig
from rayfleet.k8s import pod
from rayfleet.k8s.workers import WorkerGroup, worker_groups

BUILD_IMPORT_PATH = "rayfleet.control.serve_app:build"
HEAD_PORTS = {"gcs-server": 6379, "dashboard": 8265, "client": pod.RAY_CLIENT_PORT}

Obj = dict[str, Any]


def serve_config(config: FleetConfig) -> Obj:
    """serveConfigV2: one application per model, built from the mounted fleet.yaml."""
    applications = [
        {
            "name": model.name,
            "import_path": BUILD_IMPORT_PATH,
            # Serve's default is "/", which two applications cannot share; null: no route.
            "route_prefix": None,
            "args": {"model": model.name, "config": pod.CONFIG_PATH},
        }
        for model in config.models
    ]
    return {"proxy_location": "Disabled", "applications": applications}


def rayservice(config: FleetConfig, k8s: KubernetesConfig, image: str) -> Obj:
    """The RayService for ``config``, pods running ``image``."""
    groups = worker_groups(config, k8s)
    cluster: Obj = {
        "enableInTreeAutoscaling": any(m.autoscaling is not None for m in config.models),
        "headGroupSpec": _head_group(k8s, image),
        "workerGroupSpecs": [_worker_group(k8s, image, g) for g in groups],
    }
    ray_version = _ray_version()
    if ray_version:
        cluster["rayVersion"] = ray_version
    spec: Obj = {
        "serveConfigV2": yaml.safe_dump(serve_config(config), sort_keys=False),
        "rayClusterConfig": cluster,
        "upgradeStrategy": _upgrade_strategy(k8s),
    }
    return {
        "apiVersion": "ray.io/v1",
        "kind": "RayService",
        "metadata": pod.metadata(k8s, k8s.name, "ray"),
        "spec": spec,
    }


def _upgrade_strategy(k8s: KubernetesConfig) -> Obj:
    strategy: Obj = {"type": k8s.upgrade_strategy}
    steps = k8s.incremental_upgrade
    if steps is not None:
        strategy["clusterUpgradeOptions"] = {
            "gatewayClassName": steps.gateway_class_name,
            "intervalSeconds": steps.interval_s,
            "stepSizePercent": steps.step_size_percent,
            "maxSurgePercent": steps.max_surge_percent,
        }
    return strategy


def _head_group(k8s: KubernetesConfig, image: str) -> Obj:
    shm_gib = max(1.0, round(0.3 * k8s.head.memory_gib, 1))
    volumes, mounts = pod.ray_volumes(k8s, shm_gib)
    container = {
        "name": "ray-head",
        "image": image,
        "ports": [{"name": n, "containerPort": p} for n, p in HEAD_PORTS.items()]
        + [{"name": "metrics", "containerPort": pod.RAY_METRICS_PORT}],
        "resources": pod.resources(k8s.head.num_cpus, k8s.head.memory_gib),
        **mounts,
    }
    return {
        # No replica on the head: Serve places replicas by CPU, and the head has none.
        "rayStartParams": {
            "num-cpus": "0",
            "dashboard-host": "0.0.0.0",
            "metrics-export-port": str(pod.RAY_METRICS_PORT),
        },
        "template": {
            "metadata": {"labels": pod.labels(k8s, "ray-head")},
            "spec": {"containers": [container], **volumes},
        },
    }


def _worker_group(k8s: KubernetesConfig, image: str, group: WorkerGroup) -> Obj:
    volumes, mounts = pod.ray_volumes(k8s, group.shm_gib)
    container = {
        "name": "ray-worker",
        "image": image,
        "ports": [{"name": "metrics", "containerPort": pod.RAY_METRICS_PORT}],
        "resources": pod.resources(group.pod_cpus, group.memory_gib, group.gpus),
        **mounts,
    }
    spec: Obj = {"containers": [container], **volumes}
    if group.gpus:
        spec.update(pod.gpu_placement(k8s))
    return {
        "groupName": group.name,
        "replicas": group.replicas,
        "minReplicas": group.min_replicas,
        "maxReplicas": group.max_replicas,
        "rayStartParams": {
            "num-cpus": str(group.cpus),
            "object-store-memory": str(int(group.shm_gib * 1024**3)),
            "metrics-export-port": str(pod.RAY_METRICS_PORT),
        },
        "template": {
            "metadata": {"labels": pod.labels(k8s, "ray-worker")},
            "spec": spec,
        },
    }


def _ray_version() -> str | None:
    """The Ray this rayfleet runs with; the image must hold the same."""
    try:
        return version("ray")
    except PackageNotFoundError:
        return None
