"""``--from-cluster`` against a real local Ray cluster (several raylets on this machine)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from ray.cluster_utils import Cluster

from rayfleet.errors import RayfleetError
from rayfleet.planner.hardware import Hardware, read_cluster

pytestmark = pytest.mark.integration

FLAGS = Hardware(gpus_per_node=1, gpu_memory_gib=80.0, inter_node_gbps=100.0)


@pytest.fixture
def cluster():
    c = Cluster(initialize_head=True, head_node_args={"num_cpus": 1})
    try:
        yield c
    finally:
        c.shutdown()


def test_cpu_only_cluster_has_no_gpus(cluster, tmp_path):
    with pytest.raises(RayfleetError, match="no GPUs in this cluster"):
        read_cluster(cluster.address, FLAGS, network_path=tmp_path / "network.json")


def test_gpu_nodes_and_doctor_bandwidth_are_read(cluster, tmp_path: Path):
    # Ray advertises GPU resources as declared; this machine has no nvidia-smi, so the
    # GPU memory falls back to the flag, and the notes say so.
    cluster.add_node(num_cpus=1, num_gpus=4)
    cluster.add_node(num_cpus=1, num_gpus=4)
    cluster.wait_for_nodes()
    network = tmp_path / "network.json"
    network.write_text(
        json.dumps(
            {
                "measured_at": "2025-01-01T00:00:00Z",
                "pairs": [
                    {
                        "src_node": "a",
                        "dst_node": "b",
                        "src_ip": "127.0.0.1",
                        "dst_ip": "127.0.0.1",
                        "gbps": 9.5,
                        "rtt_ms": 0.1,
                    }
                ],
            }
        )
    )
    hw = read_cluster(cluster.address, FLAGS, network_path=network)
    assert (hw.nodes, hw.gpus_per_node, hw.inter_node_gbps) == (2, 4, 9.5)
    assert hw.gpu_memory_gib == 80.0
    assert any("from --gpu-memory-gib" in note for note in hw.notes)
