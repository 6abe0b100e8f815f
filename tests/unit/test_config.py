"""fleet.yaml validation: every mistake is one line naming the field and the fix."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from rayfleet.config import FleetConfig, load_fleet, parse_fleet
from rayfleet.control.engine_args import check_engine_args
from rayfleet.errors import ConfigError

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def fleet(**model) -> dict:
    return {"models": [{"name": "m", "source": "/models/m", **model}]}


@pytest.mark.parametrize(
    "data, expected",
    [
        (fleet(replica=2), "models[0].replica: unknown field; did you mean 'replicas'?"),
        ({"gatway": {}, **fleet()}, "gatway: unknown field; did you mean 'gateway'?"),
        ({"gateway": {"prot": 80}, **fleet()}, "gateway.prot: unknown field; did you mean 'port'?"),
        (fleet(replicas="two"), "models[0].replicas: Input should be a valid integer"),
        (fleet(replicas=0), "models[0].replicas: Input should be greater than or equal to 1"),
        (fleet(nodes_per_replica=0), "models[0].nodes_per_replica: Input should be greater than"),
        ({"gateway": {"port": 70000}, **fleet()}, "gateway.port: Input should be less than"),
        ({"models": []}, "models: List should have at least 1 item"),
        ({"models": [{"name": "m"}]}, "models[0].source: required field is missing"),
        (fleet(engine_args={"port": 9000}), "port is set by rayfleet for each replica"),
        ({"cluster": {"address": "headnode"}, **fleet()}, "cluster.address: 'headnode' is not"),
        (
            {"models": [{"name": "a", "source": "x"}, {"name": "a", "source": "y"}]},
            "two models are named 'a'",
        ),
    ],
)
def test_bad_fleet_is_one_line_with_the_field(data, expected):
    with pytest.raises(ConfigError) as err:
        parse_fleet(data, origin="fleet.yaml")
    message = str(err.value)
    assert message.startswith("fleet.yaml: ")
    assert expected in message
    assert "\n" not in message


def test_every_bad_field_is_a_line_of_its_own():
    data = {
        "gateway": {"port": "eighty"},
        "models": [{"name": "a", "source": "/x", "replica": 2}, {"name": "b"}],
    }
    with pytest.raises(ConfigError) as err:
        parse_fleet(data, origin="fleet.yaml")
    assert str(err.value).splitlines() == [
        "fleet.yaml: gateway.port: Input should be a valid integer, unable to parse string as "
        "an integer (got 'eighty')",
        "fleet.yaml: models[0].replica: unknown field; did you mean 'replicas'?",
        "fleet.yaml: models[1].source: required field is missing",
    ]


def test_past_ten_bad_fields_the_rest_are_counted():
    data = {"models": [{"name": f"m{i}"} for i in range(12)]}
    with pytest.raises(ConfigError) as err:
        parse_fleet(data, origin="fleet.yaml")
    lines = str(err.value).splitlines()
    assert len(lines) == 11
    assert lines[9] == "fleet.yaml: models[9].source: required field is missing"
    assert lines[10] == "fleet.yaml: ... and 2 more"


def test_yaml_syntax_error_names_line(tmp_path):
    path = tmp_path / "fleet.yaml"
    path.write_text("models:\n  - name: a\n    source: [unclosed\n")
    with pytest.raises(ConfigError, match=r"fleet.yaml at line \d+, column \d+"):
        load_fleet(path)


def test_missing_file(tmp_path):
    with pytest.raises(ConfigError, match="no such file"):
        load_fleet(tmp_path / "nope.yaml")


def test_defaults_and_derived_sizes():
    config = parse_fleet(
        fleet(engine_args={"tensor-parallel-size": 4, "pipeline_parallel_size": 2})
    )
    model = config.models[0]
    assert (model.replicas, model.num_cpus, model.nodes_per_replica) == (1, 1.0, 1)
    assert model.engine_args == {"tensor_parallel_size": 4, "pipeline_parallel_size": 2}
    assert model.world_size == 8
    assert config.gateway.port == 8000 and config.cluster.address == "local"


@pytest.mark.parametrize(
    "name", ["one-node-two-models.yaml", "deepseek-v3-two-nodes.yaml", "policies.yaml"]
)
def test_examples_are_valid(name):
    config = load_fleet(EXAMPLES / name)
    assert isinstance(config, FleetConfig)


def test_deepseek_example_spans_two_nodes():
    model = load_fleet(EXAMPLES / "deepseek-v3-two-nodes.yaml").models[0]
    assert model.world_size == 16


def test_engine_args_checked_by_vllm_parser():
    good = parse_fleet(fleet(engine_args={"max_model_len": 512, "enforce_eager": True}))
    check_engine_args(good)
    with pytest.raises(
        ConfigError,
        match=r"engine_args.max_modl_len: not a vLLM server argument; "
        r"did you mean 'max_model_len'\?",
    ):
        check_engine_args(parse_fleet(fleet(engine_args={"max_modl_len": 512})))
    with pytest.raises(ConfigError, match=r"vLLM rejects them: argument --max-model-len"):
        check_engine_args(parse_fleet(fleet(engine_args={"max_model_len": "lots"})))
    with pytest.raises(ConfigError, match=r"argument --scheduling-policy: invalid choice"):
        check_engine_args(parse_fleet(fleet(engine_args={"scheduling_policy": "fastest"})))


def _rayfleet(*args, home: Path) -> subprocess.CompletedProcess:
    # The timeout only stops a hung command: checking engine arguments imports vLLM, which
    # took over 120 s beside a busy vLLM server on two cores.
    return subprocess.run(
        [sys.executable, "-m", "rayfleet.cli", *args],
        capture_output=True,
        text=True,
        timeout=600,
        env={"RAYFLEET_HOME": str(home), "PATH": ""},
    )


@pytest.mark.parametrize(
    "text, expected",
    [
        (
            "models:\n  - name: a\n    source: /x\n    replica: 2\n",
            "models[0].replica: unknown field; did you mean 'replicas'?",
        ),
        (
            "models:\n  - name: a\n    source: /x\n    num_cpus: many\n",
            "models[0].num_cpus: Input should be a valid number",
        ),
        (
            "models:\n  - name: a\n    source: /x\n    engine_args: {max_model_len: lots}\n",
            "vLLM rejects them: argument --max-model-len",
        ),
    ],
)
def test_cli_reports_bad_fleet_in_one_line(tmp_path, text, expected):
    path = tmp_path / "fleet.yaml"
    path.write_text(text)
    result = _rayfleet("up", "-c", str(path), home=tmp_path)
    assert result.returncode == 2
    errors = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and expected in errors[0], result.stderr
    assert "Traceback" not in result.stderr
    assert not (tmp_path / "run").exists(), "nothing may start for a bad fleet"


PRIORITY_FLEET = """
gateway:
  priority_classes: [{name: batch, priority: 10}]
models:
  - name: a
    source: /models/a
    replicas: 2
    engine_args: {max_model_len: 512%s}
"""


def test_up_dry_run_prints_what_would_start_and_starts_nothing(tmp_path):
    path = tmp_path / "fleet.yaml"
    path.write_text(PRIORITY_FLEET % "")
    result = _rayfleet("up", "--dry-run", "-c", str(path), home=tmp_path)
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert "model 'a': 2 replica(s) of /models/a" in result.stdout
    assert "  max_model_len: 512" in lines
    derived = [line for line in lines if "scheduling_policy: priority" in line]
    assert len(derived) == 1 and "(derived: gateway.priority_classes" in derived[0]
    assert "  vLLM flags: --max-model-len 512 --scheduling-policy priority" in lines
    assert not (tmp_path / "run").exists() and not (tmp_path / "logs").exists()


KEYED_FLEET = """
gateway:
  api_keys: [{name: team-a, key_file: %s}]
models:
  - name: a
    source: /models/a
"""


@pytest.mark.parametrize("dry_run", [True, False], ids=["dry run", "up"])
@pytest.mark.parametrize("content", [None, ""], ids=["missing", "empty"])
def test_up_refuses_a_bad_key_file_before_anything_starts(tmp_path, dry_run, content):
    key_file = tmp_path / "team-a.key"
    if content is not None:
        key_file.write_text(content)
    path = tmp_path / "fleet.yaml"
    path.write_text(KEYED_FLEET % key_file)
    result = _rayfleet("up", *(["--dry-run"] if dry_run else []), "-c", str(path), home=tmp_path)
    assert result.returncode == 2, result.stderr
    errors = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    reason = "cannot read" if content is None else "is empty"
    assert len(errors) == 1 and f"api key file {key_file}" in errors[0], result.stderr
    assert reason in errors[0]
    assert "Traceback" not in result.stderr
    assert not (tmp_path / "run").exists() and not (tmp_path / "logs").exists()


def test_up_dry_run_keeps_the_scheduling_policy_conflict(tmp_path):
    path = tmp_path / "fleet.yaml"
    path.write_text(PRIORITY_FLEET % ", scheduling_policy: fcfs")
    result = _rayfleet("up", "--dry-run", "-c", str(path), home=tmp_path)
    assert result.returncode == 2
    errors = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1, result.stderr
    assert "model 'a' sets scheduling_policy 'fcfs', but gateway.priority_classes need" in errors[0]
