"""``rayfleet up --dry-run --address``: the fit report against a real Ray cluster of three
raylets on this machine (two of them declaring 4 GPUs each, one GPU held by a running
actor), compared with what Ray itself reports free. Nothing of the fleet starts."""

from __future__ import annotations

import time

import pytest
import ray
from ray.cluster_utils import Cluster
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy
from typer.testing import CliRunner

from rayfleet.cli import app
from rayfleet.cluster import node_resources
from rayfleet.config import load_fleet
from rayfleet.control.lifecycle import fit_on_cluster

pytestmark = pytest.mark.integration

FLEET = """
cluster: {address: auto}
models:
  - name: big
    source: /models/big
    replicas: 3
    num_cpus: 2
    num_gpus: 4
    engine_args: {tensor_parallel_size: 4}
"""


@ray.remote(num_cpus=0, num_gpus=1)
class Holder:
    def ready(self) -> bool:
        return True


@pytest.fixture(scope="module")
def gpu_cluster():
    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 1})
    try:
        first = cluster.add_node(num_cpus=8, num_gpus=4)
        second = cluster.add_node(num_cpus=8, num_gpus=4)
        cluster.wait_for_nodes()
        ray.init(address=cluster.address, log_to_driver=False)
        holder = Holder.options(
            scheduling_strategy=NodeAffinitySchedulingStrategy(second.node_id, soft=False)
        ).remote()
        ray.get(holder.ready.remote(), timeout=60)
        _wait_free_gpus(second.node_id, 3.0)
        yield {"cluster": cluster, "first": first.node_id, "second": second.node_id}
    finally:
        ray.shutdown()
        cluster.shutdown()


def _wait_free_gpus(node_id: str, gpus: float, timeout_s: float = 30.0) -> None:
    """Ray's per-node view of free resources is reported asynchronously."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        free = {n["node_id"]: n["available"].get("GPU", 0.0) for n in node_resources()}
        if free.get(node_id) == gpus:
            return
        time.sleep(0.1)
    raise AssertionError(f"node {node_id} never showed {gpus} free GPUs: {free}")


def test_fit_report_matches_the_clusters_free_gpus(gpu_cluster, tmp_path):
    path = tmp_path / "fleet.yaml"
    path.write_text(FLEET)
    fit = fit_on_cluster(load_fleet(path), gpu_cluster["cluster"].address)
    by_id = {n.node_id: n for n in fit.nodes}
    first, second = by_id[gpu_cluster["first"]], by_id[gpu_cluster["second"]]
    assert (first.total["GPU"], first.available["GPU"]) == (4, 4)
    assert (second.total["GPU"], second.available["GPU"]) == (4, 3)  # one GPU held
    placed, *unplaced = fit.fits
    assert placed.nodes == (first.node_id,)
    assert [f.placed for f in unplaced] == [False, False]
    assert "needs 2 CPU, 4 GPU on one node" in unplaced[0].reason
    assert f"{second.label} 3/4 GPU" in unplaced[0].reason
    assert f"{first.label} 0/4 GPU" in unplaced[0].reason


def test_dry_run_with_address_prints_where_replicas_fit(gpu_cluster, tmp_path):
    path = tmp_path / "fleet.yaml"
    path.write_text(FLEET)
    address = gpu_cluster["cluster"].address
    result = CliRunner().invoke(app, ["up", "--dry-run", "-c", str(path), "--address", address])
    assert result.exit_code == 0, result.output
    out = result.output
    assert "placement per replica: one actor on one node (no placement group): 2 CPU, 4 GPU" in out
    assert f"Ray cluster at {address}: 3 node(s)" in out
    assert "model 'big' replica 0: fits on" in out
    assert "model 'big' replica 1: cannot be placed: needs 2 CPU, 4 GPU on one node" in out
    assert "1 of 3 replica(s) fit the cluster's free resources; 2 cannot be placed" in out
