"""Replicas that span nodes, for real: a Ray cluster of raylets on this machine (Ray's
cluster utilities), the tiny model with tensor parallelism 2 over two of them through
vLLM's multi-node launch (rank 0 the API server, rank 1 headless), served through the
gateway, killed rank by rank, and refused where the cluster cannot hold it.

Pipeline parallelism across nodes does not run on vLLM's CPU build (the second stage
asserts on its intermediate tensors); its arguments and placement are unit-tested
(tests/unit/test_control.py, tests/unit/test_placement.py).
"""

from __future__ import annotations

import os
import signal
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest
import ray
from ray.cluster_utils import Cluster

from tests.integration.fleet import (
    RunningFleet,
    model_entry,
    one_cpu_raylets,
    running_fleet,
    wait_until,
)

pytestmark = pytest.mark.integration

PROMPTS = ["The capital of France is", "One, two, three,", "def main():"]
TP2_ARGS = {"enforce_eager": True, "max_model_len": 1024, "dtype": "float32"}
RECOVERY_TIMEOUT_S = 600


def spanning_model(tiny_model: Path, **fields: Any) -> dict[str, Any]:
    engine_args = {**TP2_ARGS, "tensor_parallel_size": 2}
    return model_entry("tiny", tiny_model, engine_args, replicas=1, nodes_per_replica=2, **fields)


@pytest.fixture(scope="module")
def raylets() -> Iterator[Cluster]:
    """A head and one worker raylet: two Ray nodes, one CPU each."""
    with one_cpu_raylets() as cluster:
        yield cluster


@pytest.fixture(scope="module")
def spanning_fleet(
    raylets: Cluster, tiny_model: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[RunningFleet]:
    home = tmp_path_factory.mktemp("multinode")
    cluster = {"address": raylets.address}
    with running_fleet(home, [spanning_model(tiny_model)], cluster=cluster) as fleet:
        yield fleet


def greedy(client: Any, model: str) -> list[str]:
    return [
        client.completions.create(model=model, prompt=p, max_tokens=16, temperature=0)
        .choices[0]
        .text
        for p in PROMPTS
    ]


def only_replica(fleet: RunningFleet) -> dict[str, Any]:
    (replica,) = fleet.status()["replicas"]
    return replica


def process_tree(pid: int) -> list[int]:
    root = psutil.Process(pid)
    return [root.pid, *(p.pid for p in root.children(recursive=True))]


def running(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def test_two_node_replica_serves_what_one_process_serves(spanning_fleet, vllm_tiny):
    import openai

    direct = openai.OpenAI(base_url=vllm_tiny.url + "/v1", api_key="unused", max_retries=0)
    client = spanning_fleet.client()
    assert greedy(client, "tiny") == greedy(direct, "tiny")
    chat = client.chat.completions.create(
        model="tiny", messages=[{"role": "user", "content": "hello"}], max_tokens=8
    )
    assert chat.choices[0].message.content and chat.usage.completion_tokens > 0
    stream = client.completions.create(model="tiny", prompt="hi", max_tokens=8, stream=True)
    assert sum(len(c.choices[0].text) for c in stream if c.choices) > 0


def test_status_shows_each_rank_on_its_own_raylet(spanning_fleet):
    replica = only_replica(spanning_fleet)
    ranks = replica["ranks"]
    assert [r["rank"] for r in ranks] == [0, 1]
    assert len({r["node_id"] for r in ranks}) == 2
    assert ranks[0]["pid"] == replica["pid"]
    assert all(running(r["pid"]) for r in ranks)
    shown = spanning_fleet.cli("status").stdout
    assert "rank 1" in shown and ranks[1]["node_id"][:8] in shown


def test_killing_rank_1_replaces_the_whole_replica(spanning_fleet):
    before = only_replica(spanning_fleet)
    trees = {pid for rank in before["ranks"] for pid in process_tree(rank["pid"])}
    os.kill(before["ranks"][1]["pid"], signal.SIGKILL)

    def replaced() -> dict[str, Any] | None:
        replicas = spanning_fleet.status()["replicas"]
        fresh = [r for r in replicas if r["replica_id"] != before["replica_id"]]
        return fresh[0] if len(replicas) == 1 and fresh else None

    after = wait_until(replaced, RECOVERY_TIMEOUT_S, poll_s=1.0)
    assert after is not None, "the replica was not replaced after its rank 1 died"
    assert {r["pid"] for r in after["ranks"]}.isdisjoint(trees)
    client = spanning_fleet.client()
    text = client.completions.create(model="tiny", prompt="hi", max_tokens=4, temperature=0)
    assert text.choices[0].text
    # Every process of the old replica, on both nodes, is gone (no orphans).
    leftover = wait_until(lambda: not any(running(p) for p in trees), 60)
    assert leftover, f"processes of the replaced replica still run: {sorted(trees)}"


@ray.remote(num_cpus=1)
class CpuHolder:
    def ready(self) -> bool:
        return True


def test_a_cluster_of_one_node_is_refused_at_once(tiny_model, tmp_path):
    home = tmp_path / "one-node"
    home.mkdir()
    with (
        pytest.raises(AssertionError) as info,
        running_fleet(home, [spanning_model(tiny_model)]),
    ):
        pass
    message = str(info.value)
    assert "model 'tiny' cannot be placed on this Ray cluster even when it is idle" in message
    assert "spans 2 nodes: needs 1 CPU on each of 2 distinct nodes" in message
    assert "lower nodes_per_replica (2)" in message


def test_a_busy_cluster_fails_at_the_placement_deadline(tiny_model, tmp_path):
    """Room in total but none free (an actor holds each node's CPU): the placement group
    stays PENDING, and `rayfleet up` fails at the deadline with Ray's state of it."""
    busy = Cluster(initialize_head=True, head_node_args={"num_cpus": 1})
    try:
        busy.add_node(num_cpus=1)
        busy.wait_for_nodes()
        ray.init(address=busy.address, log_to_driver=False)
        holders = [CpuHolder.remote() for _ in range(2)]
        ray.get([h.ready.remote() for h in holders], timeout=120)
        home = tmp_path / "busy"
        home.mkdir()
        cluster = {"address": busy.address, "placement_timeout_s": 5}
        with (
            pytest.raises(AssertionError) as info,
            running_fleet(home, [spanning_model(tiny_model)], cluster=cluster),
        ):
            pass
    finally:
        ray.shutdown()
        busy.shutdown()
    message = str(info.value)
    assert "model 'tiny': 1 replica placement group(s) still PENDING after" in message
    assert "each needs 2 x [1 CPU], STRICT_SPREAD" in message
