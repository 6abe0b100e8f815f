"""How a replica that spans nodes reads its other ranks' answers at each health check
(``SpanningRanks.failure``), against real Ray actors on a local raylet: every rank asked
at once, a dead actor or an exited process a failure at once, a rank that leaves the
question unanswered one only after three checks in a row (asked once, waited for at each).

The actors here stand in for ``EngineRank`` with a process that runs, has exited, or
whose actor is stuck; the real ranks of a replica over two raylets, killed one by one,
are in tests/integration/test_multinode.py.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import ray

from rayfleet.config import ModelConfig
from rayfleet.control.ranks import SpanningRanks
from rayfleet.control.server_probe import SLOW_ANSWERS_LIMIT

pytestmark = pytest.mark.integration

GENEROUS_S = 60.0  # an answer that comes, however loaded the machine


@ray.remote(num_cpus=0, max_concurrency=4)
class RankStandIn:
    """A rank whose process runs (``alive``), has exited, or whose actor never answers."""

    def __init__(self, running: bool, stuck: bool = False) -> None:
        self.running, self.stuck = running, stuck
        self.release = threading.Event()
        self.num_asked = 0

    def alive(self) -> bool:
        self.num_asked += 1
        if self.stuck:
            self.release.wait()
        return self.running

    def log_tail(self) -> str:
        return "RuntimeError: NCCL timeout on rank 2\n"

    def times_asked(self) -> int:
        return self.num_asked


@pytest.fixture(scope="module")
def local_ray() -> Iterator[None]:
    ray.init(num_cpus=1, log_to_driver=False, include_dashboard=False)
    try:
        yield
    finally:
        ray.shutdown()


def spanning(tmp_path: Path, actors: list, timeout_s: float) -> SpanningRanks:
    nodes = len(actors) + 1
    engine_args = {"tensor_parallel_size": 8 * nodes}
    model = ModelConfig(
        name="big", source="/models/big", nodes_per_replica=nodes, engine_args=engine_args
    )
    ranks = SpanningRanks(model, {}, "big#r1", "127.0.0.1", tmp_path, answer_timeout_s=timeout_s)
    ranks.actors = actors
    ranks.ranks = [
        {"rank": n + 1, "node_id": f"node{n + 1}", "node_ip": f"10.0.0.{n + 1}", "pid": 100 + n}
        for n in range(len(actors))
    ]
    return ranks


def test_ranks_that_run_are_no_failure(local_ray: None, tmp_path: Path) -> None:
    ranks = spanning(tmp_path, [RankStandIn.remote(True) for _ in range(3)], GENEROUS_S)
    assert ranks.failure() is None
    ranks.slow.count = SLOW_ANSWERS_LIMIT - 1
    assert ranks.failure() is None
    assert ranks.slow.count == 0  # an answered check starts the count again


def test_an_exited_rank_is_named_with_its_log(local_ray: None, tmp_path: Path) -> None:
    actors = [RankStandIn.remote(True), RankStandIn.remote(False)]
    problem = spanning(tmp_path, actors, GENEROUS_S).failure()
    assert problem is not None
    assert problem.startswith("rank 2 (node 10.0.0.2, pid 101) has exited")
    assert "NCCL timeout" in problem


def test_a_dead_actor_is_a_failure_at_once(local_ray: None, tmp_path: Path) -> None:
    gone = RankStandIn.remote(True)
    ray.kill(gone)
    problem = spanning(tmp_path, [RankStandIn.remote(True), gone], GENEROUS_S).failure()
    assert problem is not None and problem.startswith("rank 2 does not answer")


def test_a_silent_rank_fails_the_third_check_and_no_check_waits_for_it(
    local_ray: None, tmp_path: Path
) -> None:
    stuck = RankStandIn.remote(True, stuck=True)
    ranks = spanning(tmp_path, [RankStandIn.remote(True), stuck], timeout_s=0.5)
    for _ in range(SLOW_ANSWERS_LIMIT - 1):
        started = time.monotonic()
        assert ranks.failure() is None
        assert time.monotonic() - started < GENEROUS_S  # bounded by the timeout, not the rank
    problem = ranks.failure()
    assert problem is not None
    silent, _, why = problem.partition(" does not answer ")
    assert "2" in silent.removeprefix("rank ").split(", ")  # rank 1 too, if it answered late
    assert why == f"its checks ({SLOW_ANSWERS_LIMIT} checks of 0.5 s in a row)"
    assert ray.get(stuck.times_asked.remote(), timeout=GENEROUS_S) == 1  # waited for, not re-asked
