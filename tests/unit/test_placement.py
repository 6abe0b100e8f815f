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
    unplaceable,
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


def test_ray_executor_is_refused_pointing_at_the_default():
    with pytest.raises(ConfigError) as info:
        model(
            num_gpus=2,
            engine_args={"tensor_parallel_size": 2, "distributed_executor_backend": "ray"},
        )
    message = str(info.value)
    assert "\n" not in message
    assert "models[0]: engine_args.distributed_executor_backend 'ray' is not supported" in message
    assert "remove it (vLLM's default multiprocessing executor)" in message


def test_nodes_per_replica_must_divide_the_workers():
    with pytest.raises(ConfigError, match=r"nodes_per_replica 4 does not divide .* = 2 workers"):
        model(nodes_per_replica=4, engine_args={"tensor_parallel_size": 2})
    with pytest.raises(ConfigError, match=r"engine_args.node_rank is set by rayfleet"):
        model(nodes_per_replica=2, engine_args={"tensor_parallel_size": 2, "node_rank": 1})


def test_gpus_are_counted_per_node_of_a_spanning_replica():
    m = model(nodes_per_replica=2, num_gpus=8, engine_args={"tensor_parallel_size": 16})
    assert m.gpus_per_node_needed == 8 and replica_demand(m).gpus == 16
    with pytest.raises(ConfigError, match=r"need 8 GPU\(s\) per node .* reserves 4"):
        model(nodes_per_replica=2, num_gpus=4, engine_args={"tensor_parallel_size": 16})


def test_placement_strategy_is_gone_with_a_one_line_reason():
    with pytest.raises(ConfigError, match="placement_strategy is no longer a field"):
        model(placement_strategy="PACK")


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


def test_spanning_replica_describes_its_placement_group():
    m = model(num_cpus=2, nodes_per_replica=2, engine_args={"tensor_parallel_size": 2})
    assert describe_demand(replica_demand(m)) == (
        "a placement group (STRICT_SPREAD: each on a distinct node) of 2 bundles, one per "
        "rank: 2 x [2 CPU]; rank 0 runs the API server"
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
        "needs 6 CPU, 4 GPU on one node; free per node (2 nodes): "
        "10.0.0.0 (00nnnnnn) 0/8 GPU 52 CPU, 10.0.0.1 (01nnnnnn) 0/8 GPU 52 CPU"
    )


TP4 = {"engine_args": {"tensor_parallel_size": 4}}


def test_busy_gpus_count_against_the_fit():
    cluster = nodes(2, 8)
    cluster[0].available["GPU"] = 3
    fits = fit_replicas(fleet_demands(fleet(replicas=2, num_gpus=4, **TP4).models), cluster)
    assert [f.nodes for f in fits] == [(cluster[1].node_id,), (cluster[1].node_id,)]


def test_a_spanning_replica_takes_one_bundle_on_each_of_distinct_nodes():
    m = model(
        num_cpus=10,
        num_gpus=8,
        nodes_per_replica=2,
        engine_args={"tensor_parallel_size": 8, "pipeline_parallel_size": 2},
    )
    cluster = nodes(3, 8)
    first, second = fit_replicas(fleet_demands([m, m]), cluster)
    assert first.nodes == (cluster[0].node_id, cluster[1].node_id)
    assert resources_by_node(replica_demand(m), first) == {
        cluster[0].node_id: {"CPU": 10, "GPU": 8},
        cluster[1].node_id: {"CPU": 10, "GPU": 8},
    }
    assert not second.placed  # one node with 8 GPUs left: a second replica needs two
    assert second.reason.startswith(
        "spans 2 nodes: needs 10 CPU, 8 GPU on each of 2 distinct nodes; free per node (3 nodes):"
    )


def test_unplaceable_names_a_shape_no_idle_cluster_holds():
    m = model(nodes_per_replica=2, engine_args={"tensor_parallel_size": 2})
    busy = nodes(1, 0)
    busy[0].available["CPU"] = 0
    fit = unplaceable(fleet_demands([m]), busy)
    assert fit is not None and fit.model == "m"
    assert fit.reason.startswith("spans 2 nodes: needs 1 CPU on each of 2 distinct nodes")
    assert unplaceable(fleet_demands([m]), nodes(2, 0)) is None
    small = model(num_cpus=2)
    assert unplaceable(fleet_demands([small]), busy) is None  # busy now, fits when idle


# -- which GPUs the vLLM server sees


def test_gpu_env_names_exactly_the_assigned_gpus_in_order():
    assert gpu_env(["3", "1"]) == {"CUDA_VISIBLE_DEVICES": "1,3"}
    assert gpu_env([10, 2]) == {"CUDA_VISIBLE_DEVICES": "2,10"}
    assert gpu_env(["GPU-b", "GPU-a"]) == {"CUDA_VISIBLE_DEVICES": "GPU-a,GPU-b"}


def test_no_gpus_leaves_the_environment_as_it_is():
    assert gpu_env([]) == {}


def test_a_simulated_engine_takes_no_engine_args_and_no_gpu():
    from rayfleet.control.engine import simulator_argv

    m = model(engine="sim", source="/specs/tiny.json")
    assert m.engine == "sim" and replica_demand(m).gpus == 0
    with pytest.raises(ConfigError, match="engine sim takes no engine_args"):
        model(engine="sim", engine_args={"max_model_len": 8})
    with pytest.raises(ConfigError, match="engine sim runs on one node with no GPU"):
        model(engine="sim", num_gpus=1)
    argv = simulator_argv("/specs/tiny.json", "m", "127.0.0.1", 9000)
    assert argv[1:4] == ["-m", "rayfleet.sim", "serve"]
    assert argv[-2:] == ["--spec", "/specs/tiny.json"]
    assert "--spec" not in simulator_argv("sim", "m", "127.0.0.1", 9000)
