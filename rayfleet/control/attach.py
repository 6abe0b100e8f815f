"""The gateway of a fleet whose replicas Ray Serve's own config deployed (KubeRay's
RayService, ``serve deploy``; control/serve_app.py builds them): ``rayfleet gateway``.

It is ``rayfleet up`` without the deploy: it joins the cluster (a Ray client address,
``ray://HEAD:10001``, from a pod that is not a Ray node), finds the replica registry the
applications made, serves the API with the fleet's policies, and scales. It owns no
replica: stopping it leaves them serving, and several gateways may run side by side::

    AttachedFleet(config, dashboard_url).run()
        connect_ray                the cluster at config.cluster.address
        registry                   get_or_create_registry(detached=True)
        targets                    each model's count as Serve runs it now
        gateway, scaler            as in `rayfleet up`, but only the gateway the registry
                                   names (lead_scaling) scales where several run; a new
                                   target is written into the Serve config through the
                                   dashboard's REST API (declare_replicas): the model's
                                   deployment gets the new num_replicas, every other
                                   application is sent back as deployed; at zero the
                                   application is left out, and put back from its last
                                   config when it scales up again
        request log                one JSON line per request on standard output
        shutdown                   this process's Ray connection only

The REST write changes the live config only. KubeRay sends the RayService's
``serveConfigV2`` again when that resource changes or its cluster is replaced; the counts
then return to the rendered ones until the next scaling step. `rayfleet apply` is refused
here: the RayService is where such a change is made.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import socket
from typing import TYPE_CHECKING, Any

from rayfleet.config import FleetConfig
from rayfleet.control.apply import ApplyResult
from rayfleet.control.fleet import FleetProcess, Say
from rayfleet.errors import RayfleetError

if TYPE_CHECKING:
    from rayfleet.gateway.app import Gateway

SERVE_CONFIG_KEYS = ("proxy_location", "http_options", "grpc_options", "target_capacity")
LEAD_TTL_S = 10.0  # a gateway silent this long hands scaling to another


class AttachedFleet(FleetProcess):
    """The fleet process of `rayfleet gateway`: everything but the replicas' lifecycle."""

    def __init__(self, config: FleetConfig, dashboard_url: str, *, say: Say = print):
        super().__init__(config, say=say)
        self.dashboard_url = dashboard_url
        self.declared: dict[str, dict[str, Any]] = {}  # app -> its last Serve config
        self.holder = f"{socket.gethostname()}:{os.getpid()}"  # in the scaling lead
        self.access_log = None  # request lines on standard output, as a pod's log

    def _gateway(self) -> Gateway:
        gateway = super()._gateway()
        self.scaler.leads = self._leads_scaling
        return gateway

    async def _leads_scaling(self) -> bool:
        assert self.registry is not None  # made before the scaler starts
        leads: bool = await self.registry.lead_scaling.remote(self.holder, LEAD_TTL_S)
        return leads

    async def _start_replicas(self) -> None:
        from rayfleet.control.registry import get_or_create_registry

        self.registry = await asyncio.to_thread(get_or_create_registry, detached=True)
        details = await asyncio.to_thread(self._serve_details)
        for model in self.config.models:
            app = details.get("applications", {}).get(model.name)
            if app is None:
                self.say(f"model '{model.name}': no Serve application of that name yet")
                continue
            deployment = app.get("deployments", {}).get(model.name, {})
            running = deployment.get("target_num_replicas")
            if isinstance(running, int):
                self.scaler.targets[model.name] = running
        self.say(f"serving the replicas Serve runs; vLLM logs on each node in {_log_dir()}")
        if self.config.gateway.workers > 1:
            self.say(
                f"gateway.workers is {self.config.gateway.workers}, but rayfleet gateway "
                "serves in one process: only rayfleet up runs gateway workers"
            )

    async def _set_target(self, model: str, count: int) -> None:
        await asyncio.to_thread(self._declare, model, count)

    async def apply(self, text: str, *, dry_run: bool) -> ApplyResult:
        raise RayfleetError(
            "this gateway serves replicas deployed by the cluster's Serve config: change the "
            "fleet file, render it again (rayfleet k8s render) and apply the RayService"
        )

    def _serve_details(self) -> dict[str, Any]:
        from ray.dashboard.modules.serve.sdk import ServeSubmissionClient

        details: dict[str, Any] = ServeSubmissionClient(self.dashboard_url).get_serve_details()
        return details

    def _declare(self, model: str, count: int) -> None:
        from ray.dashboard.modules.serve.sdk import ServeSubmissionClient

        client = ServeSubmissionClient(self.dashboard_url)
        details: dict[str, Any] = client.get_serve_details()
        body = declare_replicas(details, self.declared, self.apps[model], model, count)
        client.deploy_applications(body)

    def _shutdown(self) -> None:
        import ray

        with contextlib.suppress(Exception):
            ray.shutdown()
        self.say("gateway stopped; the replicas keep serving")


def declare_replicas(
    details: dict[str, Any],
    declared: dict[str, dict[str, Any]],
    app: str,
    deployment: str,
    count: int,
) -> dict[str, Any]:
    """The Serve config to send so that ``deployment`` of ``app`` runs ``count`` replicas,
    from ``details`` (the dashboard's GET /api/serve/applications/). ``declared`` keeps
    each application's last config, to put back one that was left out at zero."""
    deployed = {
        name: dict(info["deployed_app_config"])
        for name, info in details.get("applications", {}).items()
        if info.get("deployed_app_config")
    }
    declared.update(deployed)
    if count == 0:
        deployed.pop(app, None)
    else:
        if app not in declared:
            raise RayfleetError(f"no Serve config for application '{app}' to scale")
        config = dict(deployed.get(app) or declared[app])
        others = [d for d in config.get("deployments") or [] if d.get("name") != deployment]
        own = next(
            (d for d in config.get("deployments") or [] if d.get("name") == deployment),
            {"name": deployment},
        )
        config["deployments"] = [*others, {**own, "num_replicas": count}]
        deployed[app] = config
    body = {key: details[key] for key in SERVE_CONFIG_KEYS if details.get(key) is not None}
    body["applications"] = list(deployed.values())
    return body


def _log_dir() -> str:
    from rayfleet.control.serve_app import ATTACHED_LOG_DIR

    return str(ATTACHED_LOG_DIR)
