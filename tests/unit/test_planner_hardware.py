"""Reading hardware from what a Ray cluster and the doctor report (parsing only; no Ray)."""

from __future__ import annotations

import json

import pytest

from rayfleet.doctor.probe import parse_nvidia_smi
from rayfleet.errors import ConfigError, RayfleetError
from rayfleet.planner.hardware import (
    Hardware,
    hardware_from_nodes,
    read_network_gbps,
    smallest_gpu_memory_gib,
)

FLAGS = Hardware(gpus_per_node=1, gpu_memory_gib=0.0, inter_node_gbps=100)


def node(node_id: str, gpus: float = 0, alive: bool = True, accelerator: str | None = None):
    """A record shaped like one entry of ``ray.nodes()``."""
    resources = {"CPU": 16.0, "memory": 1e11, f"node:10.0.0.{len(node_id)}": 1.0}
    if gpus:
        resources["GPU"] = gpus
    if accelerator:
        resources[f"accelerator_type:{accelerator}"] = 1.0
    return {"NodeID": node_id, "Alive": alive, "Resources": resources}


def write_network(path, speeds):
    pairs = [
        {
            "src_node": "a",
            "dst_node": "b",
            "src_ip": "10.0.0.1",
            "dst_ip": "10.0.0.2",
            "gbps": gbps,
            "rtt_ms": 0.2,
        }
        for gbps in speeds
    ]
    path.write_text(json.dumps({"measured_at": "2025-01-01T00:00:00Z", "pairs": pairs}))


def test_network_takes_the_slowest_pair(tmp_path):
    path = tmp_path / "network.json"
    write_network(path, [48.5, 12.3, 90.0])
    assert read_network_gbps(path) == 12.3
    assert read_network_gbps(tmp_path / "absent.json") is None


def test_broken_network_file_names_the_file_and_field(tmp_path):
    path = tmp_path / "network.json"
    path.write_text(json.dumps({"pairs": [{"src_node": "a"}]}))
    with pytest.raises(ConfigError, match=r"network\.json: field 'pairs\[\]\.gbps'"):
        read_network_gbps(path)


def test_nodes_with_gpus_and_measured_link():
    nodes = [
        node("head"),
        node("w1", 8, accelerator="H100"),
        node("w2", 8, accelerator="H100"),
        node("gone", 8, alive=False),
    ]
    hw = hardware_from_nodes(nodes, {"w1": 79.6, "w2": 79.6}, 24.0, FLAGS)
    assert (hw.nodes, hw.gpus_per_node, hw.gpu_memory_gib, hw.inter_node_gbps) == (2, 8, 79.6, 24.0)
    assert any("H100" in note for note in hw.notes)
    assert any("slowest pair" in note for note in hw.notes)


def test_mixed_nodes_are_planned_as_the_smallest():
    nodes = [node("a", 8), node("b", 4)]
    hw = hardware_from_nodes(nodes, {"a": 80.0, "b": 40.0}, None, FLAGS)
    assert (hw.gpus_per_node, hw.gpu_memory_gib, hw.inter_node_gbps) == (4, 40.0, 100)
    assert any("no doctor measurement" in note for note in hw.notes)


def test_no_gpus_is_a_clear_answer():
    with pytest.raises(RayfleetError, match="no GPUs in this cluster"):
        hardware_from_nodes([node("head"), node("w1")], {}, None, FLAGS)


def test_unreadable_gpu_memory_falls_back_to_the_flag_or_asks_for_it():
    nodes = [node("a", 2)]
    with pytest.raises(RayfleetError, match="pass --gpu-memory-gib"):
        hardware_from_nodes(nodes, {"a": None}, None, FLAGS)
    flagged = Hardware(gpus_per_node=1, gpu_memory_gib=24.0)
    hw = hardware_from_nodes(nodes, {"a": None}, None, flagged)
    assert hw.gpu_memory_gib == 24.0
    assert any("from --gpu-memory-gib" in note for note in hw.notes)


def test_gpu_memory_from_the_doctors_nvidia_smi_reading():
    rows = "0, NVIDIA H100 80GB HBM3, GPU-a, 81559\n1, NVIDIA H100 80GB HBM3, GPU-b, 81559\n"
    reading = {"found": True, "gpus": parse_nvidia_smi(rows), "error": None}
    assert smallest_gpu_memory_gib(reading) == pytest.approx(79.647, abs=0.001)
    assert smallest_gpu_memory_gib({"found": False, "gpus": [], "error": None}) is None
    unknown = parse_nvidia_smi("0, NVIDIA H100 80GB HBM3, GPU-a, [N/A]\n")
    assert smallest_gpu_memory_gib({"found": True, "gpus": unknown, "error": None}) is None
