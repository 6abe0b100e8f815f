"""`rayfleet bench` and `rayfleet bench compare` as a user runs them, against the simulator."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from typer.testing import CliRunner

from rayfleet.bench.command import vllm_style_args
from rayfleet.bench.simulator import SimulatorSpec, SimulatorThread
from rayfleet.cli import app


def bench(*args: str):
    return CliRunner().invoke(app, ["bench", *args], env={"COLUMNS": "200"})


def run_cli(*args: str) -> subprocess.CompletedProcess:
    """The real entry point, so user errors go through rayfleet.cli.main."""
    return subprocess.run(
        [sys.executable, "-m", "rayfleet.cli", *args],
        capture_output=True,
        text=True,
        timeout=120,
        env={"COLUMNS": "200", "PATH": ""},
    )


@pytest.fixture(scope="module")
def sim():
    spec = SimulatorSpec(
        replica_names=("tiny-0", "tiny-1", "tiny-0", "fallback:openai"),
        fail_every=10,
        token_delay_s=0.001,
    )
    with SimulatorThread(spec) as server:
        yield server


def test_vllm_argparse_spellings_are_accepted():
    assert vllm_style_args(["--goodput", "ttft:500", "tpot:50", "--num-prompts", "3"]) == [
        "--goodput",
        "ttft:500",
        "--goodput",
        "tpot:50",
        "--num-prompts",
        "3",
    ]
    assert vllm_style_args(["--save-result", "--result-dir", "d"]) == [
        "--save-result",
        "",
        "--result-dir",
        "d",
    ]
    assert vllm_style_args(["--save-result"]) == ["--save-result", ""]
    assert vllm_style_args(["--save-result", "a.json"]) == ["--save-result", "a.json"]


def test_run_prints_tables_and_saves_vllm_named_result(sim, tiny_model, tmp_path):
    result = bench(
        "--base-url",
        sim.url,
        "--tokenizer",
        str(tiny_model),
        "--num-prompts",
        "40",
        "--random-input-len",
        "16",
        "--random-output-len",
        "8",
        "--max-concurrency",
        "4",
        "--goodput",
        "ttft:1000",
        "tpot:100",
        "--price-per-hour",
        "12.40",
        "--save-result",
        "--result-dir",
        str(tmp_path),
        "--label",
        "sim-run",
    )
    assert result.exit_code == 0, result.output
    for text in (
        "requests/s",
        "TTFT",
        "TPOT",
        "ITL",
        "E2E latency",
        "errors: 503",
        "served by tiny-0",
        "cost per 1M output tokens at 12.4/h",
        "fallback share",
    ):
        assert text in result.output
    (path,) = tmp_path.glob("sim-run-infqps-concurrency4-sim-*.json")
    saved = json.loads(path.read_text())
    assert (saved["completed"], saved["failed"]) == (36, 4)
    assert saved["errors_by_status"] == {"503": 4}
    assert saved["replicas"] == {"tiny-0": 20, "tiny-1": 10, "fallback:openai": 10}
    assert saved["fallback_share"] == 0.25
    assert saved["model_id"] == "sim" and saved["max_concurrency"] == 4
    assert saved["request_goodput"] == pytest.approx(saved["request_throughput"])
    assert saved["total_output_tokens"] == 36 * 8
    assert saved["cost_per_million_output_tokens"] > 0 and "itls" not in saved


def test_json_output_detailed_lists_and_plots(sim, tiny_model, tmp_path):
    out = tmp_path / "r.json"
    result = bench(
        "--base-url",
        sim.url,
        "--endpoint",
        "/v1/chat/completions",
        "--tokenizer",
        str(tiny_model),
        "--num-prompts",
        "20",
        "--random-input-len",
        "8",
        "--random-output-len",
        "4",
        "--request-rate",
        "100",
        "--save-result",
        str(out),
        "--save-detailed",
        "--json",
        "--plot",
        str(tmp_path / "plots"),
    )
    assert result.exit_code == 0, result.output
    printed = json.loads(result.stdout.strip().splitlines()[0])
    assert printed["endpoint_type"] == "openai-chat" and printed["request_rate"] == 100.0
    saved = json.loads(out.read_text())
    assert len(saved["itls"]) == 20 and len(saved["served_by"]) == 20
    for name in ("ttft", "itl", "throughput"):
        png = tmp_path / "plots" / f"bench-{name}.png"
        assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_sweep_stops_when_errors_pass_the_limit(sim, tiny_model, tmp_path):
    out = tmp_path / "sweep.json"
    result = bench(
        "--base-url",
        sim.url,
        "--tokenizer",
        str(tiny_model),
        "--num-prompts",
        "20",
        "--random-input-len",
        "8",
        "--random-output-len",
        "4",
        "--sweep-max-concurrency",
        "1,2,4",
        "--sweep-max-error-share",
        "0.05",
        "--save-result",
        str(out),
        "--plot",
        str(tmp_path),
    )
    assert result.exit_code == 0, result.output
    saved = json.loads(out.read_text())
    assert len(saved["steps"]) == 1  # 10% of requests fail (every 10th): over the 5% limit
    assert saved["sweep"]["stop_reason"].startswith("stopped at max_concurrency=1: errors 10%")
    assert (tmp_path / "bench-sweep-latency.png").exists()


def test_sweep_runs_every_step_and_stops_on_a_broken_slo(tiny_model, tmp_path):
    with SimulatorThread(SimulatorSpec(first_token_delay_s=0.02)) as server:
        common = [
            "--base-url",
            server.url,
            "--tokenizer",
            str(tiny_model),
            "--num-prompts",
            "10",
            "--random-input-len",
            "8",
            "--random-output-len",
            "4",
        ]
        full = bench(
            *common, "--sweep-request-rates", "20,40", "--save-result", str(tmp_path / "a.json")
        )
        broken = bench(
            *common,
            "--sweep-request-rates",
            "20,40",
            "--goodput",
            "ttft:5",
            "--save-result",
            str(tmp_path / "b.json"),
        )
    assert full.exit_code == 0 and broken.exit_code == 0, full.output + broken.output
    steps = json.loads((tmp_path / "a.json").read_text())["steps"]
    assert [s["sweep_value"] for s in steps] == [20, 40]
    assert "Sweep over request_rate" in full.output and "completed every step" in full.output
    stopped = json.loads((tmp_path / "b.json").read_text())["sweep"]["stop_reason"]
    assert stopped == "stopped at request_rate=20: SLO met by 0% < 90% of requests"


def test_compare_prints_runs_side_by_side_with_ratios(tmp_path):
    base = {
        "label": "before",
        "completed": 100,
        "failed": 0,
        "request_throughput": 10.0,
        "output_throughput": 1000.0,
        "median_ttft_ms": 50.0,
        "p99_ttft_ms": 90.0,
    }
    (tmp_path / "a.json").write_text(json.dumps(base))
    (tmp_path / "b.json").write_text(
        json.dumps(base | {"label": "after", "request_throughput": 12.5, "median_ttft_ms": 25.0})
    )
    sweep = {
        "sweep": {"variable": "request_rate"},
        "steps": [base | {"sweep_value": 1.0}, base | {"sweep_value": 2.0}],
    }
    (tmp_path / "s.json").write_text(json.dumps(sweep))
    result = bench(
        "compare", str(tmp_path / "a.json"), str(tmp_path / "b.json"), str(tmp_path / "s.json")
    )
    assert result.exit_code == 0, result.output
    assert (
        "before" in result.output
        and "after" in result.output
        and "s@request_rate=2" in result.output
    )
    rows = {line.split("│")[1].strip(): line for line in result.output.splitlines() if "│" in line}
    assert "1.25x" in rows["requests/s"] and "0.50x" in rows["TTFT median ms"]


@pytest.mark.parametrize(
    "args, message",
    [
        (
            ["bench", "compare", "missing.json", "missing2.json"],
            "cannot read result file missing.json",
        ),
        (
            ["bench", "--base-url", "localhost:1", "--model", "m"],
            "--base-url 'localhost:1' must start with http",
        ),
        (
            ["bench", "--base-url", "http://127.0.0.1:9", "--model", "m", "--max-connections", "0"],
            "--max-connections must be at least 1",
        ),
        (
            [
                "bench",
                "--base-url",
                "http://127.0.0.1:9",
                "--model",
                "m",
                "--dataset-name",
                "jsonl",
                "--dataset-path",
                "nope.jsonl",
            ],
            "--dataset-path: cannot read nope.jsonl",
        ),
        (
            [
                "bench",
                "--base-url",
                "http://127.0.0.1:9",
                "--model",
                "m",
                "--request-rate",
                "5",
                "--ramp-up-strategy",
                "linear",
                "--ramp-up-start-rps",
                "1",
                "--ramp-up-end-rps",
                "2",
            ],
            "drop --request-rate",
        ),
        (
            ["bench", "--base-url", "http://127.0.0.1:9", "--model", "m", "--goodput", "ttft=3"],
            "--goodput 'ttft=3' is not NAME:MS",
        ),
        (
            [
                "bench",
                "--base-url",
                "http://127.0.0.1:9",
                "--model",
                "m",
                "--sweep-request-rates",
                "4,2",
            ],
            "--sweep-request-rates needs positive rising numbers",
        ),
        (
            ["bench", "--base-url", "http://127.0.0.1:9", "--model", "not-a-dir"],
            "makes prompts of exact token lengths and needs the model's tokenizer",
        ),
    ],
)
def test_user_errors_are_one_line_naming_the_flag(args, message):
    done = run_cli(*args)
    assert done.returncode == 2
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and message in lines[0], done.stderr


def test_unreachable_endpoint_fails_in_one_line(tmp_path):
    data = tmp_path / "p.jsonl"
    data.write_text('{"prompt": "hi"}\n')
    done = run_cli(
        "bench",
        "--base-url",
        "http://127.0.0.1:9",
        "--model",
        "m",
        "--dataset-name",
        "jsonl",
        "--dataset-path",
        str(data),
        "--num-prompts",
        "3",
    )
    assert done.returncode == 2
    assert "the first request to http://127.0.0.1:9/v1/completions failed" in done.stderr
    assert "check --base-url, --endpoint and --model" in done.stderr


def test_command_module_imports_nothing_heavy():
    heavy = ("numpy", "aiohttp", "matplotlib", "transformers", "torch", "vllm", "ray")
    code = f"import sys, rayfleet.bench.command; print([m for m in {heavy!r} if m in sys.modules])"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.stdout.strip() == "[]", done.stdout + done.stderr


def test_help_lists_vllm_flag_names():
    result = bench("--help")
    assert result.exit_code == 0
    for flag in (
        "--base-url",
        "--endpoint",
        "--model",
        "--tokenizer",
        "--dataset-name",
        "--random-input-len",
        "--random-output-len",
        "--num-prompts",
        "--max-concurrency",
        "--max-connections",
        "--request-rate",
        "--burstiness",
        "--ignore-eos",
        "--goodput",
        "--save-result",
        "--result-dir",
        "--result-filename",
        "--price-per-hour",
        "--plot",
        "--num-processes",
    ):
        assert flag in result.output
