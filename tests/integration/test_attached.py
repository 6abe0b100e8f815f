"""The Kubernetes shape without Kubernetes: replicas deployed by Ray Serve's own config, as
KubeRay's RayService submits it (the serveConfigV2 `rayfleet k8s render` writes, sent
through the dashboard's REST API; applications built by
``rayfleet.control.serve_app:build``), and ``rayfleet gateway`` in front of them over a
Ray client connection, as from a pod outside the Ray cluster. The gateway serves the
official openai client, changes a replica count through the Serve config without
restarting a replica, and leaves the replicas serving when it stops. A second gateway
serves the same fleet but leaves scaling to the first, until the first stops."""

from __future__ import annotations

import contextlib
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psutil
import pytest
from ray.cluster_utils import Cluster
from ray.dashboard.modules.serve.sdk import ServeSubmissionClient

from rayfleet.config import load_fleet
from rayfleet.control.engine import free_port
from rayfleet.k8s.rayservice import serve_config
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


def rendered_serve_config(config_path: Path) -> dict[str, Any]:
    """serveConfigV2 as `rayfleet k8s render` writes it, the fleet file read from here
    instead of the ConfigMap's mount."""
    rendered = serve_config(load_fleet(config_path))
    for app in rendered["applications"]:
        app["args"]["config"] = str(config_path)
    return rendered


@dataclass
class Gateway:
    """One `rayfleet gateway` process, with a RAYFLEET_HOME (its state file) of its own."""

    fleet: RunningFleet
    process: subprocess.Popen[bytes]

    def log(self) -> str:
        return (self.fleet.home / "gateway.log").read_text(errors="replace")[-3000:]


@contextlib.contextmanager
def running_gateway(home: Path, config_path: Path, dashboard: str) -> Iterator[Gateway]:
    """`rayfleet gateway` on a port of its own, ready; killed on exit if still running."""
    fleet = RunningFleet(home=home, port=free_port(), config_path=config_path)
    argv = [*RAYFLEET, "gateway", "-c", str(config_path), "--dashboard", dashboard]
    argv += ["--port", str(fleet.port)]
    with open(home / "gateway.log", "wb") as log:
        process = subprocess.Popen(argv, env=fleet.env(), stdout=log, stderr=subprocess.STDOUT)
    gateway = Gateway(fleet, process)
    try:
        ready = wait_until(lambda: _phase(gateway), START_TIMEOUT_S, 1.0)
        assert ready == "ready", gateway.log()
        yield gateway
    finally:
        with contextlib.suppress(ProcessLookupError):
            process.kill()
        process.wait(timeout=60)


def _phase(gateway: Gateway) -> str | None:
    """The gateway's phase once past starting ("ready", "failed", "exited N"); else None."""
    if gateway.process.poll() is not None:
        return f"exited {gateway.process.returncode}"
    fleet = gateway.fleet
    phase = fleet.state().get("phase") if fleet.state_file.exists() else None
    return None if phase in (None, "starting") else str(phase)


@dataclass
class Attached:
    gateway: Gateway
    serve: ServeSubmissionClient
    dashboard: str

    @property
    def fleet(self) -> RunningFleet:
        return self.gateway.fleet


@pytest.fixture(scope="module")
def attached(
    head: tuple[Cluster, str, str], tiny_model: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Attached]:
    _, client_address, dashboard = head
    home = tmp_path_factory.mktemp("attached")
    scaling = {"min_replicas": 1, "max_replicas": 2, "target_load_per_replica": 8}
    models = [model_entry("tiny", tiny_model, autoscaling=scaling)]
    config_path = write_config(home, models, free_port(), cluster={"address": client_address})
    serve = wait_until(lambda: _submission_client(dashboard), 120, 1.0)
    assert serve is not None, f"the Ray dashboard at {dashboard} never answered"
    serve.deploy_applications(rendered_serve_config(config_path))
    try:
        with running_gateway(home, config_path, dashboard) as gateway:
            yield Attached(gateway, serve, dashboard)
    finally:
        serve.delete_applications()


def _submission_client(dashboard: str) -> ServeSubmissionClient | None:
    try:
        return ServeSubmissionClient(dashboard)
    except Exception:  # the dashboard is still starting
        return None


def _serving(fleet: RunningFleet) -> list[dict[str, Any]]:
    return [r for r in fleet.status()["replicas"] if r["healthy"] and not r["draining"]]


def test_gateway_serves_replicas_that_serve_config_deployed(attached):
    client = attached.fleet.client()
    answer = client.completions.create(model="tiny", prompt="Hello", max_tokens=4, temperature=0)
    assert answer.choices[0].finish_reason == "length"
    (replica,) = attached.fleet.status()["replicas"]
    assert replica["model"] == "tiny" and replica["healthy"]


def test_scale_rewrites_the_serve_config_and_restarts_nothing(attached):
    fleet = attached.fleet
    (first,) = fleet.status()["replicas"]
    fleet.cli("scale", "tiny", "2")
    two = wait_until(lambda: _serving(fleet) if len(_serving(fleet)) == 2 else None, 600, 1.0)
    assert two is not None, fleet.status()
    assert first["pid"] in {r["pid"] for r in two}  # a new replica, the old one untouched
    deployed = attached.serve.get_serve_details()["applications"]["tiny"]["deployed_app_config"]
    assert deployed["deployments"] == [{"name": "tiny", "num_replicas": 2}]


def test_a_second_gateway_serves_and_scales_once_the_first_stops(attached, tmp_path):
    first = attached.gateway
    with running_gateway(tmp_path, first.fleet.config_path, attached.dashboard) as second:
        answer = second.fleet.client().completions.create(model="tiny", prompt="Hi", max_tokens=2)
        assert answer.choices[0].text
        refused = second.fleet.cli("scale", "tiny", "1", check=False)
        assert refused.returncode != 0
        assert "another gateway of this fleet scales model 'tiny'" in refused.stderr
        # The first gateway stops: the replicas keep serving, and the second takes over.
        pids = {r["pid"] for r in first.fleet.status()["replicas"]}
        first.process.terminate()
        assert first.process.wait(timeout=120) == 0, first.log()
        assert all(psutil.pid_exists(pid) for pid in pids)
        details = attached.serve.get_serve_details()
        assert details["applications"]["tiny"]["status"] == "RUNNING"
        took_over = wait_until(
            lambda: second.fleet.cli("scale", "tiny", "1", check=False).returncode == 0, 120, 2.0
        )
        assert took_over, second.log()
        one = wait_until(lambda: len(_serving(second.fleet)) == 1, 600, 1.0)
        assert one, second.fleet.status()
