"""Control-plane pieces that need no Ray: engine command lines, placement, core spreading,
the dry run and stopping a fleet process."""

from __future__ import annotations

import subprocess
import sys
import time

import psutil

from rayfleet.config import parse_fleet
from rayfleet.control.engine import server_argv
from rayfleet.control.engine_args import engine_argv
from rayfleet.control.placement import placement_bundles
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


def test_multi_node_replica_gets_one_placement_group_with_the_strategy():
    m = model(
        placement_strategy="SPREAD",
        num_cpus=2,
        engine_args={
            "tensor_parallel_size": 8,
            "pipeline_parallel_size": 2,
            "distributed_executor_backend": "ray",
        },
    )
    bundles = placement_bundles(m)
    assert bundles[0] == {"CPU": 2} and len(bundles) == 17
    assert all(b == {"GPU": 1.0} for b in bundles[1:])
    options = deployment_options(m)
    assert options["placement_group_bundles"] == bundles
    assert options["placement_group_strategy"] == "SPREAD"
    # The replica actor holds no GPU itself: the engine workers own the 16 GPU bundles.
    assert options["ray_actor_options"] == {"num_cpus": 2, "num_gpus": 0}


def test_deepseek_example_engine_args_reach_vllm_unchanged():
    from pathlib import Path

    from rayfleet.config import load_fleet

    config = load_fleet(Path(__file__).resolve().parents[2] / "examples/deepseek-v3-two-nodes.yaml")
    m = config.models[0]
    argv = engine_argv(m.engine_args)
    for flag in (
        "--tensor-parallel-size",
        "--pipeline-parallel-size",
        "--distributed-executor-backend",
    ):
        assert flag in argv
    assert deployment_options(m)["placement_group_strategy"] == "PACK"
    assert len(placement_bundles(m)) == 1 + 16


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
