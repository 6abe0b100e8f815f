"""The gateway on Kubernetes: its Deployment and Service, and the fleet's ConfigMap.

Each gateway pod runs ``rayfleet gateway -c /etc/rayfleet/fleet.yaml --address
ray://<name>-head-svc.<namespace>.svc.cluster.local:10001``: it joins the RayService's
cluster over Ray client, reads the replica registry (each vLLM server's URL on its
worker pod) and proxies straight to the replicas over the pod network. Readiness asks
``GET /health`` on the fleet's gateway port (a TCP connect where /health needs a key);
liveness is a TCP connect, so a gateway waiting for replicas is not restarted. The
Service exposes that port.

Keys are Secrets, referenced by name and never written here: each fallback provider's
``api_key_env`` is an env var from the ``secrets.provider_keys`` Secret (key = the
variable's name), and the ``secrets.api_keys`` Secret is mounted at
``secrets.api_keys_dir``, one file per key, so each ``key_file`` path in the file
resolves (rayfleet/k8s/checks.py refuses one that could not).
"""

from __future__ import annotations

from pathlib import PurePosixPath
from typing import Any

from rayfleet.config import FleetConfig, KubernetesConfig
from rayfleet.k8s import pod

Obj = dict[str, Any]

# The first probe waits for the gateway to join Ray and read the registry; a failed
# liveness probe restarts the pod, so it allows a slow head (three misses, 30 s).
PROBE_PERIOD_S = 10
PROBE_FAILURES = 3


def configmap(k8s: KubernetesConfig, fleet_text: str) -> Obj:
    """The fleet.yaml as written, mounted at /etc/rayfleet in every pod."""
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": pod.metadata(k8s, pod.configmap_name(k8s), "config"),
        "data": {pod.CONFIG_KEY: fleet_text},
    }


def gateway_deployment(config: FleetConfig, k8s: KubernetesConfig, image: str) -> Obj:
    port = config.gateway.port
    timing = {"periodSeconds": PROBE_PERIOD_S, "failureThreshold": PROBE_FAILURES}
    # Liveness: the process accepts connections. /health answers 503 while a model has
    # no replica to serve it (all starting, or a fixed model's replicas down), which is no
    # reason to restart the gateway; and it needs a key where health is not open.
    alive = {"tcpSocket": {"port": "http"}, **timing, "initialDelaySeconds": PROBE_PERIOD_S}
    ready = {"httpGet": {"path": "/health", "port": "http"}, **timing}
    if not config.gateway.open_health:
        ready = {"tcpSocket": {"port": "http"}, **timing}
    volume, mount = pod.config_volume(k8s)
    volumes, mounts = [volume], [mount]
    if config.gateway.api_keys and any(k.key_file for k in config.gateway.api_keys):
        volumes.append({"name": "api-keys", "secret": {"secretName": k8s.secrets.api_keys}})
        mounts.append({"name": "api-keys", "mountPath": k8s.secrets.api_keys_dir, "readOnly": True})
    container: Obj = {
        "name": "gateway",
        "image": image,
        "command": ["rayfleet", "gateway", "-c", pod.CONFIG_PATH],
        "args": ["--address", pod.head_address(k8s)],
        "ports": [{"name": "http", "containerPort": port}],
        "readinessProbe": ready,
        "livenessProbe": alive,
        "resources": pod.resources(k8s.gateway.num_cpus, k8s.gateway.memory_gib),
        "volumeMounts": mounts,
    }
    env = provider_env(config, k8s)
    if env:
        container["env"] = env
    selector = pod.labels(k8s, "gateway")
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": pod.metadata(k8s, pod.gateway_name(k8s), "gateway"),
        "spec": {
            "replicas": k8s.gateway.replicas,
            "selector": {"matchLabels": selector},
            "template": {
                "metadata": {"labels": selector},
                "spec": {"containers": [container], "volumes": volumes},
            },
        },
    }


def gateway_service(config: FleetConfig, k8s: KubernetesConfig) -> Obj:
    port = config.gateway.port
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": pod.metadata(k8s, pod.gateway_name(k8s), "gateway"),
        "spec": {
            "type": k8s.gateway.service_type,
            "selector": pod.labels(k8s, "gateway"),
            "ports": [{"name": "http", "port": port, "targetPort": "http", "protocol": "TCP"}],
        },
    }


def provider_env(config: FleetConfig, k8s: KubernetesConfig) -> list[Obj]:
    """Each provider's key variable, from the provider_keys Secret (once per variable)."""
    names = {p.api_key_env for p in config.gateway.fallback.providers if p.api_key_env}
    return [
        {
            "name": name,
            "valueFrom": {"secretKeyRef": {"name": k8s.secrets.provider_keys, "key": name}},
        }
        for name in sorted(names)
    ]


def api_key_files(config: FleetConfig) -> list[str]:
    """The Secret keys the api_keys Secret must hold: each key_file's name."""
    return sorted({PurePosixPath(k.key_file).name for k in config.gateway.api_keys if k.key_file})
