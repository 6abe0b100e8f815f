"""`rayfleet k8s render` refuses, in one line naming the field, what could not run as
rendered; the schema checks themselves report a misspelt field at its exact path."""

from __future__ import annotations

import copy
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from rayfleet.config import parse_fleet
from rayfleet.errors import ConfigError
from rayfleet.k8s.checks import operator_problems
from rayfleet.k8s.render import render_fleet
from tests.unit.k8s_schemas import core_errors, kuberay_errors
from tests.unit.test_k8s_render import EVERY_OPTION, EXAMPLES, objects


def broken(change) -> dict[str, Any]:
    data = copy.deepcopy(EVERY_OPTION)
    change(data)
    return data


def refusal(data: dict[str, Any], **flags: str) -> str:
    with pytest.raises(ConfigError) as caught:
        render_fleet(parse_fleet(data), "", **flags)
    message = str(caught.value)
    assert "\n" not in message
    return message


def test_a_local_only_cluster_is_refused():
    data = broken(lambda d: d["cluster"].update(address="local"))
    assert refusal(data).startswith("fleet.yaml: cluster.address: 'local' starts an embedded")


def test_a_replica_wider_than_a_node_is_refused():
    data = broken(lambda d: d["kubernetes"].update(gpus_per_node=4))
    assert refusal(data) == (
        "fleet.yaml: models[0].num_gpus: model 'big' needs 8 GPUs per node, but "
        "kubernetes.gpus_per_node is 4; raise nodes_per_replica (TP x PP = 16) or use "
        "nodes with more GPUs"
    )


def test_a_local_source_with_no_volume_is_refused():
    data = broken(lambda d: d["kubernetes"].pop("model_cache"))
    assert refusal(data) == (
        "fleet.yaml: models[0].source: '/models/big' is a local path and "
        "kubernetes.model_cache is not set; add kubernetes.model_cache (pvc or host_path) "
        "holding it, or use a hub id"
    )


def test_a_local_source_outside_the_volume_is_refused():
    data = broken(lambda d: d["models"][2].update(source="/data/embed"))
    assert refusal(data).startswith(
        "fleet.yaml: models[2].source: '/data/embed' is not under "
        "kubernetes.model_cache.mount_path (/models)"
    )


def test_a_home_relative_source_is_refused():
    data = broken(lambda d: d["models"][2].update(source="~/models/embed"))
    assert "models[2].source: '~/models/embed' is not an absolute path" in refusal(data)


def test_a_key_file_the_secret_cannot_hold_is_refused():
    data = broken(lambda d: d["gateway"]["api_keys"][0].update(key_file="/home/me/k1"))
    assert refusal(data).startswith(
        "fleet.yaml: gateway.api_keys[0].key_file: '/home/me/k1' is not a file directly in "
        "kubernetes.secrets.api_keys_dir (/run/keys)"
    )


def test_a_loopback_gateway_is_refused():
    data = broken(lambda d: d["gateway"].update(host="127.0.0.1"))
    assert refusal(data).startswith("fleet.yaml: gateway.host: '127.0.0.1' is reachable only")


def test_no_image_is_refused_and_the_flag_supplies_one():
    data = broken(lambda d: d["kubernetes"].pop("image"))
    assert refusal(data).startswith("fleet.yaml: kubernetes.image: not set; pass --image")
    assert render_fleet(parse_fleet(data), "", image="x/y:1")


def test_a_bad_namespace_flag_is_refused():
    assert refusal(EVERY_OPTION, namespace="Prod_1").startswith(
        "fleet.yaml: --namespace: 'Prod_1' is not a DNS label"
    )


@pytest.mark.parametrize(
    ("section", "message"),
    [
        (
            {"upgrade_strategy": "Recreate"},
            "kubernetes.upgrade_strategy: Input should be 'NewCluster', "
            "'NewClusterWithIncrementalUpgrade' or 'None'",
        ),
        (
            {"upgrade_strategy": "NewClusterWithIncrementalUpgrade"},
            "kubernetes: incremental_upgrade is given exactly when upgrade_strategy is "
            "NewClusterWithIncrementalUpgrade",
        ),
        ({"model_cache": {"mount_path": "/models"}}, "kubernetes.model_cache: give exactly one"),
        ({"node_selectr": {}}, "kubernetes.node_selectr: unknown field; did you mean"),
        ({"node_affinity": [{"key": "a", "operator": "Gt"}]}, "takes 1 value(s)"),
    ],
)
def test_the_section_refuses_what_kuberay_would(section, message):
    with pytest.raises(ConfigError) as caught:
        parse_fleet({"models": [{"name": "m", "source": "org/m"}], "kubernetes": section})
    assert message in str(caught.value)


def test_the_operator_rules_catch_what_the_schema_does_not():
    service = objects(render_fleet(parse_fleet(EVERY_OPTION), ""))["RayService/fleet"]
    service["spec"]["upgradeStrategy"]["type"] = "Recreate"
    group = service["spec"]["rayClusterConfig"]["workerGroupSpecs"][1]
    group["minReplicas"], group["maxReplicas"] = 5, 2
    group["template"]["spec"]["containers"] = []
    assert kuberay_errors(service) == []  # the schema carries none of these
    assert operator_problems(service) == [
        "spec.upgradeStrategy.type: 'Recreate' is not one of NewCluster, "
        "NewClusterWithIncrementalUpgrade, None",
        "spec.rayClusterConfig.workerGroupSpecs[1].template.spec.containers: empty",
        "spec.rayClusterConfig.workerGroupSpecs[1].minReplicas: 5 is above maxReplicas 2",
    ]


def test_the_schema_checks_report_a_misspelt_field_at_its_path():
    rendered_objects = objects(render_fleet(parse_fleet(EVERY_OPTION), ""))
    service = rendered_objects["RayService/fleet"]
    worker = service["spec"]["rayClusterConfig"]["workerGroupSpecs"][0]
    worker["template"]["spec"]["containers"][0]["volumeMount"] = []
    assert kuberay_errors(service) == [
        "spec.rayClusterConfig.workerGroupSpecs[0].template.spec.containers[0]: Additional "
        "properties are not allowed ('volumeMount' was unexpected)"
    ]
    deployment = rendered_objects["Deployment/fleet-gateway"]
    deployment["spec"]["template"]["spec"]["containers"][0]["livenesProbe"] = {}
    assert core_errors(deployment) == [
        "spec.template.spec.containers[0]: Additional properties are not allowed "
        "('livenesProbe' was unexpected)"
    ]


def _rayfleet(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "rayfleet.cli", *args], capture_output=True, text=True, timeout=120
    )


def test_cli_writes_the_files_and_names_each_object(tmp_path: Path):
    out = tmp_path / "k8s"
    result = _rayfleet(
        "k8s", "render", "-c", str(EXAMPLES / "kubernetes-h100.yaml"), "--out", str(out)
    )
    assert result.returncode == 0, result.stderr
    written = sorted(p.name for p in out.iterdir())
    assert written == ["configmap.yaml", "gateway.yaml", "monitoring.yaml", "rayservice.yaml"]
    assert f"{out / 'rayservice.yaml'}  RayService llm" in result.stdout.splitlines()
    assert "create secret generic rayfleet-provider-keys --from-literal=BACKUP_API_KEY=..." in (
        result.stdout
    )
    for path in out.iterdir():
        assert path.read_text().startswith("# ")
        assert all(
            doc["metadata"]["namespace"] == "llm" for doc in yaml.safe_load_all(path.read_text())
        )


def test_cli_refuses_bad_input_in_one_line(tmp_path: Path):
    result = _rayfleet(
        "k8s", "render", "-c", str(EXAMPLES / "one-node-two-models.yaml"), "--out", str(tmp_path)
    )
    assert result.returncode == 2
    assert result.stderr.startswith("error: ")
    assert "cluster.address: 'local'" in result.stderr
    assert "Traceback" not in result.stderr and len(result.stderr.strip().splitlines()) == 1
    assert list(tmp_path.iterdir()) == []
