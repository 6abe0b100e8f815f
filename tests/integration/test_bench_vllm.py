"""`rayfleet bench` against a real vLLM server, checked against vLLM's own benchmark.

What holds regardless of the machine's load: every key vLLM's benchmark saves is in our
result file (both clients run with the same arguments, from ``rayfleet.bench.peer``), the
chat endpoint and the prefix dataset work end to end, and our metric code gives the same
numbers as vLLM's ``calculate_metrics`` fed the same requests. Whether the two clients
*measure* the same server alike is a timed claim, made by benchmarks/bench_vs_vllm.py.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from rayfleet.bench.peer import ClientRun, run_client

pytestmark = pytest.mark.integration


def test_saved_result_has_every_vllm_key(vllm_tiny, tiny_model, tmp_path):
    run = ClientRun(vllm_tiny.url, str(tiny_model), num_prompts=20)
    theirs = run_client("vllm", run, tmp_path / "vllm.json")
    ours = run_client(
        "rayfleet",
        run,
        tmp_path / "ours.json",
        extra_args=("--price-per-hour", "12.40", "--goodput", "ttft:500", "tpot:50"),
    )
    for result in (ours, theirs):
        assert result["completed"] == 20 and result["failed"] == 0
        assert result["total_output_tokens"] == 20 * run.output_len
    vllm_only = {"rtfx"}  # audio benchmarks' inverse real-time factor: no meaning here
    assert set(theirs) - set(ours) <= vllm_only
    assert (
        ours["request_goodput"] is not None
        and ours["request_goodput"] <= ours["request_throughput"]
    )
    expected_cost = 12.40 * ours["duration"] / 3600 / ours["total_output_tokens"] * 1e6
    assert ours["cost_per_million_output_tokens"] == pytest.approx(expected_cost)
    assert ours["errors_by_status"] == {} and ours["replicas"] == {}


def test_chat_endpoint_and_prefix_dataset(vllm_tiny, tiny_model, tmp_path):
    out = tmp_path / "chat.json"
    args = [
        "bench",
        "--base-url",
        vllm_tiny.url,
        "--endpoint",
        "/v1/chat/completions",
        "--model",
        "tiny",
        "--tokenizer",
        str(tiny_model),
        "--dataset-name",
        "prefix",
        "--prefix-repetition-prefix-len",
        "128",
        "--prefix-repetition-suffix-len",
        "16",
        "--prefix-repetition-num-prefixes",
        "2",
        "--random-output-len",
        "8",
        "--num-prompts",
        "40",
        "--request-rate",
        "40",
        "--save-result",
        str(out),
    ]
    # On asyncio's own event loop, as vLLM's benchmark: uvloop alone made TTFT read 1-2 ms
    # (about 20%) lower at this load.
    env = {**os.environ, "RAYFLEET_BENCH_EVENT_LOOP": "asyncio"}
    done = subprocess.run(
        [sys.executable, "-m", "rayfleet.cli", *args],
        capture_output=True,
        text=True,
        timeout=600,
        env=env,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(out.read_text())
    assert result["completed"] == 40 and result["failed"] == 0
    assert result["total_output_tokens"] == 40 * 8
    # The server counts the chat template too, so it reports more than the prompt itself.
    assert result["total_input_tokens"] > 40 * (128 + 16)
    assert result["endpoint_type"] == "openai-chat"


def test_metrics_equal_vllm_calculate_metrics_on_the_same_requests(vllm_tiny, tiny_model):
    """Same requests in, same numbers out: our metric code against vLLM's, key by key."""
    from vllm.benchmarks.lib.endpoint_request_func import RequestFuncOutput
    from vllm.benchmarks.serve import calculate_metrics

    from rayfleet.bench.client import Target
    from rayfleet.bench.datasets import DatasetSpec, load_tokenizer, make_prompts
    from rayfleet.bench.load import LoadShape
    from rayfleet.bench.metrics import summarize
    from rayfleet.bench.runner import run_load

    tokenizer = load_tokenizer(str(tiny_model))
    prompts = make_prompts(
        DatasetSpec(
            num_prompts=40, random_input_len=32, random_output_len=16, random_range_ratio=0.5
        ),
        tokenizer,
    )
    output = run_load(
        Target(vllm_tiny.url, model="tiny", ignore_eos=True), prompts, LoadShape(max_concurrency=8)
    )
    theirs_in = [
        RequestFuncOutput(
            success=r.ok,
            latency=r.e2e_s,
            output_tokens=r.num_output_tokens,
            ttft=r.ttft_s,
            itl=r.itl_s,
            prompt_len=r.num_input_tokens,
            start_time=r.start_s,
            generated_text="x",
        )
        for r in output.results
    ]
    slos = {"ttft": 50.0, "tpot": 5.0}
    theirs, _ = calculate_metrics([], theirs_in, output.duration_s, tokenizer, [90.0, 99.0], slos)
    ours = summarize(output.results, output.duration_s, goodput_ms=slos)
    assert theirs.completed == ours["completed"] == 40
    for key in ("total_input", "total_output"):
        assert getattr(theirs, key) == ours[f"{key}_tokens"]
    for key in (
        "request_throughput",
        "request_goodput",
        "output_throughput",
        "total_token_throughput",
        "max_concurrent_requests",
        "max_output_tokens_per_s",
    ):
        assert getattr(theirs, key) == pytest.approx(ours[key]), (
            key,
            getattr(theirs, key),
            ours[key],
        )
    for name in ("ttft", "tpot", "itl", "e2el"):
        for stat in ("mean", "median", "std"):
            assert getattr(theirs, f"{stat}_{name}_ms") == pytest.approx(ours[f"{stat}_{name}_ms"])
        for p, value in getattr(theirs, f"percentiles_{name}_ms"):
            assert value == pytest.approx(ours[f"p{int(p)}_{name}_ms"]), (name, p)
