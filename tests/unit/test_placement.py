"""What a replica asks Ray for, where it fits, and which GPUs its vLLM server sees:
control/placement.py and the GPU rules of fleet.yaml, without Ray."""

from __future__ import annotations

import pytest

from rayfleet.config import parse_fleet
from rayfleet.control.placement import (
    GIB,
    NodeResources,
    describe_demand,
    fit_replicas,
    fleet_demands,
    gpu_env,
    replica_demand,
    resources_by_node,
)
from rayfleet.control.replica import deployment_options
from rayfleet.errors import ConfigError


def model(**fields):
    return fleet(**fields).models[0]


def fleet(**fields):
    return parse_fleet({"models": [{"name": "m", "source": "/models/m", **fields}]})


def nodes(count: int, gpus: float, cpus: float = 64, gib: float = 512) -> list[NodeResources]:
    total = {"CPU": cpus, "GPU": gpus, "memory": gib * GIB}
    return [
        NodeResources(f"{i:02d}" + "n" * 54, f"10.0.0.{i}", dict(total), dict(total))
        for i in range(count)
    ]


def tp(size: int, **fields):
    return model(engine_args={"tensor_parallel_size": size}, **fields)


# -- fleet.yaml: a GPU engine reserves what its engine arguments use, per node


def test_gpu_engine_without_gpus_is_refused_in_one_line_with_the_fix():
    with pytest.raises(ConfigError) as info:
        tp(4, accelerator="gpu", num_gpus=0)
    message = str(info.value)
    assert "\n" not in message
    assert "need 4 GPU(s) per node" in message and "reserves 0" in message
    assert "set num_gpus: 4" in message


def test_fewer_gpus_than_tp_x_pp_is_refused():
    with pytest.raises(
        ConfigError, match=r"need 4 GPU\(s\) per node .* reserves 2; set num_gpus: 4"
    ):
        model(num_gpus=2, engine_args={"tensor_parallel_size": 2, "pipeline_parallel_size": 2})


def test_a_fraction_of_a_gpu_with_tp_above_one_is_refused():
    with pytest.raises(ConfigError, match=r"num_gpus 0.5 is a fraction .* needs 2 whole GPUs"):
        tp(2, num_gpus=0.5)


def test_cpu_engines_and_fractional_single_gpu_replicas_stay_valid():
    assert not tp(2).gpu_engine  # vLLM's CPU build runs TP with its multiprocessing executor
    assert model(num_gpus=0.5).gpu_engine
    assert tp(4, num_gpus=4).gpus_per_node_needed == 4
    with pytest.raises(ConfigError, match="accelerator is cpu but num_gpus is 1"):
        model(accelerator="cpu", num_gpus=1)


def test_ray_executor_engines_hold_their_gpus_in_bundles():
    m = model(
        engine_args={
            "tensor_parallel_size": 8,
            "pipeline_parallel_size": 2,
            "distributed_executor_backend": "ray",
        }
    )
    assert m.gpu_engine and m.num_gpus == 0
    assert replica_demand(m).gpus == 16


# -- what a replica asks Ray for


def test_one_node_replica_is_one_actor_with_cpu_gpu_and_memory():
    m = tp(4, num_gpus=4, num_cpus=6, memory_gib=24)
    demand = replica_demand(m)
    assert demand.strategy is None
    assert demand.bundles == ({"CPU": 6, "GPU": 4, "memory": 24 * GIB},)
    assert describe_demand(demand) == (
        "one actor on one node (no placement group): 6 CPU, 4 GPU, 24 GiB memory"
    )
    options = deployment_options(m)["ray_actor_options"]
    assert options == {"num_cpus": 6, "num_gpus": 4, "memory": 24 * GIB}


def test_cpu_replica_options_are_unchanged():
    assert deployment_options(model(num_cpus=1))["ray_actor_options"] == {
        "num_cpus": 1,
        "num_gpus": 0,
    }


def test_ray_executor_replica_describes_its_placement_group():
    m = model(
        num_cpus=2,
        placement_strategy="PACK",
        engine_args={"tensor_parallel_size": 2, "distributed_executor_backend": "ray"},
    )
    assert describe_demand(replica_demand(m)) == (
        "a placement group (PACK: packed onto as few nodes as possible) of 3 bundles: "
        "[2 CPU] for the replica + 2 x [1 GPU] for the engine workers"
    )


# -- where replicas fit


def test_one_node_replicas_fill_nodes_first_fit_and_never_share_a_gpu():
    demands = fleet_demands(fleet(replicas=5, num_gpus=4, num_cpus=6, **TP4).models)
    first, second = (n.node_id for n in nodes(2, 8))
    fits = fit_replicas(demands, nodes(2, 8))
    assert [f.nodes for f in fits[:4]] == [(first,), (first,), (second,), (second,)]
    last = fits[4]
    assert not last.placed
    assert last.reason == (
        "needs 6 CPU, 4 GPU on one node; free per node: "
        "10.0.0.0 (00nnnnnn) 0/8 GPU 52 CPU, 10.0.0.1 (01nnnnnn) 0/8 GPU 52 CPU"
    )


TP4 = {"engine_args": {"tensor_parallel_size": 4}}


def test_busy_gpus_count_against_the_fit():
    cluster = nodes(2, 8)
    cluster[0].available["GPU"] = 3
    fits = fit_replicas(fleet_demands(fleet(replicas=2, num_gpus=4, **TP4).models), cluster)
    assert [f.nodes for f in fits] == [(cluster[1].node_id,), (cluster[1].node_id,)]


def test_pack_spans_nodes_only_when_one_node_cannot_hold_the_group():
    m = model(
        num_cpus=2,
        engine_args={
            "tensor_parallel_size": 8,
            "pipeline_parallel_size": 2,
            "distributed_executor_backend": "ray",
        },
    )
    cluster = nodes(2, 8)
    (fit,) = fit_replicas([replica_demand(m)], cluster)
    per_node = resources_by_node(replica_demand(m), fit)
    assert per_node == {
        cluster[0].node_id: {"CPU": 2, "GPU": 8},
        cluster[1].node_id: {"GPU": 8},
    }
    (one_node,) = fit_replicas([replica_demand(m)], nodes(1, 16))
    assert set(one_node.nodes or ()) == {nodes(1, 16)[0].node_id}


@pytest.mark.parametrize(("strategy", "used"), [("STRICT_PACK", 1), ("PACK", 1), ("SPREAD", 2)])
def test_strategies_place_a_group_as_ray_would(strategy, used):
    m = model(
        placement_strategy=strategy,
        engine_args={"tensor_parallel_size": 2, "distributed_executor_backend": "ray"},
    )
    (fit,) = fit_replicas([replica_demand(m)], nodes(2, 8))
    assert len(set(fit.nodes or ())) == used


def test_strict_pack_refuses_what_only_fits_across_nodes():
    m = model(
        placement_strategy="STRICT_PACK",
        engine_args={"tensor_parallel_size": 8, "distributed_executor_backend": "ray"},
    )
    (fit,) = fit_replicas([replica_demand(m)], nodes(2, 4))
    assert not fit.placed
    assert fit.reason.startswith("needs 1 CPU, 8 GPU on one node; free per node:")


# -- which GPUs the vLLM server sees


def test_gpu_env_names_exactly_the_assigned_gpus_in_order():
    assert gpu_env(["3", "1"]) == {"CUDA_VISIBLE_DEVICES": "1,3"}
    assert gpu_env([10, 2]) == {"CUDA_VISIBLE_DEVICES": "2,10"}
    assert gpu_env(["GPU-b", "GPU-a"]) == {"CUDA_VISIBLE_DEVICES": "GPU-a,GPU-b"}


def test_no_gpus_leaves_the_environment_as_it_is():
    assert gpu_env([]) == {}
