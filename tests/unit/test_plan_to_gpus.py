"""From plan to GPUs: what ``rayfleet plan --emit`` writes starts on the hardware it was
planned for. For every public deployment of the reality table (a row that does not fit is
planned on its smallest fit), the emitted entry validates, and its replicas placed on
N nodes x G GPUs reserve exactly the planned GPUs, none twice."""

from __future__ import annotations

import shlex
import sys
from dataclasses import replace
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from rayfleet.cli import app
from rayfleet.config import parse_fleet
from rayfleet.control.placement import (
    GIB,
    NodeResources,
    fit_replicas,
    fleet_demands,
    resources_by_node,
)
from rayfleet.errors import ConfigError
from rayfleet.planner.fleet_entry import render_fleet_entry
from rayfleet.planner.hardware import Hardware
from rayfleet.planner.layout import Workload
from rayfleet.planner.memory import MemorySettings
from rayfleet.planner.model_spec import load_model_spec
from rayfleet.planner.plan import Plan, make_plan
from tests.unit.test_planner_deployments import DEPLOYMENTS, FIXTURES

GPU_NODE_CPUS = 128
GPU_NODE_MEMORY_GIB = 1024


def planned(model: str, quantization: str | None, hardware: Hardware, context: int) -> Plan:
    spec = load_model_spec(str(FIXTURES / model), quantization=quantization)
    plan = make_plan(spec, hardware, Workload(context_len=context), MemorySettings())
    if plan.fits:
        return plan
    fit = plan.smallest_fit
    assert fit is not None
    bigger = replace(hardware, nodes=fit.nodes, gpus_per_node=fit.gpus_per_node)
    return make_plan(spec, bigger, Workload(context_len=context), MemorySettings())


def gpu_nodes(hardware: Hardware) -> list[NodeResources]:
    total = {
        "CPU": float(GPU_NODE_CPUS),
        "GPU": float(hardware.gpus_per_node),
        "memory": GPU_NODE_MEMORY_GIB * GIB,
    }
    return [
        NodeResources(f"node{i}".ljust(56, "0"), f"10.0.0.{i}", dict(total), dict(total))
        for i in range(hardware.nodes)
    ]


@pytest.mark.parametrize(
    ("model", "quantization", "nodes", "gpus", "gib", "context"),
    [d[:6] for d in DEPLOYMENTS],
    ids=[f"{d[0]}-{d[1] or 'ckpt'}-{d[2]}x{d[3]}x{d[4]}G-{d[5]}" for d in DEPLOYMENTS],
)
def test_emitted_entry_reserves_the_planned_gpus_once(
    model, quantization, nodes, gpus, gib, context
):
    hardware = Hardware(gpus_per_node=gpus, gpu_memory_gib=gib, nodes=nodes, inter_node_gbps=100)
    plan = planned(model, quantization, hardware, context)
    layout = plan.chosen
    assert layout is not None
    text = render_fleet_entry(plan, command="rayfleet plan ...")
    assert text.startswith(f"# rayfleet plan: {plan.verdict}\n# made by: rayfleet plan ...\n")
    fleet = parse_fleet(yaml.safe_load(text), origin="emitted")
    entry = fleet.models[0]
    assert entry.gpu_engine
    assert not Path(entry.source).is_file()  # the model directory, not its config.json

    cluster = gpu_nodes(plan.hardware)
    demands = fleet_demands(fleet.models)
    fits = fit_replicas(demands, cluster)
    assert all(f.placed for f in fits), [f.reason for f in fits if not f.placed]
    reserved = {n.node_id: 0.0 for n in cluster}
    for demand, fit in zip(demands, fits, strict=True):
        assert demand.gpus == layout.gpus_per_replica
        for node_id, taken in resources_by_node(demand, fit).items():
            reserved[node_id] += taken.get("GPU", 0.0)
    assert sum(reserved.values()) == plan.replicas * layout.gpus_per_replica
    assert all(r <= plan.hardware.gpus_per_node for r in reserved.values())


SEVENTY_B = [
    str(FIXTURES / "llama-3.1-70b" / "config.json"),
    "--gpus-per-node",
    "8",
    "--gpu-memory-gib",
    "80",
    "--nodes",
    "2",
]


def test_70b_on_two_8_gpu_nodes_emits_the_directory_and_4_gpus(tmp_path, monkeypatch):
    out = tmp_path / "fleet.yaml"
    argv = ["plan", *SEVENTY_B, "--emit", str(out)]
    monkeypatch.setattr(sys, "argv", ["/venv/bin/rayfleet", *argv])  # as a shell runs it
    result = CliRunner().invoke(app, argv)
    assert result.exit_code == 0, result.output
    text = out.read_text()
    assert text.startswith("# rayfleet plan: Fits on 2 node(s) x 8 GPU(s) of 80 GiB: TP=4")
    assert f"\n# made by: {shlex.join(['rayfleet', *argv])}\n" in text
    data = yaml.safe_load(text)
    entry = data["models"][0]
    assert entry["source"] == str(FIXTURES.resolve() / "llama-3.1-70b")
    assert entry["num_gpus"] == 4
    assert entry["replicas"] == 4
    assert "placement_strategy" not in entry  # one actor per replica: no placement group
    assert parse_fleet(data).models[0].num_gpus == 4

    entry["num_gpus"] = 0
    with pytest.raises(ConfigError) as info:
        parse_fleet(data, origin=str(out))
    assert str(info.value) == (
        f"{out}: models[0]: engine_args need 4 GPU(s) per node (tensor_parallel_size 4 x "
        "pipeline_parallel_size 1) but num_gpus reserves 0; set num_gpus: 4, or "
        "accelerator: cpu for vLLM's CPU build"
    )
