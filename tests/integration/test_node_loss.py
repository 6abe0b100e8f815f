"""A whole worker node lost under load: a Ray cluster of raylets on this machine (Ray's
cluster utilities), one replica of the tiny model on the head and one on a worker. The
worker's raylet is removed while streams and plain requests run, as a machine that dies
takes its raylet, the replica actor and (through the parent-death signal) its vLLM
server with it; a new worker joins, as a cluster's autoscaler would add one. No plain
request fails, only streams in flight on the lost node may end early, and the model is
back at two serving replicas by itself."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest
from ray.cluster_utils import Cluster

from tests.integration.fleet import (
    RunningFleet,
    model_entry,
    one_cpu_raylets,
    running_fleet,
    wait_until,
)
from tests.integration.load import StreamLoad

pytestmark = pytest.mark.integration

RECOVERY_TIMEOUT_S = 600
NUM_STREAMS = 4


@pytest.fixture(scope="module")
def raylets() -> Iterator[Cluster]:
    """A head and one worker raylet, one CPU each: each holds one replica."""
    with one_cpu_raylets() as cluster:
        yield cluster


@pytest.fixture(scope="module")
def two_node_fleet(
    raylets: Cluster, tiny_model: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[RunningFleet]:
    home = tmp_path_factory.mktemp("node-loss")
    models = [model_entry("tiny", tiny_model, replicas=2)]
    with running_fleet(home, models, cluster={"address": raylets.address}) as fleet:
        yield fleet


def serving(fleet: RunningFleet) -> list[dict[str, Any]] | None:
    now = [r for r in fleet.status()["replicas"] if r["model"] == "tiny"]
    ok = [r for r in now if r["healthy"] and not r["draining"]]
    return now if len(now) == len(ok) == 2 else None


def test_a_lost_node_costs_no_unanswered_request(raylets: Cluster, two_node_fleet: RunningFleet):
    fleet = two_node_fleet
    before = wait_until(lambda: serving(fleet), RECOVERY_TIMEOUT_S, poll_s=1.0)
    assert before is not None
    (worker,) = raylets.worker_nodes
    (victim,) = [r for r in before if r["node_id"] == worker.node_id]
    with StreamLoad(fleet.client(), "tiny", num_streams=NUM_STREAMS, max_tokens=96) as load:
        wait_until(lambda: load.completed >= 4, 120)
        raylets.remove_node(worker, allow_graceful=False)
        assert wait_until(lambda: not psutil.pid_exists(victim["pid"]), 60, poll_s=0.5), (
            "the lost node's vLLM server outlived its replica"
        )
        raylets.add_node(num_cpus=1)  # a replacement machine joins
        after = wait_until(
            lambda: (now := serving(fleet)) and victim["pid"] not in {r["pid"] for r in now},
            RECOVERY_TIMEOUT_S,
            poll_s=1.0,
        )
        assert after, f"the lost node's replica was not replaced: {fleet.status()['replicas']}"
        done = load.completed
        assert wait_until(lambda: load.completed >= done + 4, 120)  # served again after
    assert load.plain_failures == [], load.plain_failures
    # Only streams in flight on the lost node may end early.
    assert len(load.stream_failures) + load.unfinished <= NUM_STREAMS
