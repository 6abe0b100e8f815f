"""Run a fleet in this process: Ray, one Serve application per model, the gateway.

``FleetProcess(config).run()`` is what ``rayfleet up`` runs (through
``lifecycle.serve``, in the foreground or in the background process of ``up --detach``);
it returns when the fleet has been stopped (SIGINT or SIGTERM) and everything it
started is gone. It keeps the run-state file (rayfleet/control/state.py) current::

    connect_ray          embedded local Ray, or join 'auto' / 'ray://...'; on a joined
                         cluster, a warning for nodes whose Ray workers run niced
    refuse_unplaceable   a replica shape the cluster cannot hold even idle fails now
    deploy               Serve without its HTTP proxy (the gateway is the ingress),
                         the FleetRegistry, then every model's application at once,
                         each replica's vLLM started with config.engine_args_for(model)
    gateway              aiohttp on config.gateway.host:port, polling the registry;
                         one JSON line per request in <log dir>/access.log; with
                         gateway.workers above 1, that many worker processes serve
                         the port and this one is their control (gateway/workers.py)
    wait_until_ready     progress per model until each has all its replicas, or a
                         clear error when Serve reports a deployment failed or Ray
                         still holds a replica's placement group back at
                         cluster.placement_timeout_s (rayfleet/control/readiness.py)
    scale                every second, each model's target replica count from its
                         load and windows (rayfleet/control/scaling.py), set in Serve
    ... serve until a signal ...
    shutdown             gateway, Serve (replicas stop their vLLM servers), then any
                         vLLM process group still alive, then Ray
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rayfleet._home import rayfleet_home
from rayfleet.cluster import niced_warning
from rayfleet.config import FleetConfig
from rayfleet.control.apply import ApplyResult
from rayfleet.control.deploy import ClusterStatus, connect_ray, deploy, set_replicas
from rayfleet.control.engine import PID_DIR
from rayfleet.control.node_sweep import sweep_other_nodes
from rayfleet.control.process_groups import kill_process_group, kill_recorded_engines
from rayfleet.control.readiness import wait_until_ready
from rayfleet.control.scaling import Clock, FleetScaler
from rayfleet.control.scheduling import refuse_unplaceable
from rayfleet.control.state import RunState, clear_state
from rayfleet.errors import RayfleetError

if TYPE_CHECKING:
    from ray.actor import ActorHandle

    from rayfleet.control.registry import Entry
    from rayfleet.gateway.app import EntrySource, Gateway
    from rayfleet.gateway.workers import WorkerPool

log = logging.getLogger("rayfleet.fleet")

WORKERS_START_TIMEOUT_S = 120.0  # gateway.workers: each worker up and listening

Say = Callable[[str], None]


class FleetProcess:
    """The fleet as run by ``rayfleet up``: owns Ray, Serve, the gateway and the state file."""

    def __init__(self, config: FleetConfig, *, say: Say = print):
        self.config = config
        self.say = say
        self.log_dir = rayfleet_home() / "logs" / time.strftime("%Y%m%d-%H%M%S")
        host, port = config.gateway.host, config.gateway.port
        self.state = RunState(
            pid=os.getpid(),
            gateway_url=f"http://{host}:{port}",
            ray_address=config.cluster.address,
            models=[m.name for m in config.models],
            log_dir=str(self.log_dir),
            started_at=time.time(),
        )
        self.access_log: Path | None = self.log_dir / "access.log"  # None: standard output
        self.engine_pids: set[int] = set()
        self.node_ip = ""  # this machine's address in the Ray cluster
        self.registry: ActorHandle[Any] | None = None  # keeps the registry actor alive
        self.niced_check: asyncio.Task[None] | None = None  # on a joined cluster
        self.scaler: FleetScaler  # made with the gateway it reads
        self.gateway: Gateway
        self.apps = {m.name: m.name for m in config.models}  # model -> Serve application
        self.generation = 0  # of blue/green applications
        self.apply_lock = asyncio.Lock()
        self.pool: WorkerPool | None = None  # gateway.workers above 1
        self.cluster_status = ClusterStatus()  # Ray's and Serve's part of the status
        from rayfleet.gateway.policies import Policies

        # Key files and provider keys are read now, so a missing one fails before Ray starts.
        self.policies = Policies.from_fleet(config)

    def run(self) -> None:
        """Serve until SIGINT or SIGTERM; always clean up."""
        try:
            import uvloop

            uvloop.run(self._main())
        except ImportError:
            asyncio.run(self._main())

    async def _main(self) -> None:
        from rayfleet.gateway.access_log import close_access_log, open_access_log
        from rayfleet.gateway.server import listen, start_gateway

        loop = asyncio.get_running_loop()
        stop = asyncio.Event()
        self.state.save()
        access = open_access_log(self.access_log)  # one JSON line per request
        runner = None
        listener = None
        scaling: asyncio.Task[None] | None = None
        try:
            # Bound before Ray starts: its processes take ports that were free a moment ago.
            # Under gateway.workers the workers listen; this process only holds the port.
            workers = self.config.gateway.workers
            listener = listen(
                self.config.gateway.host,
                self.config.gateway.port,
                reuse_port=workers > 1,
                accept=workers == 1,
            )
            self.say(f"starting Ray ({self.config.cluster.address})")
            await asyncio.to_thread(connect_ray, self.config)
            self.node_ip = await asyncio.to_thread(_this_node_ip)
            if self.config.cluster.address != "local":  # `ray start`'s nodes: their niceness
                self.niced_check = asyncio.create_task(self._warn_niced_workers())
            for sig in (signal.SIGINT, signal.SIGTERM):
                loop.add_signal_handler(sig, stop.set)
            gateway = self._gateway()
            await self._start_replicas()
            host, port = self.config.gateway.host, self.config.gateway.port
            if self.pool is None:
                runner = await start_gateway(gateway, host, port, listener)
            else:
                runner = await start_gateway(
                    gateway, host, port, unix_path=self.pool.control_path, tcp=False
                )
                await self.pool.start(gateway)
                missing = await self.pool.wait_listening(WORKERS_START_TIMEOUT_S)
                if missing:
                    raise RayfleetError(
                        f"gateway worker(s) {', '.join(map(str, missing))} did not start "
                        f"serving {host}:{port}; their errors are above"
                    )
            ready = asyncio.create_task(
                wait_until_ready(self.config, gateway, self.scaler.targets, self.apps, self.say)
            )
            stopped = asyncio.create_task(stop.wait())
            done, _ = await asyncio.wait({ready, stopped}, return_when=asyncio.FIRST_COMPLETED)
            if ready in done:
                ready.result()  # raises if a deployment failed
                if self.pool is not None and not await self.pool.wait_synced(
                    WORKERS_START_TIMEOUT_S
                ):
                    raise RayfleetError("gateway workers did not take the replica list in time")
                self.state.phase = "ready"
                self.state.save()
                self._banner()
                scaling = asyncio.create_task(self.scaler.run())
                await stop.wait()
            else:
                ready.cancel()
            self.say("stopping the fleet")
        except RayfleetError as exc:
            self.state.phase = "failed"
            self.state.error = str(exc)
            self.state.save()
            raise
        finally:
            self.state.phase = "stopping"
            self.state.save()
            if scaling is not None:
                scaling.cancel()
            if self.pool is not None:
                await self.pool.stop()
                if listener is not None:
                    listener.close()  # the port it held for the workers
            if runner is not None:
                await runner.cleanup()
            await asyncio.to_thread(self._shutdown)
            close_access_log(access)
            clear_state()

    async def _warn_niced_workers(self) -> None:
        """Say which nodes run Ray's workers niced, in the background: a node answers
        when it has a worker started for the check."""
        try:
            line = await asyncio.to_thread(niced_warning)
        except (RuntimeError, ConnectionError, OSError) as exc:  # Ray stopping under it
            log.debug("worker niceness check failed: %s", exc)
            return
        if line:
            self.say(line)

    async def _start_replicas(self) -> None:
        """Deploy every model at its starting count, keeping the registry's handle."""
        await asyncio.to_thread(refuse_unplaceable, self.config)
        self.say(f"deploying {len(self.config.models)} model(s); vLLM logs in {self.log_dir}")
        self.registry = await asyncio.to_thread(
            deploy, self.config, self.log_dir, dict(self.scaler.targets)
        )

    def _gateway(self) -> Gateway:
        """The gateway, and the scaler that reads it; elastic models hold requests."""
        from rayfleet.control.admin import admin_routes
        from rayfleet.gateway.app import Gateway

        config = self.config
        hold_s = _hold_s(config)
        routes = admin_routes(self)
        source: EntrySource = self._entries
        if config.gateway.workers > 1:
            from rayfleet.gateway.workers import WorkerPool

            self.pool = WorkerPool(
                config,
                hold_s=hold_s,
                forwarded=[(method, path) for method, path, _ in routes],
                access_log=self.access_log,
            )
            source = self.pool.slotted(source)
            routes += self.pool.internal_routes()
        gateway = Gateway(
            [m.name for m in config.models],
            source,
            connect_timeout_s=config.gateway.connect_timeout_s,
            request_timeout_s=config.gateway.request_timeout_s,
            http_front=config.gateway.http_front == "rayfleet",
            status_extra=self._status,
            policies=self.policies,
            hold_s=hold_s,
            extra_routes=routes,
        )
        clock = Clock.from_env()
        self.scaler = FleetScaler(config, gateway, self._set_target, clock, say=self.say)
        self.gateway = gateway
        return gateway

    async def reconfigure_gateway(self, config: FleetConfig, models: list[str]) -> None:
        from rayfleet.gateway.policies import Policies

        policies = await asyncio.to_thread(Policies.from_fleet, config)
        hold_s = _hold_s(config)
        await self.gateway.reconfigure(models, policies, hold_s)
        if self.pool is not None:
            self.pool.reconfigure(config, hold_s)

    async def apply(self, text: str, *, dry_run: bool) -> ApplyResult:
        """`rayfleet apply`: the new file's diff, carried out unless ``dry_run``."""
        from rayfleet.control.rollout import apply_text

        return await apply_text(self, text, dry_run)

    async def _set_target(self, model: str, count: int) -> None:
        await asyncio.to_thread(
            set_replicas,
            self.config,
            self.config.model(model),
            self.log_dir,
            count,
            self.apps[model],
        )

    async def _status(self) -> dict[str, Any]:
        status = await self.cluster_status.read()
        status["scaling"] = self.scaler.report()
        if self.pool is not None:
            status["gateway_workers"] = self.pool.report()
        return status

    async def _entries(self) -> list[Entry]:
        # The handle deploy returned: looking the actor up again each poll is a blocking
        # call to Ray's GCS on the gateway's event loop.
        assert self.registry is not None  # the gateway starts after deploy returned it
        entries: list[Entry] = await self.registry.entries.remote()
        # The vLLM processes of every rank on this machine: stopped at shutdown if Serve
        # left any (a pid on another machine is not ours to signal).
        pids = {
            rank["pid"]
            for e in entries
            for rank in e.get("ranks") or [e]
            if rank.get("pid") and rank.get("node_ip") == self.node_ip
        }
        if not pids <= self.engine_pids:
            self.engine_pids |= pids
            self.state.engine_pids = sorted(self.engine_pids)
            self.state.save()
        return entries

    def _banner(self) -> None:
        url = self.state.gateway_url
        self.say(f"fleet ready: OpenAI-compatible API at {url}/v1")
        for model in self.config.models:
            self.say(f"  model '{model.name}': {self.scaler.targets[model.name]} replica(s)")
        self.say(
            f"  try: curl {url}/v1/models    status: rayfleet status    "
            "stop: Ctrl-C or rayfleet down"
        )

    def _shutdown(self) -> None:
        import ray

        with contextlib.suppress(Exception):
            from ray import serve

            if ray.is_initialized():
                serve.shutdown()  # type: ignore[no-untyped-call]
        with contextlib.suppress(Exception):
            if ray.is_initialized():  # what replicas left on other nodes (node_sweep.py)
                for node, groups in sweep_other_nodes(self.log_dir / PID_DIR).items():
                    if groups:
                        self.say(f"stopped {len(groups)} engine group(s) left on node {node}")
        with contextlib.suppress(Exception):
            ray.shutdown()
        for pid in sorted(self.engine_pids):
            kill_process_group(pid, grace_s=10)
        kill_recorded_engines(self.log_dir / PID_DIR)  # replicas stopped while starting
        self.say("fleet stopped")


def _this_node_ip() -> str:
    import ray

    address: str = ray.util.get_node_ip_address()  # type: ignore[no-untyped-call]
    return address


def _hold_s(config: FleetConfig) -> dict[str, float]:
    """How long the gateway holds a request for each elastic model while it has no
    replica (scale from zero, a window, a replacement starting): the request's timeout."""
    return {
        m.name: config.gateway.request_timeout_s
        for m in config.models
        if m.autoscaling or m.schedules
    }
