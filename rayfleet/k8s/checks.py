"""What `rayfleet k8s render` refuses, one line each naming the field and the fix.

    fleet_problem(config, k8s, image)  a fleet that cannot run as rendered: a local-only
                                       cluster, no image, a loopback gateway, a replica
                                       wider than a node, a local model source outside
                                       the model volume, a key file the Secret cannot hold
    operator_problems(rayservice)      KubeRay's webhook rules the CRD schema does not
                                       carry (at least one container per pod template,
                                       minReplicas <= maxReplicas, a known upgrade
                                       strategy), checked on the rendered object

The schemas themselves are checked in the tests (tests/unit/test_k8s_schemas.py).
"""

from __future__ import annotations

import re
from pathlib import PurePosixPath
from typing import Any

from rayfleet.config import FleetConfig, KubernetesConfig, ModelConfig
from rayfleet.k8s.workers import gpus_per_pod

UPGRADE_TYPES = ("NewCluster", "NewClusterWithIncrementalUpgrade", "None")
LOOPBACK_HOSTS = ("127.0.0.1", "localhost", "::1")
# A Secret's keys: what a key_file's name must be to be one.
_SECRET_KEY = re.compile(r"[-._a-zA-Z0-9]+")


def fleet_problem(config: FleetConfig, k8s: KubernetesConfig, image: str | None) -> str | None:
    """The first reason ``config`` cannot be rendered, as ``<field>: <reason>; <fix>``."""
    if config.cluster.address == "local":
        return (
            "cluster.address: 'local' starts an embedded Ray on one machine; on Kubernetes "
            "the gateway joins the RayService's head, so set it to 'auto'"
        )
    if not image:
        return (
            "kubernetes.image: not set; pass --image or set kubernetes.image to an image "
            "with rayfleet, Ray and vLLM installed"
        )
    if config.gateway.host in LOOPBACK_HOSTS:
        return (
            f"gateway.host: '{config.gateway.host}' is reachable only inside the gateway's "
            "pod; set it to 0.0.0.0"
        )
    for index, model in enumerate(config.models):
        problem = _shape_problem(model, k8s) or _source_problem(model, k8s)
        if problem:
            return f"models[{index}].{problem}"
    return _key_file_problem(config, k8s)


def _shape_problem(model: ModelConfig, k8s: KubernetesConfig) -> str | None:
    gpus = gpus_per_pod(model)
    if k8s.gpus_per_node is None or gpus <= k8s.gpus_per_node:
        return None
    return (
        f"num_gpus: model '{model.name}' needs {gpus} GPUs per node, but "
        f"kubernetes.gpus_per_node is {k8s.gpus_per_node}; raise nodes_per_replica "
        f"(TP x PP = {model.world_size}) or use nodes with more GPUs"
    )


def is_local_path(source: str) -> bool:
    """A directory or file, not a hub id (``org/name`` or a bare name)."""
    return source.startswith(("/", "~", ".", "$"))


def _source_problem(model: ModelConfig, k8s: KubernetesConfig) -> str | None:
    source = model.source
    if not is_local_path(source):
        return None
    cache = k8s.model_cache
    if cache is None:
        return (
            f"source: '{source}' is a local path and kubernetes.model_cache is not set; "
            "add kubernetes.model_cache (pvc or host_path) holding it, or use a hub id"
        )
    if not source.startswith("/"):
        return (
            f"source: '{source}' is not an absolute path; write it under "
            f"kubernetes.model_cache.mount_path ({cache.mount_path})"
        )
    if not PurePosixPath(source).is_relative_to(cache.mount_path):
        return (
            f"source: '{source}' is not under kubernetes.model_cache.mount_path "
            f"({cache.mount_path}); move the model there or mount the volume at its directory"
        )
    return None


def _key_file_problem(config: FleetConfig, k8s: KubernetesConfig) -> str | None:
    keys_dir = PurePosixPath(k8s.secrets.api_keys_dir)
    for index, key in enumerate(config.gateway.api_keys):
        if key.key_file is None:
            continue
        path = PurePosixPath(key.key_file)
        if path.parent != keys_dir or not _SECRET_KEY.fullmatch(path.name):
            return (
                f"gateway.api_keys[{index}].key_file: '{key.key_file}' is not a file directly "
                f"in kubernetes.secrets.api_keys_dir ({keys_dir}), where the Secret "
                f"'{k8s.secrets.api_keys}' is mounted; write it as {keys_dir}/{path.name} "
                "or use key_sha256"
            )
    return None


def operator_problems(rayservice: dict[str, Any]) -> list[str]:
    """KubeRay's webhook rules on a RayService, as ``<path>: <reason>`` lines."""
    problems: list[str] = []
    spec = rayservice.get("spec", {})
    strategy = spec.get("upgradeStrategy", {}).get("type")
    if strategy is not None and strategy not in UPGRADE_TYPES:
        problems.append(
            f"spec.upgradeStrategy.type: '{strategy}' is not one of {', '.join(UPGRADE_TYPES)}"
        )
    cluster = spec.get("rayClusterConfig", {})
    head = cluster.get("headGroupSpec", {})
    if not head.get("template", {}).get("spec", {}).get("containers"):
        problems.append("spec.rayClusterConfig.headGroupSpec.template.spec.containers: empty")
    for index, group in enumerate(cluster.get("workerGroupSpecs", [])):
        where = f"spec.rayClusterConfig.workerGroupSpecs[{index}]"
        if not group.get("template", {}).get("spec", {}).get("containers"):
            problems.append(f"{where}.template.spec.containers: empty")
        low, high = group.get("minReplicas", 0), group.get("maxReplicas", 0)
        if low > high:
            problems.append(f"{where}.minReplicas: {low} is above maxReplicas {high}")
    return problems
