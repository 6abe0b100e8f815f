"""The Kubernetes shape without Kubernetes: replicas deployed by Ray Serve's own config, as
KubeRay's RayService submits it (the dashboard's REST API, applications built by
``rayfleet.control.serve_app:build``), and ``rayfleet gateway`` in front of them over a
Ray client connection, as from a pod outside the Ray cluster. The gateway serves the
official openai client, changes a replica count through the Serve config without
restarting a replica, and leaves the replicas serving when it stops."""

from __future__ import annotations

import contextlib
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest
from ray.cluster_utils import Cluster
from ray.dashboard.modules.serve.sdk import ServeSubmissionClient

from rayfleet.control.engine import free_port
from tests.integration.fleet import (
    RAYFLEET,
    RunningFleet,
    model_entry,
    wait_until,
    write_config,
)

pytestmark = pytest.mark.integration

START_TIMEOUT_S = 600


@pytest.fixture(scope="module")
def head() -> Iterator[tuple[Cluster, str, str]]:
    """A Ray head with its dashboard and Ray client server: (cluster, ray://, http://)."""
    dashboard_port, client_port = free_port(), free_port()
    cluster = Cluster(
        initialize_head=True,
        head_node_args={
            "num_cpus": 4,
            "include_dashboard": True,
            "dashboard_port": dashboard_port,
            "ray_client_server_port": client_port,
        },
    )
    try:
        yield cluster, f"ray://127.0.0.1:{client_port}", f"http://127.0.0.1:{dashboard_port}"
    finally:
        cluster.shutdown()


def serve_config(config_path: Path) -> dict[str, Any]:
    """What a RayService's serveConfigV2 holds for this fleet."""
    return {
        "proxy_location": "Disabled",
        "applications": [
            {
                "name": "tiny",
                "import_path": "rayfleet.control.serve_app:build",
                "args": {"model": "tiny", "config": str(config_path)},
            }
        ],
    }


@pytest.fixture(scope="module")
def attached(
    head: tuple[Cluster, str, str], tiny_model: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[RunningFleet, subprocess.Popen[bytes], ServeSubmissionClient]]:
    _, client_address, dashboard = head
    home = tmp_path_factory.mktemp("attached")
    port = free_port()
    scaling = {"min_replicas": 1, "max_replicas": 2, "target_load_per_replica": 8}
    models = [model_entry("tiny", tiny_model, autoscaling=scaling)]
    config_path = write_config(home, models, port, cluster={"address": client_address})
    fleet = RunningFleet(home=home, port=port, config_path=config_path)
    serve = wait_until(lambda: _submission_client(dashboard), 120, 1.0)
    assert serve is not None, f"the Ray dashboard at {dashboard} never answered"
    serve.deploy_applications(serve_config(config_path))
    argv = [*RAYFLEET, "gateway", "-c", str(config_path), "--dashboard", dashboard]
    with open(home / "gateway.log", "wb") as log:
        gateway = subprocess.Popen(argv, env=fleet.env(), stdout=log, stderr=subprocess.STDOUT)
    try:
        ready = wait_until(lambda: _phase(fleet, gateway), START_TIMEOUT_S, 1.0)
        assert ready == "ready", (home / "gateway.log").read_text()[-3000:]
        yield fleet, gateway, serve
    finally:
        with contextlib.suppress(ProcessLookupError):
            gateway.kill()
        gateway.wait(timeout=60)
        serve.delete_applications()


def _submission_client(dashboard: str) -> ServeSubmissionClient | None:
    try:
        return ServeSubmissionClient(dashboard)
    except Exception:  # the dashboard is still starting
        return None


def _phase(fleet: RunningFleet, gateway: subprocess.Popen[bytes]) -> str | None:
    """The gateway's phase once past starting ("ready", "failed", "exited N"); else None."""
    if gateway.poll() is not None:
        return f"exited {gateway.returncode}"
    phase = fleet.state().get("phase") if fleet.state_file.exists() else None
    return None if phase in (None, "starting") else str(phase)


def test_gateway_serves_replicas_that_serve_config_deployed(attached):
    fleet, _, _ = attached
    client = fleet.client()
    answer = client.completions.create(model="tiny", prompt="Hello", max_tokens=4, temperature=0)
    assert answer.choices[0].finish_reason == "length"
    (replica,) = fleet.status()["replicas"]
    assert replica["model"] == "tiny" and replica["healthy"]


def test_scale_rewrites_the_serve_config_and_restarts_nothing(attached):
    fleet, _, serve = attached
    (first,) = fleet.status()["replicas"]
    fleet.cli("scale", "tiny", "2")
    two = wait_until(lambda: _serving(fleet) if len(_serving(fleet)) == 2 else None, 600, 1.0)
    assert two is not None, fleet.status()
    assert first["pid"] in {r["pid"] for r in two}  # a new replica, the old one untouched
    deployed = serve.get_serve_details()["applications"]["tiny"]["deployed_app_config"]
    assert deployed["deployments"] == [{"name": "tiny", "num_replicas": 2}]


def test_a_stopped_gateway_leaves_the_replicas_serving(attached):
    fleet, gateway, serve = attached
    pids = {r["pid"] for r in fleet.status()["replicas"]}
    gateway.terminate()
    assert gateway.wait(timeout=120) == 0
    assert all(psutil.pid_exists(pid) for pid in pids)
    assert serve.get_serve_details()["applications"]["tiny"]["status"] == "RUNNING"


def _serving(fleet: RunningFleet) -> list[dict[str, Any]]:
    return [r for r in fleet.status()["replicas"] if r["healthy"] and not r["draining"]]
