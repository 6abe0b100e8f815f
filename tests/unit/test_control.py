"""Control-plane pieces that need no Ray: engine command lines, placement, core spreading,
the dry run and stopping a fleet process."""

from __future__ import annotations

import subprocess
import sys
import time

import psutil

from rayfleet.config import parse_fleet
from rayfleet.control.engine import headless_argv, server_argv
from rayfleet.control.engine_args import engine_argv
from rayfleet.control.headless import parse_headless_args
from rayfleet.control.placement import placement_bundles
from rayfleet.control.ranks import rank_engine_args, socket_ifname_problem
from rayfleet.control.registry import pick_core
from rayfleet.control.replica import deployment_options


def model(**fields):
    return parse_fleet({"models": [{"name": "m", "source": "/models/m", **fields}]}).models[0]


def test_engine_argv_passes_values_unchanged():
    argv = engine_argv(
        {
            "max_model_len": 512,
            "enforce_eager": True,
            "enable_prefix_caching": False,
            "tensor_parallel_size": 2,
            "quantization": None,
            "override_generation_config": {"temperature": 0.5},
        }
    )
    assert argv == [
        "--max-model-len",
        "512",
        "--enforce-eager",
        "--no-enable-prefix-caching",
        "--tensor-parallel-size",
        "2",
        "--override-generation-config",
        '{"temperature": 0.5}',
    ]


def test_server_argv_sets_identity_flags():
    argv = server_argv("/models/m", "m", {"dtype": "float32"}, "127.0.0.1", 8123)
    assert argv[:3] == [sys.executable, "-m", "vllm.entrypoints.openai.api_server"]
    assert argv[3:] == [
        "--model",
        "/models/m",
        "--served-model-name",
        "m",
        "--host",
        "127.0.0.1",
        "--port",
        "8123",
        "--dtype",
        "float32",
    ]


def test_single_node_replica_has_no_placement_group():
    options = deployment_options(model(replicas=3, num_cpus=2, num_gpus=1))
    assert options["num_replicas"] == 3
    assert options["ray_actor_options"] == {"num_cpus": 2, "num_gpus": 1}
    assert "placement_group_bundles" not in options


def test_multi_node_replica_gets_one_bundle_per_node_strictly_spread():
    m = model(
        nodes_per_replica=2,
        num_cpus=10,
        num_gpus=8,
        engine_args={"tensor_parallel_size": 8, "pipeline_parallel_size": 2},
    )
    bundles = placement_bundles(m)
    assert bundles == [{"CPU": 10, "GPU": 8}, {"CPU": 10, "GPU": 8}]
    options = deployment_options(m)
    assert options["placement_group_bundles"] == bundles
    assert options["placement_group_strategy"] == "STRICT_SPREAD"
    # The replica actor is rank 0: it takes the whole first bundle, its GPUs included.
    assert options["ray_actor_options"] == {"num_cpus": 10, "num_gpus": 8}


def test_rank_engine_args_add_vllms_multi_node_flags():
    args = rank_engine_args({"tensor_parallel_size": 2}, 2, 1, "10.0.0.1", 29500)
    assert engine_argv(args) == [
        "--tensor-parallel-size",
        "2",
        "--distributed-executor-backend",
        "mp",
        "--nnodes",
        "2",
        "--node-rank",
        "1",
        "--master-addr",
        "10.0.0.1",
        "--master-port",
        "29500",
    ]
    assert headless_argv("/m", args)[1:5] == ["-m", "rayfleet.control.headless", "--model", "/m"]


def test_headless_rank_parses_with_vllms_own_parser():
    args = parse_headless_args(
        ["--model", "/m", *engine_argv(rank_engine_args({"tensor_parallel_size": 2}, 2, 1, "a", 1))]
    )
    assert (args.headless, args.api_server_count, args.nnodes, args.node_rank) == (True, 0, 2, 1)
    assert (args.master_addr, args.master_port, args.tensor_parallel_size) == ("a", 1, 2)


def test_socket_interface_variables_are_checked_against_the_nodes_interfaces():
    assert socket_ifname_problem({"NCCL_SOCKET_IFNAME": "eth"}, ["eth0", "lo"]) is None
    problem = socket_ifname_problem({"GLOO_SOCKET_IFNAME": "ib0"}, ["eth0", "lo"])
    assert problem == (
        "GLOO_SOCKET_IFNAME=ib0 matches no interface on this node (eth0, lo); "
        "set it in the model's env to one of them"
    )


def test_deepseek_example_spans_two_nodes_with_vllms_launch():
    from pathlib import Path

    from rayfleet.config import load_fleet

    config = load_fleet(Path(__file__).resolve().parents[2] / "examples/deepseek-v3-two-nodes.yaml")
    m = config.models[0]
    argv = engine_argv(m.engine_args)
    assert "--tensor-parallel-size" in argv and "--pipeline-parallel-size" in argv
    assert "--distributed-executor-backend" not in argv
    assert deployment_options(m)["placement_group_strategy"] == "STRICT_SPREAD"
    assert placement_bundles(m) == [{"CPU": 10, "GPU": 8}] * 2


def test_pick_core_spreads_replicas_and_models():
    claims = []
    picks = []
    for replica_model in ("tiny", "tiny", "embed"):
        core = pick_core(claims, "n1", replica_model, 2)
        claims.append(("n1", replica_model, core))
        picks.append(core)
    assert picks == [0, 1, 0]
    # tiny on core 0 dies: its replacement goes back to core 0, away from the other tiny.
    claims.remove(("n1", "tiny", 0))
    assert pick_core(claims, "n1", "tiny", 2) == 0
    # Other nodes do not count.
    assert pick_core([("n2", "tiny", 0)], "n1", "tiny", 2) == 0


def test_dry_run_marks_derived_engine_args_and_keeps_the_users():
    from rayfleet.control.lifecycle import dry_run

    config = parse_fleet(
        {
            "gateway": {"priority_classes": [{"name": "batch", "priority": 10}]},
            "models": [
                {"name": "a", "source": "/models/a", "engine_args": {"max_model_len": 512}},
                {
                    "name": "b",
                    "source": "/models/b",
                    "replicas": 2,
                    "engine_args": {"scheduling_policy": "priority"},
                },
            ],
        }
    )
    a, b = dry_run(config)
    assert config.models[0].engine_args == {"max_model_len": 512}, "validation kept user data"
    assert a.engine_args == {"max_model_len": 512, "scheduling_policy": "priority"}
    assert list(a.derived) == ["scheduling_policy"]
    assert "priority_classes" in a.derived["scheduling_policy"]
    assert a.argv == ["--max-model-len", "512", "--scheduling-policy", "priority"]
    # A model that asks for the priority scheduler itself has nothing derived.
    assert (b.replicas, b.derived, b.engine_args) == (2, {}, {"scheduling_policy": "priority"})


def test_down_does_not_wait_for_an_exited_fleet_process_nobody_reaped(tmp_path, monkeypatch):
    """`down` is not the fleet process's parent: once the process exits it stays a zombie
    until its parent reaps it, and that must count as stopped."""
    from rayfleet.control.lifecycle import stop_fleet
    from rayfleet.control.state import RunState, state_path

    monkeypatch.setenv("RAYFLEET_HOME", str(tmp_path))
    # A parent that never reaps, and under it a stand-in for the fleet process.
    parent = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import subprocess, sys, time\n"
            "child = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(600)'])\n"
            "print(child.pid, flush=True)\n"
            "time.sleep(600)\n",
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        fleet_pid = int(parent.stdout.readline())
        state = RunState(pid=fleet_pid, gateway_url="http://127.0.0.1:1")
        state.save()
        started = time.monotonic()
        stop_fleet(state, timeout_s=60, say=lambda _: None)
        assert time.monotonic() - started < 30
        assert psutil.Process(fleet_pid).status() == psutil.STATUS_ZOMBIE
        assert not state.process_alive()
        assert not state_path().exists()
    finally:
        parent.kill()
        parent.wait()


def test_a_model_survives_the_trip_to_its_replicas():
    """What build_application sends each replica (and a replica each rank) validates again
    to the same model, options of nested sections included."""
    from rayfleet.config import ModelConfig

    m = model(
        nodes_per_replica=2,
        engine_args={"tensor-parallel-size": 2},
        routing={"policy": "prefix", "alpha": 2.0},
    )
    assert ModelConfig.model_validate(m.model_dump(exclude_unset=True)) == m
    assert ModelConfig.model_validate(model().model_dump(exclude_unset=True)) == model()


def test_the_deployment_version_ignores_the_count_and_follows_what_replicas_start_with():
    from rayfleet.control.replica import deployment_version

    def version(**fields):
        return deployment_version(model(**fields), {"max_model_len": 8}, None, "/logs")

    assert version(replicas=1) == version(replicas=3) == version(drain_timeout_s=5)
    autoscaled = {
        "autoscaling": {"min_replicas": 1, "max_replicas": 2, "target_load_per_replica": 2}
    }
    assert version(**autoscaled) == version(replicas=1)
    assert version(env={"A": "1"}) != version()
    assert deployment_version(model(), {"max_model_len": 9}, None, "/logs") != version()
