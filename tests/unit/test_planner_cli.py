"""``rayfleet plan`` as a user runs it: help, JSON, exit codes, --emit, one-line errors."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import typer.main
import yaml
from typer.testing import CliRunner

from rayfleet.cli import app
from rayfleet.config import parse_fleet

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "planner"
REQUIRED_FIELDS = {
    "fits",
    "tensor_parallel",
    "pipeline_parallel",
    "replicas",
    "nodes_per_replica",
    "gpus_per_replica",
    "needs_ray",
    "weights_gib_per_gpu",
    "kv_cache_gib_per_gpu",
    "kv_tokens_per_replica",
    "max_concurrent_seqs",
    "reasons",
    "alternatives",
}
LAYOUT_FIELDS = REQUIRED_FIELDS - {"fits", "reasons", "alternatives"}
H100_NODE = ["--gpus-per-node", "8", "--gpu-memory-gib", "80"]


def run_plan(*args: str):
    return CliRunner().invoke(app, ["plan", *args], env={"COLUMNS": "200"})


def run_cli(*args: str) -> subprocess.CompletedProcess:
    """The installed entry point, so errors go through rayfleet.cli.main."""
    return subprocess.run(
        [sys.executable, "-m", "rayfleet.cli", "plan", *args],
        capture_output=True,
        text=True,
        timeout=120,
        env={"COLUMNS": "200", "PATH": ""},
    )


def test_help_explains_every_flag():
    result = run_plan("--help")
    assert result.exit_code == 0
    command = typer.main.get_command(app).commands["plan"]
    for param in command.params:
        assert param.help and len(param.help) > 15, f"{param.name} has no help"
        for flag in param.opts:
            if flag.startswith("--"):
                assert flag in result.output


def test_json_has_the_documented_fields():
    result = run_plan(
        str(FIXTURES / "llama-3.1-70b"),
        *H100_NODE,
        "--context-len",
        "8192",
        "--concurrency",
        "100",
        "--json",
    )
    assert result.exit_code == 0, result.output
    plan = json.loads(result.output)
    assert plan.keys() >= REQUIRED_FIELDS
    assert plan["fits"] is True and plan["needs_ray"] is False
    assert (plan["tensor_parallel"], plan["replicas_needed"]) == (4, 2)
    assert plan["alternatives"] and all(a.keys() >= LAYOUT_FIELDS for a in plan["alternatives"])
    assert any("Ray is optional" in reason for reason in plan["reasons"])


def test_does_not_fit_exits_3_with_the_smallest_hardware():
    result = run_plan(
        str(FIXTURES / "llama-3.1-405b"), *H100_NODE, "--context-len", "8192", "--json"
    )
    assert result.exit_code == 3
    plan = json.loads(result.output)
    assert plan["fits"] is False
    assert plan["smallest_fit"]["nodes"] == 2
    assert any("smallest hardware that fits: 2 node(s)" in r for r in plan["reasons"])


def test_multi_node_plan_says_ray_is_needed_and_why():
    result = run_plan(
        str(FIXTURES / "deepseek-v3"),
        *H100_NODE,
        "--nodes",
        "2",
        "--inter-node-gbps",
        "8",
        "--context-len",
        "16384",
    )
    assert result.exit_code == 0, result.output
    assert "Ray needed" in result.output
    assert "must span 2 nodes" in result.output
    assert "under 10 Gbit/s" in result.output


def test_emit_writes_a_pasteable_fleet_entry(tmp_path):
    out = tmp_path / "fleet.yaml"
    result = run_plan(
        str(FIXTURES / "deepseek-v3"),
        *H100_NODE,
        "--nodes",
        "2",
        "--context-len",
        "32768",
        "--emit",
        str(out),
        "--name",
        "deepseek-v3",
    )
    assert result.exit_code == 0, result.output
    fleet = parse_fleet(yaml.safe_load(out.read_text()), origin=str(out))
    model = fleet.model("deepseek-v3")
    assert (model.tensor_parallel_size, model.pipeline_parallel_size) == (8, 2)
    assert model.engine_args["max_model_len"] == 32768
    assert "distributed_executor_backend" not in model.engine_args  # vLLM's own multi-node
    assert (model.nodes_per_replica, model.num_gpus) == (2, 8)
    assert model.gpus_per_node_needed == 8


def test_emit_carries_online_fp8_and_reserves_the_replicas_gpu(tmp_path):
    out = tmp_path / "fleet.yaml"
    result = run_plan(
        str(FIXTURES / "llama-3.1-70b"),
        "--gpus-per-node",
        "1",
        "--gpu-memory-gib",
        "141",
        "--quantization",
        "fp8",
        "--context-len",
        "32768",
        "--emit",
        str(out),
    )
    assert result.exit_code == 0, result.output
    entry = yaml.safe_load(out.read_text())["models"][0]
    assert entry["engine_args"]["quantization"] == "fp8"
    assert entry["engine_args"]["tensor_parallel_size"] == 1
    # One actor per replica holding its GPU, on one node.
    assert "nodes_per_replica" not in entry
    assert entry["num_gpus"] == 1


@pytest.mark.parametrize(
    ("make_input", "expected"),
    [
        (lambda d: d / "missing", "not a file, a directory"),
        (lambda d: _write(d, '{"hidden_size": 64,'), "not valid JSON"),
        (
            lambda d: _write(d, json.dumps({"hidden_size": 64, "num_attention_heads": 2})),
            "missing field 'num_hidden_layers'",
        ),
    ],
)
def test_bad_config_is_one_line_naming_file_and_field(tmp_path, make_input, expected):
    path = make_input(tmp_path)
    result = run_cli(str(path), *H100_NODE)
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert expected in lines[0] and str(path.name) in lines[0]


def test_missing_hardware_flags_say_what_to_pass():
    result = run_cli(str(FIXTURES / "llama-3.1-8b"))
    assert result.returncode == 2
    assert "--gpus-per-node and --gpu-memory-gib not given" in result.stderr


def test_from_cluster_with_no_cluster_at_the_address_is_one_line():
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        address = f"127.0.0.1:{sock.getsockname()[1]}"
    result = run_cli(str(FIXTURES / "llama-3.1-8b"), "--from-cluster", "--address", address)
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert f"no Ray cluster at '{address}'" in lines[0] and "without --from-cluster" in lines[0]


def test_context_longer_than_the_model_is_refused():
    result = run_plan(str(FIXTURES / "mixtral-8x7b"), *H100_NODE, "--context-len", "65536")
    assert "exceeds the model's max context 32768" in str(result.exception)


def _write(directory: Path, text: str) -> Path:
    path = directory / "config.json"
    path.write_text(text)
    return path
