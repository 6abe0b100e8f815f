"""A model replica: a Ray Serve deployment replica that runs one vLLM OpenAI server.

Lifecycle of one replica (Ray Serve owns it: placement, restarts, scaling)::

    __init__      start the vLLM server on a free port of this node (EngineProcess),
                  wait until GET /health answers, register {model, replica id, node,
                  url, pid} in the FleetRegistry. Serve shows the replica STARTING
                  until this returns; a server that fails to start fails the replica
                  with the tail of its log.
    check_health  called by Serve every HEALTH_CHECK_PERIOD_S: the server process must
                  be alive and answer /health (a live one may leave it unanswered
                  twice in a row: server_probe.py), and every rank must run; then
                  heartbeat the registry. A dead server or rank deregisters, stops the
                  rest and raises, so Serve replaces the replica.
    __del__       drain (control/drain.py: out of the gateway's rotation, then wait
                  for the requests in flight), deregister, and stop the server and
                  its ranks (Serve calls it on every graceful stop).

Tokens never pass through this actor: the gateway talks to the vLLM server directly.

A replica that spans nodes (``nodes_per_replica`` > 1) is one placement group with a
bundle per node: this actor is rank 0 (the API server) in the first bundle, and starts
one headless rank per other bundle (rayfleet/control/ranks.py); ``check_health`` fails
when any rank's process is gone, and Serve replaces the whole replica. The registry
entry lists every rank's node and pid.

What a replica reserves (its actor's CPU, GPU and memory, or a placement group for a
replica that spans nodes) comes from rayfleet/control/placement.py;
``deployment_options`` turns it into Serve's options and is pure, so it can be checked
without a GPU. The vLLM server sees exactly the GPUs Ray assigned to this replica
(``CUDA_VISIBLE_DEVICES`` from ``placement.gpu_env``), never all of its node's.
"""

from __future__ import annotations

import hashlib
import json
import logging
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from ray import serve
from ray.serve import Application

from rayfleet.config import ModelConfig
from rayfleet.control.apply import SCALING_FIELDS
from rayfleet.control.drain import drain
from rayfleet.control.engine import PID_DIR, EngineProcess
from rayfleet.control.placement import replica_demand
from rayfleet.control.process_groups import stop_leaderless_engines
from rayfleet.control.ranks import SpanningRanks, engine_env, log_name
from rayfleet.control.server_probe import ServerProbe

log = logging.getLogger("rayfleet.replica")

HEALTH_CHECK_PERIOD_S = 2.0
HEALTH_CHECK_TIMEOUT_S = 15.0
# A check's worst case must fit Serve's timeout, or Serve counts a failed check against a
# replica that serves: a /health probe of a third of it, the other ranks of a replica that
# spans nodes (asked at once), then a heartbeat and, when the registry does not know the
# replica, a register, a sixth each (5 + 2.5 + 2.5 + 2.5 of 15 s).
HEARTBEAT_TIMEOUT_S = HEALTH_CHECK_TIMEOUT_S / 6
RANKS_TIMEOUT_S = HEALTH_CHECK_TIMEOUT_S / 6
GRACEFUL_SHUTDOWN_TIMEOUT_S = 30.0


def deployment_options(model: ModelConfig, num_replicas: int | None = None) -> dict[str, Any]:
    """Ray Serve options for the deployment that serves ``model``: what ``replica_demand``
    says a replica asks for, the same demand ``rayfleet up --dry-run`` prints, and
    ``num_replicas`` (the model's ``replicas`` unless the fleet's scaler says otherwise;
    changing only it never restarts a replica)."""
    demand = replica_demand(model)
    options: dict[str, Any] = {
        "name": model.name,
        "num_replicas": model.replicas if num_replicas is None else num_replicas,
        "health_check_period_s": HEALTH_CHECK_PERIOD_S,
        "health_check_timeout_s": HEALTH_CHECK_TIMEOUT_S,
        # A leaving replica drains first (control/drain.py); Serve must not kill it sooner.
        "graceful_shutdown_timeout_s": model.drain_timeout_s + GRACEFUL_SHUTDOWN_TIMEOUT_S,
        "graceful_shutdown_wait_loop_s": 0.5,
        # A server that cannot start fails the same way every time: report it, do not loop.
        "max_constructor_retry_count": 2,
        # The actor (rank 0) takes the whole first bundle; the ranks take the others.
        "ray_actor_options": _actor_options(demand.bundles[0]),
    }
    if demand.strategy is not None:
        options["placement_group_bundles"] = [dict(b) for b in demand.bundles]
        options["placement_group_strategy"] = demand.strategy
    return options


def _actor_options(resources: Mapping[str, float]) -> dict[str, Any]:
    options: dict[str, Any] = {
        "num_cpus": resources.get("CPU", 0.0),
        "num_gpus": resources.get("GPU", 0),
    }
    if "memory" in resources:
        options["memory"] = int(resources["memory"])
    return options


@serve.deployment
class VLLMReplica:
    def __init__(
        self,
        model: dict[str, Any],
        engine_args: dict[str, Any],
        advertise_host: str | None,
        log_dir: str,
    ):
        import ray

        from rayfleet.control.registry import get_registry

        self.model = ModelConfig.model_validate(model)
        self.engine_args = engine_args
        context = serve.get_replica_context()
        self.replica_id = f"{self.model.name}#{context.replica_id.unique_id}"
        self.app = context.app_name  # the model's name, or its green side during a rollout
        self.node_id = ray.get_runtime_context().get_node_id()
        self.node_ip: str = ray.util.get_node_ip_address()  # type: ignore[no-untyped-call]
        # Any: Ray's handle types do not know FleetRegistry's methods.
        self.registry: Any = get_registry()
        self.ranks: SpanningRanks | None = None
        self.engine = self._start_engine(advertise_host or self.node_ip, Path(log_dir))
        self.probe = ServerProbe(self.engine, timeout_s=HEALTH_CHECK_TIMEOUT_S / 3)
        self.entry = {
            "replica_id": self.replica_id,
            "model": self.model.name,
            "url": self.engine.url,
            "node_id": self.node_id,
            "node_ip": self.node_ip,
            "pid": self.engine.pid,
            "ranks": self._rank_entries(),
            "state": "serving",
            "app": self.app,
        }
        ray.get(self.registry.register.remote(self.entry))
        log.info("replica %s serving %s at %s", self.replica_id, self.model.name, self.engine.url)

    def _start_engine(self, host: str, log_dir: Path) -> EngineProcess:
        log_dir.mkdir(parents=True, exist_ok=True)
        engine_args = self.engine_args
        if self.model.spans_nodes:
            self.ranks = SpanningRanks(
                self.model,
                self.engine_args,
                self.replica_id,
                self.node_ip,
                log_dir,
                answer_timeout_s=RANKS_TIMEOUT_S,
            )
            engine_args = self.ranks.args_for(0)
        engine = EngineProcess(
            self.model.source,
            self.model.name,
            engine_args,
            host=host,
            env=engine_env(self.model, self.registry, self.replica_id, self.node_ip),
            log_path=log_dir / f"{log_name(self.replica_id)}.log",
            engine=self.model.engine,
            pid_dir=log_dir / PID_DIR,  # the fleet stops it even if this actor cannot
        )
        try:
            if self.ranks is not None:
                self.ranks.start()
            engine.start()
            also = self.ranks.failure if self.ranks is not None else None
            engine.wait_healthy(timeout_s=self.model.startup_timeout_s, also=also)
        except Exception:
            self._stop_all(engine)
            raise
        return engine

    def _rank_entries(self) -> list[dict[str, Any]]:
        rank0 = {"rank": 0, "node_id": self.node_id, "node_ip": self.node_ip}
        rank0["pid"] = self.engine.pid
        return self.ranks.describe(rank0) if self.ranks is not None else [rank0]

    def check_health(self) -> None:
        problem = self._engine_problem()
        if problem:
            self._deregister()
            self._stop_all(self.engine)
            raise RuntimeError(f"vLLM server of {self.replica_id}: {problem}")
        if not _call(self.registry.heartbeat, self.replica_id, timeout_s=HEARTBEAT_TIMEOUT_S):
            _call(self.registry.register, self.entry, timeout_s=HEARTBEAT_TIMEOUT_S)
        if self.engine.pid_dir is not None:  # leftovers of a replica killed on this node
            stopped = stop_leaderless_engines(self.engine.pid_dir)
            if stopped:
                log.warning("stopped the engines of servers gone on this node: %s", stopped)

    def _engine_problem(self) -> str | None:
        """Why the replica cannot serve (its server or one of its ranks), or None."""
        problem = self.probe.problem()
        if problem is None and self.ranks is not None:
            problem = self.ranks.failure()
        return problem

    def _stop_all(self, engine: EngineProcess | None, grace_s: float = 5.0) -> None:
        """Stop the server and every rank; the replica is one unit."""
        try:
            if self.ranks is not None:
                self.ranks.stop()
        finally:
            if engine is not None:
                engine.stop(grace_s=grace_s)

    def _deregister(self) -> None:
        _call(self.registry.deregister, self.replica_id)

    def __del__(self) -> None:
        """A planned stop (scale-in, apply, down): drain, then stop everything."""
        try:
            engine = getattr(self, "engine", None)
            if engine is not None:
                result = drain(
                    engine,
                    lambda: _call(self.registry.set_state, self.replica_id, "draining"),
                    self.model.drain_timeout_s,
                )
                log.info("replica %s drained: %s", self.replica_id, result)
        finally:
            try:
                self._deregister()
            finally:
                if hasattr(self, "ranks"):
                    self._stop_all(getattr(self, "engine", None), grace_s=15.0)


def _call(method: Any, *args: Any, timeout_s: float = 5.0) -> Any:
    """Call a registry method; None when it fails (the registry may be gone at shutdown)."""
    import ray

    try:
        return ray.get(method.remote(*args), timeout=timeout_s)
    except Exception as exc:  # noqa: BLE001  (any failure is logged, never raised)
        log.warning("registry call failed: %s", exc)
        return None


def build_application(
    model: ModelConfig,
    engine_args: dict[str, Any],
    *,
    advertise_host: str | None,
    log_dir: Path,
    num_replicas: int | None = None,
) -> Application:
    """The Ray Serve application that serves one model, its servers started with
    ``engine_args`` (``FleetConfig.engine_args_for(model)``).

    Its deployment version is ``deployment_version``: the same model and arguments give
    the same version, so running the application again with a new ``num_replicas`` only
    adds or removes replicas. Serve's imperative API gives a deployment without a version
    a random one on every run, which rolls every replica; it keeps ``version`` for its own
    callers (``_internal``), the one private argument rayfleet passes.
    """
    options = deployment_options(model, num_replicas)
    init_args = (model.model_dump(exclude_unset=True), engine_args, advertise_host, str(log_dir))
    version = deployment_version(model, *init_args[1:])
    deployment = VLLMReplica.options(  # type: ignore[attr-defined]
        **options, version=version, _internal=True
    )
    app: Application = deployment.bind(*init_args)
    return app


def deployment_version(
    model: ModelConfig, engine_args: dict[str, Any], advertise_host: str | None, log_dir: str
) -> str:
    """A digest of everything a replica starts with (not how many replicas there are)."""
    started_with = {
        "model": model.model_dump(mode="json", exclude=set(SCALING_FIELDS)),
        "engine_args": engine_args,
        "advertise_host": advertise_host,
        "log_dir": log_dir,
    }
    text = json.dumps(started_with, sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:16]
