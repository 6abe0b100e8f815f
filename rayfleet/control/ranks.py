"""The ranks of a replica that spans nodes: vLLM's own multi-node launch, placed by Ray.

A model with ``nodes_per_replica: N`` (N > 1) runs each replica as one vLLM engine over
N nodes, with vLLM's multiprocessing executor and its multi-node flags (``--nnodes N
--node-rank R --master-addr A --master-port P``). Ray places and watches the ranks; vLLM
does the distributed work. Data flow, inside the replica actor (rank 0), which Serve
has put in bundle 0 of the replica's placement group (one bundle per node,
STRICT_SPREAD, rayfleet/control/placement.py)::

    ranks = SpanningRanks(model, engine_args, replica_id, master_addr, registry, log_dir)
    ranks.start()             one EngineRank actor per bundle 1..N-1, each starting a
                              headless rank on its node (rayfleet/control/headless.py)
    ranks.args_for(0)         the API server's own engine args (rank 0, started by the
                              replica as for any model)
    ranks.failure()           None, or which rank died and the tail of its log (every
                              rank asked at once, within answer_timeout_s)
    ranks.describe(rank0)     [{"rank", "node_id", "node_ip", "pid"}] for the registry
    ranks.stop()              stop every headless rank, then drop the actors

Rank 0 listens on ``master_addr`` (its node's address) and a port free there; the
others connect to it. The replica is one unit: when any rank's process dies, the
replica's health check fails and Serve replaces all of it. A rank actor is owned by
the replica actor, so it dies with it, and its vLLM process (started with a death
signal tied to its parent) follows.

Each rank sees exactly the GPUs Ray assigned to its bundle, takes a CPU core of its
machine from the registry (claims are per machine address, so raylets sharing one
machine share its cores), and checks ``NCCL_SOCKET_IFNAME``/``GLOO_SOCKET_IFNAME``
from the model's env against its node's interfaces before it starts, as the doctor
does.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import ray

from rayfleet.config import ModelConfig
from rayfleet.control.engine import PID_DIR, EngineProcess, free_port
from rayfleet.control.placement import assigned_gpu_ids, gpu_env, node_bundle
from rayfleet.control.server_probe import SlowAnswers

log = logging.getLogger("rayfleet.ranks")

RANK_CALL_TIMEOUT_S = 10.0  # a rank's start and stop
SOCKET_IFNAME_VARIABLES = ("NCCL_SOCKET_IFNAME", "GLOO_SOCKET_IFNAME")

Rank = dict[str, Any]  # {"rank", "node_id", "node_ip", "pid"}


def rank_engine_args(
    engine_args: Mapping[str, Any], nnodes: int, rank: int, master_addr: str, master_port: int
) -> dict[str, Any]:
    """One rank's engine arguments: the model's, plus vLLM's multi-node flags."""
    return {
        **engine_args,
        "distributed_executor_backend": "mp",
        "nnodes": nnodes,
        "node_rank": rank,
        "master_addr": master_addr,
        "master_port": master_port,
    }


def socket_ifname_problem(env: Mapping[str, str], interfaces: list[str]) -> str | None:
    """Why the model's socket interface variables cannot work on this node, or None."""
    from rayfleet.doctor.checks import match_interfaces

    for variable in SOCKET_IFNAME_VARIABLES:
        spec = env.get(variable)
        if spec is not None and not match_interfaces(spec, interfaces):
            return (
                f"{variable}={spec} matches no interface on this node "
                f"({', '.join(interfaces)}); set it in the model's env to one of them"
            )
    return None


def engine_env(model: ModelConfig, registry: Any, claim_id: str, node_ip: str) -> dict[str, str]:
    """A rank's environment: the model's env, a CPU core of its machine for a CPU engine
    (GPU builds ignore it), and exactly the GPUs Ray assigned as CUDA_VISIBLE_DEVICES."""
    env = dict(model.env)
    if "VLLM_CPU_OMP_THREADS_BIND" not in env:
        cpus = sorted(os.sched_getaffinity(0))
        index: int = ray.get(registry.claim_core.remote(node_ip, claim_id, model.name, len(cpus)))
        env["VLLM_CPU_OMP_THREADS_BIND"] = str(cpus[index])
    env.update(gpu_env(assigned_gpu_ids()))
    return env


@ray.remote(max_restarts=0)
class EngineRank:
    """One headless rank of a replica's engine, on the node of its bundle."""

    def __init__(self) -> None:
        self.engine: EngineProcess | None = None

    def start(
        self,
        model: dict[str, Any],
        engine_args: dict[str, Any],
        claim_id: str,
        log_path: str,
    ) -> Rank:
        from rayfleet.control.registry import get_registry

        config = ModelConfig.model_validate(model)
        node_ip: str = ray.util.get_node_ip_address()  # type: ignore[no-untyped-call]
        problem = socket_ifname_problem(config.env, sorted(os.listdir("/sys/class/net")))
        if problem:
            raise RuntimeError(f"rank {engine_args['node_rank']} on {node_ip}: {problem}")
        Path(log_path).parent.mkdir(parents=True, exist_ok=True)
        self.engine = EngineProcess(
            config.source,
            config.name,
            engine_args,
            env=engine_env(config, get_registry(), claim_id, node_ip),
            log_path=Path(log_path),
            headless=True,
            pid_dir=Path(log_path).parent / PID_DIR,
        )
        self.engine.start()
        return {
            "rank": engine_args["node_rank"],
            "node_id": ray.get_runtime_context().get_node_id(),
            "node_ip": node_ip,
            "pid": self.engine.pid,
        }

    def alive(self) -> bool:
        return self.engine is not None and self.engine.alive()

    def log_tail(self) -> str:
        return self.engine.log_tail() if self.engine is not None else ""

    def stop(self, grace_s: float = 10.0) -> None:
        if self.engine is not None:
            self.engine.stop(grace_s=grace_s)


class SpanningRanks:
    """Ranks 1..N-1 of one replica's engine, seen from the replica actor (rank 0)."""

    def __init__(
        self,
        model: ModelConfig,
        engine_args: Mapping[str, Any],
        replica_id: str,
        master_addr: str,
        log_dir: Path,
        answer_timeout_s: float,
    ):
        self.model = model
        self.engine_args = dict(engine_args)
        self.replica_id = replica_id
        self.master_addr = master_addr
        self.master_port = free_port("")
        self.log_dir = log_dir
        self.actors: list[Any] = []  # Ray handles; index i is rank i + 1
        self.ranks: list[Rank] = []
        self.answer_timeout_s = answer_timeout_s
        # checks in a row that some rank's actor left unanswered
        self.slow = SlowAnswers("its checks", answer_timeout_s, where=f"replica {replica_id}")
        self.unanswered: dict[int, Any] = {}  # index: the question still pending

    def args_for(self, rank: int) -> dict[str, Any]:
        return rank_engine_args(
            self.engine_args,
            self.model.nodes_per_replica,
            rank,
            self.master_addr,
            self.master_port,
        )

    def start(self) -> None:
        """One EngineRank per bundle 1..N-1 of the replica's placement group, started."""
        from ray.util.placement_group import get_current_placement_group
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        group = get_current_placement_group()
        if group is None:
            raise RuntimeError(f"replica {self.replica_id} spans nodes but has no placement group")
        bundle = node_bundle(self.model)
        starts = []
        for rank in range(1, self.model.nodes_per_replica):
            actor = EngineRank.options(  # type: ignore[attr-defined]
                num_cpus=bundle["CPU"],
                num_gpus=bundle["GPU"],
                memory=int(bundle["memory"]) if "memory" in bundle else None,
                scheduling_strategy=PlacementGroupSchedulingStrategy(
                    group, placement_group_bundle_index=rank
                ),
            ).remote()
            self.actors.append(actor)
            log_path = self.log_dir / f"{log_name(self.replica_id)}-rank{rank}.log"
            starts.append(
                actor.start.remote(
                    self.model.model_dump(exclude_unset=True),
                    self.args_for(rank),
                    f"{self.replica_id}/rank{rank}",
                    str(log_path),
                )
            )
        self.ranks = list(ray.get(starts))
        log.info("replica %s: ranks started %s", self.replica_id, self.ranks)

    def failure(self) -> str | None:
        """Which rank's process is gone, with the end of its log; None when all run.

        Every rank is asked at once, so a check waits ``answer_timeout_s`` however many
        ranks there are (and as long again for a dead rank's log). A rank whose actor died
        is a failure at once. One whose actor leaves the question unanswered is one only
        after ``SLOW_ANSWERS_LIMIT`` checks in a row: a loaded node answers late, as the
        replica's /health probe counts (rayfleet/control/server_probe.py). A question
        left unanswered is waited for again at the next check, not asked anew, so a slow
        actor's queue does not grow."""
        pending = self.unanswered
        asked = [
            pending[i] if i in pending else actor.alive.remote()
            for i, actor in enumerate(self.actors)
        ]
        ready, _ = ray.wait(asked, num_returns=len(asked), timeout=self.answer_timeout_s)
        answered = set(ready)
        self.unanswered = {i: ref for i, ref in enumerate(asked) if ref not in answered}
        silent = [index + 1 for index in self.unanswered]
        for index, ref in enumerate(asked):
            rank = index + 1
            if ref not in answered:
                continue
            try:
                if ray.get(ref):
                    continue
                tail = ray.get(self.actors[index].log_tail.remote(), timeout=self.answer_timeout_s)
            except Exception as exc:  # noqa: BLE001  (its actor is gone, or cannot read its log)
                return f"rank {rank} does not answer ({type(exc).__name__})"
            return self._exited(index, tail)
        return self._unanswered(silent)

    def _exited(self, index: int, tail: str) -> str:
        where = self.ranks[index] if index < len(self.ranks) else {}
        return (
            f"rank {index + 1} (node {where.get('node_ip', '?')}, pid {where.get('pid', '?')}) "
            f"has exited; last lines of its log:\n{tail[-2000:]}"
        )

    def _unanswered(self, silent: list[int]) -> str | None:
        """A failure once ranks left ``SLOW_ANSWERS_LIMIT`` checks in a row unanswered."""
        if not silent:
            self.slow.answered()
            return None
        return self.slow.unanswered(f"rank {', '.join(map(str, silent))}")

    def describe(self, rank0: Rank) -> list[Rank]:
        return [rank0, *self.ranks]

    def stop(self) -> None:
        """Stop every headless rank's process, then the actors."""
        pending = [actor.stop.remote() for actor in self.actors]
        for ref in pending:
            try:
                ray.get(ref, timeout=RANK_CALL_TIMEOUT_S + 10)
            except Exception as exc:  # noqa: BLE001  (a rank already gone is stopped)
                log.info("rank stop: %s", exc)
        for actor in self.actors:
            ray.kill(actor)
        self.actors = []


def log_name(replica_id: str) -> str:
    """A replica id as a file name (its vLLM log, and each rank's)."""
    return replica_id.replace("#", "-").replace("/", "_")
