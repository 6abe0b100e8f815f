"""Simulated replicas over HTTP: the openai client, usage, metrics, many replicas, restart."""

from __future__ import annotations

import json
import urllib.request
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import openai
import pytest
from prometheus_client.parser import text_string_to_metric_families

from rayfleet.sim import EngineSpec, SimFleet

SYSTEM = "You are a helpful assistant. " * 20  # 580 characters: 9 full blocks


@pytest.fixture(scope="module")
def fleet() -> Iterator[SimFleet]:
    spec = EngineSpec(model="sim-model", step_s=0.0005, prefill_token_s=1e-6, num_gpu_blocks=512)
    with SimFleet(spec, num_replicas=2) as fleet:
        yield fleet


def client(url: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=url + "/v1", api_key="unused", max_retries=0)


def get(url: str) -> bytes:
    with urllib.request.urlopen(url, timeout=30) as response:
        body: bytes = response.read()
    return body


def post(url: str) -> Any:
    request = urllib.request.Request(url, method="POST")
    with urllib.request.urlopen(request, timeout=30) as response:
        return json.loads(response.read())


def test_openai_client_streams_a_chat_with_usage_and_cached_tokens(fleet: SimFleet) -> None:
    openai_client = client(fleet.urls[0])
    messages = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": "first"}]
    cached = []
    for _ in range(2):
        stream = openai_client.chat.completions.create(
            model="sim-model",
            messages=messages,  # type: ignore[arg-type]
            max_tokens=5,
            stream=True,
            stream_options={"include_usage": True},
        )
        chunks = list(stream)
        text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
        assert text == " tok" * 5
        assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "length"
        usage = chunks[-1].usage
        assert usage is not None and usage.completion_tokens == 5
        assert usage.prompt_tokens_details is not None
        cached.append(usage.prompt_tokens_details.cached_tokens)
    assert cached[0] == 0 and cached[1] == 144  # the system prompt's 9 blocks of 16


def test_openai_client_completes_without_streaming(fleet: SimFleet) -> None:
    completion = client(fleet.urls[1]).completions.create(
        model="sim-model", prompt="x" * 100, max_tokens=3
    )
    assert completion.choices[0].text == " tok" * 3
    assert completion.usage is not None and completion.usage.prompt_tokens == 25
    models = client(fleet.urls[1]).models.list()
    assert [m.id for m in models] == ["sim-model"]


def test_metrics_parse_with_vllm_names(fleet: SimFleet) -> None:
    client(fleet.urls[1]).completions.create(model="sim-model", prompt="y" * 200, max_tokens=2)
    text = get(fleet.urls[1] + "/metrics").decode()
    families = {f.name: f for f in text_string_to_metric_families(text)}
    for name in (
        "vllm:num_requests_running",
        "vllm:num_requests_waiting",
        "vllm:kv_cache_usage_perc",
        "vllm:prefix_cache_queries",
        "vllm:prefix_cache_hits",
        "vllm:prompt_tokens",
        "vllm:generation_tokens",
        "vllm:time_to_first_token_seconds",
        "vllm:cache_config_info",
        "process_start_time_seconds",
    ):
        assert name in families, name
    info = families["vllm:cache_config_info"].samples[0].labels
    assert info["num_gpu_blocks"] == "512" and info["block_size"] == "16"
    queries = families["vllm:prefix_cache_queries"].samples[0]
    assert queries.labels["model_name"] == "sim-model" and queries.value >= 50
    ttft_count = [
        s for s in families["vllm:time_to_first_token_seconds"].samples if s.name.endswith("_count")
    ]
    assert ttft_count[0].value >= 1


def test_health_and_a_bad_request() -> None:
    with SimFleet(EngineSpec(num_gpu_blocks=4), num_replicas=1) as fleet:
        assert get(fleet.urls[0] + "/health") == b""
        with pytest.raises(openai.BadRequestError, match="exceed the KV cache"):
            client(fleet.urls[0]).completions.create(model="sim", prompt="z" * 400, max_tokens=8)


def test_restart_clears_the_cache_and_moves_the_start_time() -> None:
    with SimFleet(EngineSpec(step_s=0.0005), num_replicas=1) as fleet:
        openai_client = client(fleet.urls[0])

        def cached_tokens() -> int:
            completion = openai_client.completions.create(model="sim", prompt=SYSTEM, max_tokens=1)
            assert completion.usage is not None and completion.usage.prompt_tokens_details
            return completion.usage.prompt_tokens_details.cached_tokens or 0

        assert cached_tokens() == 0 and cached_tokens() == 144
        before = fleet.stats()[0]
        after = post(fleet.urls[0] + "/simulator/restart")
        assert after["start_time_s"] > before["start_time_s"] and after["num_cached_blocks"] == 0
        assert after["prefix_cache_hits"] == 0
        assert cached_tokens() == 0


def test_sixty_four_replicas_in_one_process_answer() -> None:
    spec = EngineSpec(step_s=0.0005)
    with SimFleet(spec, num_replicas=64) as fleet:
        assert len(set(fleet.urls)) == 64

        def ask(url: str) -> str:
            completion = client(url).completions.create(model="sim", prompt=url, max_tokens=2)
            return completion.choices[0].text

        with ThreadPoolExecutor(16) as pool:
            assert list(pool.map(ask, fleet.urls)) == [" tok tok"] * 64
        assert all(s["num_finished"] == 1 for s in fleet.stats())


def test_a_fleet_in_a_process_of_its_own_serves_and_restarts() -> None:
    from rayfleet.sim import SimFleetProcess

    with SimFleetProcess(EngineSpec(model="proc", step_s=0.0005), num_replicas=3) as fleet:
        assert len(fleet.urls) == 3
        for _ in range(2):
            client(fleet.urls[2]).completions.create(model="proc", prompt=SYSTEM, max_tokens=1)
        assert fleet.stats()[2]["prefix_cache_hits"] == 144
        fleet.restart(2)
        assert fleet.stats()[2]["prefix_cache_hits"] == 0
        pid = fleet.proc.pid if fleet.proc else 0
    assert fleet.proc is not None and fleet.proc.poll() is not None and pid
