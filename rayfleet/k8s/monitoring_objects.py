"""The monitoring objects beside the fleet (Prometheus Operator and Grafana's sidecar).

    PodMonitor <name>-gateway   the gateway pods' /metrics: its own request metrics and
                                each replica's vLLM gauges republished under the
                                replica's labels
    PodMonitor <name>-ray       the Ray pods' metrics port (Ray's own metrics)
    PrometheusRule <name>       ``spec`` is ``rayfleet.k8s.monitoring.alert_rules()``
    ConfigMap <name>-dashboard  ``rayfleet.k8s.monitoring.dashboard()`` as JSON,
                                labelled ``grafana_dashboard: "1"`` for Grafana's
                                dashboard sidecar

Each vLLM server listens on a free port of its pod (rayfleet/control/replica.py), so no
fixed port can be declared for Prometheus to scrape; the gateway's republished gauges
are how vLLM's numbers reach Prometheus. GPU utilization comes from NVIDIA's DCGM
exporter, which GPU clusters run already; the rules only read its metrics.
"""

from __future__ import annotations

import json
from typing import Any

from rayfleet.config import KubernetesConfig
from rayfleet.k8s import pod

Obj = dict[str, Any]
MONITORING_API = "monitoring.coreos.com/v1"


def monitoring_objects(k8s: KubernetesConfig) -> list[Obj]:
    from rayfleet.k8s.monitoring import alert_rules, dashboard

    return [
        _pod_monitor(k8s, "gateway", {"app.kubernetes.io/component": "gateway"}, "http"),
        _pod_monitor(
            k8s,
            "ray",
            {"ray.io/node-type": None},  # head and workers, whatever KubeRay names them
            "metrics",
        ),
        {
            "apiVersion": MONITORING_API,
            "kind": "PrometheusRule",
            "metadata": pod.metadata(k8s, k8s.name, "monitoring"),
            "spec": alert_rules(),
        },
        {
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": _with_labels(
                pod.metadata(k8s, f"{k8s.name}-dashboard", "monitoring"),
                {"grafana_dashboard": "1"},
            ),
            "data": {"rayfleet.json": json.dumps(dashboard(), indent=1)},
        },
    ]


def _pod_monitor(
    k8s: KubernetesConfig, suffix: str, match: dict[str, str | None], port: str
) -> Obj:
    equal = {k: v for k, v in match.items() if v is not None}
    present = [{"key": k, "operator": "Exists"} for k, v in match.items() if v is None]
    selector: Obj = {"matchLabels": {"app.kubernetes.io/name": k8s.name, **equal}}
    if present:
        selector["matchExpressions"] = present
    return {
        "apiVersion": MONITORING_API,
        "kind": "PodMonitor",
        "metadata": pod.metadata(k8s, f"{k8s.name}-{suffix}", "monitoring"),
        "spec": {
            "selector": selector,
            "podMetricsEndpoints": [{"port": port, "path": "/metrics", "interval": "15s"}],
        },
    }


def _with_labels(metadata: Obj, extra: dict[str, str]) -> Obj:
    return {**metadata, "labels": {**metadata["labels"], **extra}}
