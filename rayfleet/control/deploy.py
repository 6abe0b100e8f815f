"""The fleet on Ray: connect, deploy each model as a Serve application, read its state.

connect_ray(config)                       embedded local Ray, or join the cluster
deploy(config, log_dir, targets)          Serve (no HTTP proxy: the gateway is the
                                          ingress), the registry, every model's app
set_replicas(config, model, log_dir, n, app)
                                          one model's app again with n replicas: the
                                          same deployment version, so Serve only adds
                                          or removes replicas (or a new app: green)
delete_app(app)                           an app deleted; its replicas drain
failed_deployments(config)                models whose app failed, with Serve's words
                                          (one line when a vLLM server failed to start)
cluster_status()                          what `status` reads of Ray and Serve
ClusterStatus(timeout_s).read()           the same, one read at a time, given up on
                                          after timeout_s
"""

from __future__ import annotations

import asyncio
import logging
import math
import os
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rayfleet.config import FleetConfig, ModelConfig

if TYPE_CHECKING:
    from ray.actor import ActorHandle


def connect_ray(config: FleetConfig) -> str:
    """Start or join Ray; returns the address used."""
    from rayfleet.cluster import LOCAL, connect
    from rayfleet.control.registry import NAMESPACE

    address = config.cluster.address
    num_cpus = None
    if address == LOCAL:  # enough logical CPUs for every replica, and two to spare
        needed = sum(m.num_cpus * _most_replicas(m) for m in config.models)
        num_cpus = config.cluster.num_cpus or max(os.cpu_count() or 1, math.ceil(needed) + 2)
    connect(
        address,
        hint="or set cluster.address to 'local' for an embedded Ray",
        namespace=NAMESPACE,
        num_cpus=num_cpus,
        logging_level=logging.WARNING,
    )
    return address


def _most_replicas(model: ModelConfig) -> int:
    """The most replicas a model may run at once: its ceiling, one more during a roll."""
    ceiling = model.autoscaling.max_replicas if model.autoscaling else model.replicas
    return ceiling + 1


def deploy(config: FleetConfig, log_dir: Path, targets: dict[str, int]) -> ActorHandle[Any]:
    """Deploy every model with ``targets[name]`` replicas; returns the registry handle,
    which the caller must keep alive."""
    from ray import serve

    from rayfleet.control.registry import get_or_create_registry

    serve.start(proxy_location="Disabled")
    registry = get_or_create_registry()
    starting = [m for m in config.models if targets[m.name] > 0]  # at zero: no application
    if starting:
        _run_apps(config, starting, log_dir, targets)
    return registry


def set_replicas(
    config: FleetConfig, model: ModelConfig, log_dir: Path, count: int, app: str | None = None
) -> None:
    """Run ``model``'s application (``app``, the model's name by default) again with
    ``count`` replicas; nothing restarts. Also starts a new application under a new name
    (a blue/green rollout's green side). Serve refuses ``num_replicas: 0``, so a model at
    zero has no application: it is deleted (its replicas drain) and run again from zero."""
    if count == 0:
        delete_app(app or model.name)
        return
    _run_apps(config, [model], log_dir, {model.name: count}, {model.name: app or model.name})


def delete_app(app: str) -> None:
    """Delete a Serve application without waiting: its replicas drain, then stop."""
    from ray import serve

    serve.delete(app, _blocking=False)


def _run_apps(
    config: FleetConfig,
    models: list[ModelConfig],
    log_dir: Path,
    targets: dict[str, int],
    apps: dict[str, str] | None = None,
) -> None:
    from ray import serve
    from ray.serve.api import RunTarget

    from rayfleet.control.replica import build_application

    advertise = "127.0.0.1" if config.cluster.address == "local" else None
    run_targets = [
        RunTarget(
            build_application(
                m,
                config.engine_args_for(m),
                advertise_host=advertise,
                log_dir=log_dir,
                num_replicas=targets[m.name],
            ),
            name=(apps or {}).get(m.name, m.name),
            route_prefix=None,
        )
        for m in models
    ]
    serve.run_many(
        run_targets, wait_for_ingress_deployment_creation=False, wait_for_applications_running=False
    )


def failed_deployments(config: FleetConfig, apps: dict[str, str] | None = None) -> dict[str, str]:
    """Models whose Serve application (``apps[model]``, the model's name by default)
    failed to deploy, with Serve's message."""
    from ray import serve

    statuses = serve.status().applications
    failed: dict[str, str] = {}
    for model in config.models:
        app = statuses.get((apps or {}).get(model.name, model.name))
        if app is not None and app.status == "DEPLOY_FAILED":
            details = [d.message for d in app.deployments.values() if d.message]
            failed[model.name] = failure_reason("\n".join([app.message, *details]))
    return failed


def failure_reason(message: str) -> str:
    """One line out of Serve's message for a replica that could not start: why its vLLM
    server failed and where its log is, when the message carries an ``EngineFailed``;
    else Serve's whole message."""
    for line in message.splitlines():
        if "EngineFailed: " in line:
            reason = line.split("EngineFailed: ", 1)[1].rstrip(":")
            return reason.replace("; last lines of ", "; its log: ")
    return message


async def cluster_status() -> dict[str, Any]:
    """Nodes and Serve application states, for GET /rayfleet/status."""
    import ray
    from ray import serve

    def collect() -> dict[str, Any]:
        nodes = [
            {
                "node_id": n["NodeID"],
                "ip": n["NodeManagerAddress"],
                "alive": n["Alive"],
                "cpus": n.get("Resources", {}).get("CPU", 0),
                "gpus": n.get("Resources", {}).get("GPU", 0),
            }
            for n in ray.nodes()  # type: ignore[no-untyped-call]
        ]
        apps = {
            name: {"status": getattr(app.status, "value", str(app.status)), "message": app.message}
            for name, app in serve.status().applications.items()
        }
        return {"nodes": nodes, "applications": apps}

    return await asyncio.to_thread(collect)


class ClusterStatus:
    """Ray's nodes and Serve's applications for ``/rayfleet/status``, without making the
    status wait on them: while a node is lost or joining, or Serve's controller is busy,
    they can take longer than `rayfleet status` waits (10 s), and the status is asked for
    then most. A read not in after ``timeout_s`` gives ``status_error`` instead, and the
    status answers with the rest; reads are one at a time, so a slow cluster is not asked
    again by every status meanwhile (the read under way answers them)."""

    def __init__(
        self,
        timeout_s: float = 5.0,
        read: Callable[[], Awaitable[dict[str, Any]]] = cluster_status,
    ):
        self.timeout_s = timeout_s
        self._read = read
        self._pending: asyncio.Future[dict[str, Any]] | None = None

    async def read(self) -> dict[str, Any]:
        if self._pending is None or self._pending.done():
            self._pending = asyncio.ensure_future(self._read())
        try:
            return await asyncio.wait_for(asyncio.shield(self._pending), self.timeout_s)
        except TimeoutError:
            return {
                "status_error": f"Ray and Serve did not report within {self.timeout_s:g} s "
                "(a node lost or joining, or Serve's controller busy); the replicas are "
                "as the gateway sees them"
            }
