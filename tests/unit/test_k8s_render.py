"""`rayfleet k8s render`: every rendered object passes the official schemas, and the
objects say what the fleet.yaml says (shapes, counts, secrets, volumes, placement)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from rayfleet.config import load_fleet, parse_fleet
from rayfleet.k8s.checks import operator_problems
from rayfleet.k8s.render import render_fleet
from tests.unit.k8s_schemas import core_errors, kuberay_errors, serve_config_errors

EXAMPLES = Path(__file__).parents[2] / "examples"
IMAGE = "registry.example.com/rayfleet:test"

# Every option of the kubernetes section, and what the render maps from the rest.
EVERY_OPTION: dict[str, Any] = {
    "cluster": {"address": "auto"},
    "gateway": {
        "host": "0.0.0.0",
        "port": 9000,
        "fallback": {
            "providers": [
                {"name": "a", "base_url": "https://a.example/v1", "api_key_env": "A_KEY"},
                {"name": "b", "base_url": "https://b.example/v1", "api_key_env": "A_KEY"},
            ]
        },
        "api_keys": [
            {"name": "k1", "key_file": "/run/keys/k1"},
            {"name": "k2", "key_sha256": "sha256:" + "0" * 64},
        ],
    },
    "models": [
        {
            "name": "big",
            "source": "/models/big",
            "num_gpus": 8,
            "num_cpus": 10,
            "memory_gib": 64,
            "nodes_per_replica": 2,
            "autoscaling": {"min_replicas": 0, "max_replicas": 3, "target_load_per_replica": 8},
            "engine_args": {"tensor_parallel_size": 8, "pipeline_parallel_size": 2},
        },
        {"name": "small", "source": "org/small", "num_gpus": 1, "replicas": 2},
        {"name": "embed", "source": "/models/embed", "replicas": 1, "num_cpus": 0.5},
    ],
    "kubernetes": {
        "name": "fleet",
        "namespace": "serving",
        "image": IMAGE,
        "gpus_per_node": 8,
        "node_selector": {"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3"},
        "node_affinity": [
            {"key": "topology.kubernetes.io/zone", "values": ["z1", "z2"]},
            {"key": "nvidia.com/gpu.memory", "operator": "Gt", "values": ["70000"]},
            {"key": "dedicated", "operator": "Exists"},
        ],
        "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}],
        "model_cache": {"host_path": "/mnt/models", "mount_path": "/models", "read_only": True},
        "shm_gib": 16,
        "upgrade_strategy": "NewClusterWithIncrementalUpgrade",
        "incremental_upgrade": {"gateway_class_name": "istio", "step_size_percent": 20},
        "head": {"num_cpus": 4, "memory_gib": 16},
        "gateway": {"replicas": 3, "service_type": "NodePort", "num_cpus": 0.5, "memory_gib": 1.5},
        "secrets": {"provider_keys": "prov", "api_keys": "keys", "api_keys_dir": "/run/keys"},
    },
}


def objects(manifests) -> dict[str, dict[str, Any]]:
    """Rendered objects by ``Kind/name``, read back from the YAML text written."""
    out = {}
    for manifest in manifests:
        for obj in yaml.safe_load_all(manifest.text()):
            out[f"{obj['kind']}/{obj['metadata']['name']}"] = obj
    return out


def schema_errors(obj: dict[str, Any]) -> list[str]:
    if obj["apiVersion"] == "ray.io/v1":
        cluster = {"apiVersion": "ray.io/v1", "kind": "RayCluster", "metadata": obj["metadata"]}
        cluster["spec"] = obj["spec"]["rayClusterConfig"]
        return (
            kuberay_errors(obj)
            + kuberay_errors(cluster)
            + serve_config_errors(obj["spec"]["serveConfigV2"])
            + operator_problems(obj)
        )
    if obj["apiVersion"].startswith("monitoring.coreos.com"):
        return []  # no published schema ships offline; see the README
    return core_errors(obj)


def rendered(path: Path, **flags: str):
    return objects(render_fleet(load_fleet(path), path.read_text(), **flags))


@pytest.mark.parametrize("example", ["kubernetes-h100.yaml", "deepseek-v3-two-nodes.yaml"], ids=str)
def test_examples_render_objects_the_schemas_accept(example):
    rendered_objects = rendered(EXAMPLES / example, image=IMAGE)
    assert {k.split("/")[0] for k in rendered_objects} == {
        "ConfigMap",
        "RayService",
        "Deployment",
        "Service",
        "PodMonitor",
        "PrometheusRule",
    }
    for key, obj in rendered_objects.items():
        assert schema_errors(obj) == [], key


def test_every_option_renders_objects_the_schemas_accept():
    fleet = parse_fleet(EVERY_OPTION)
    rendered_objects = objects(render_fleet(fleet, yaml.safe_dump(EVERY_OPTION)))
    for key, obj in rendered_objects.items():
        assert schema_errors(obj) == [], key
        assert obj["metadata"]["namespace"] == "serving"


def test_worker_groups_follow_the_replica_shapes():
    fleet = parse_fleet(EVERY_OPTION)
    service = objects(render_fleet(fleet, ""))["RayService/fleet"]
    cluster = service["spec"]["rayClusterConfig"]
    groups = {g["groupName"]: g for g in cluster["workerGroupSpecs"]}
    assert list(groups) == ["gpu1", "gpu8", "cpu"]
    big = groups["gpu8"]  # 2 pods per replica (nodes_per_replica 2), 0..3 replicas, start 1
    assert (big["replicas"], big["minReplicas"], big["maxReplicas"]) == (2, 0, 6)
    assert (groups["gpu1"]["minReplicas"], groups["gpu1"]["maxReplicas"]) == (2, 2)
    pod_spec = big["template"]["spec"]
    limits = pod_spec["containers"][0]["resources"]["limits"]
    assert limits == {"cpu": "10", "memory": "80Gi", "nvidia.com/gpu": 8}  # 64 + 16 of shm
    assert big["rayStartParams"]["num-cpus"] == "10"
    assert big["rayStartParams"]["object-store-memory"] == str(16 * 1024**3)
    assert pod_spec["nodeSelector"] == {"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3"}
    assert pod_spec["tolerations"][0]["operator"] == "Exists"
    terms = pod_spec["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
    assert terms["nodeSelectorTerms"][0]["matchExpressions"][2] == {
        "key": "dedicated",
        "operator": "Exists",
    }
    assert "nodeSelector" not in groups["cpu"]["template"]["spec"]
    assert cluster["enableInTreeAutoscaling"] is True
    head = cluster["headGroupSpec"]
    assert head["rayStartParams"]["num-cpus"] == "0"
    assert "nvidia.com/gpu" not in head["template"]["spec"]["containers"][0]["resources"]["limits"]
    assert (
        service["spec"]["upgradeStrategy"]["clusterUpgradeOptions"]["gatewayClassName"] == "istio"
    )


def test_ray_pods_mount_the_config_shm_and_model_cache():
    fleet = parse_fleet(EVERY_OPTION)
    service = objects(render_fleet(fleet, ""))["RayService/fleet"]
    for group in service["spec"]["rayClusterConfig"]["workerGroupSpecs"]:
        spec = group["template"]["spec"]
        volumes = {v["name"]: v for v in spec["volumes"]}
        assert volumes["dshm"]["emptyDir"] == {"medium": "Memory", "sizeLimit": "16Gi"}
        assert volumes["model-cache"]["hostPath"]["path"] == "/mnt/models"
        assert volumes["fleet-config"]["configMap"]["name"] == "fleet-config"
        mounts = {m["mountPath"] for m in spec["containers"][0]["volumeMounts"]}
        assert mounts == {"/dev/shm", "/models", "/etc/rayfleet"}


@pytest.mark.parametrize("example", [None, "kubernetes-h100.yaml"], ids=str)
def test_ray_pods_run_ray_workers_unniced(example):
    rendered_objects = (
        objects(render_fleet(parse_fleet(EVERY_OPTION), ""))
        if example is None
        else rendered(EXAMPLES / example)
    )
    [service] = [o for name, o in rendered_objects.items() if name.startswith("RayService/")]
    cluster = service["spec"]["rayClusterConfig"]
    groups = [cluster["headGroupSpec"], *cluster["workerGroupSpecs"]]
    for group in groups:
        env = group["template"]["spec"]["containers"][0]["env"]
        assert {"name": "RAY_worker_niceness", "value": "0"} in env


def test_serve_config_builds_each_model_from_the_mounted_file():
    fleet = parse_fleet(EVERY_OPTION)
    service = objects(render_fleet(fleet, ""))["RayService/fleet"]
    serve = yaml.safe_load(service["spec"]["serveConfigV2"])
    assert serve["proxy_location"] == "Disabled"
    assert [a["name"] for a in serve["applications"]] == ["big", "small", "embed"]
    app = serve["applications"][0]
    assert app["import_path"] == "rayfleet.control.serve_app:build"
    assert app["args"] == {"model": "big", "config": "/etc/rayfleet/fleet.yaml"}
    assert app["route_prefix"] is None


def test_gateway_joins_the_head_and_takes_keys_from_secrets_by_name():
    fleet = parse_fleet(EVERY_OPTION)
    rendered_objects = objects(render_fleet(fleet, ""))
    deployment = rendered_objects["Deployment/fleet-gateway"]
    assert deployment["spec"]["replicas"] == 3
    container = deployment["spec"]["template"]["spec"]["containers"][0]
    assert container["args"] == [
        "--address",
        "ray://fleet-head-svc.serving.svc.cluster.local:10001",
    ]
    assert container["readinessProbe"]["httpGet"] == {"path": "/health", "port": "http"}
    # Waiting for replicas is no reason to restart the gateway: liveness is a TCP connect.
    assert container["livenessProbe"]["tcpSocket"] == {"port": "http"}
    assert container["ports"] == [{"name": "http", "containerPort": 9000}]
    assert container["env"] == [
        {"name": "A_KEY", "valueFrom": {"secretKeyRef": {"name": "prov", "key": "A_KEY"}}}
    ]
    volumes = deployment["spec"]["template"]["spec"]["volumes"]
    assert {"name": "api-keys", "secret": {"secretName": "keys"}} in volumes
    assert {"name": "api-keys", "mountPath": "/run/keys", "readOnly": True} in container[
        "volumeMounts"
    ]
    service = rendered_objects["Service/fleet-gateway"]
    assert service["spec"]["type"] == "NodePort"
    assert service["spec"]["ports"][0]["port"] == 9000


def test_configmap_holds_the_file_as_written():
    path = EXAMPLES / "kubernetes-h100.yaml"
    configmap = rendered(path)["ConfigMap/llm-config"]
    assert configmap["data"]["fleet.yaml"] == path.read_text()


def test_flags_override_the_file():
    path = EXAMPLES / "kubernetes-h100.yaml"
    rendered_objects = rendered(path, image="other/image:2", namespace="prod")
    deployment = rendered_objects["Deployment/llm-gateway"]
    assert deployment["metadata"]["namespace"] == "prod"
    assert deployment["spec"]["template"]["spec"]["containers"][0]["image"] == "other/image:2"
    assert (
        "llm-head-svc.prod.svc"
        in deployment["spec"]["template"]["spec"]["containers"][0]["args"][1]
    )


def test_monitoring_objects_carry_the_rules_and_dashboard():
    from rayfleet.k8s.monitoring import alert_rules, dashboard

    rendered_objects = rendered(EXAMPLES / "kubernetes-h100.yaml")
    assert rendered_objects["PrometheusRule/llm"]["spec"] == alert_rules()
    board = rendered_objects["ConfigMap/llm-dashboard"]
    assert board["metadata"]["labels"]["grafana_dashboard"] == "1"
    assert yaml.safe_load(board["data"]["rayfleet.json"]) == dashboard()
    gateway_monitor = rendered_objects["PodMonitor/llm-gateway"]["spec"]
    assert gateway_monitor["podMetricsEndpoints"][0]["port"] == "http"


def test_a_gateway_whose_health_needs_a_key_is_probed_by_tcp():
    closed = {**EVERY_OPTION, "gateway": {**EVERY_OPTION["gateway"], "open_health": False}}
    rendered_objects = objects(render_fleet(parse_fleet(closed), ""))
    container = rendered_objects["Deployment/fleet-gateway"]["spec"]["template"]["spec"][
        "containers"
    ][0]
    assert container["readinessProbe"]["tcpSocket"] == {"port": "http"}
    assert "httpGet" not in container["readinessProbe"]
