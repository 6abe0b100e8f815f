"""A real fleet (Ray Serve, two vLLM models) driven with the official openai client.

The module's fleet and its openai client are tests/conftest.py's ``fleet`` and ``client``;
the fleet is shared with the modules that name the same ``SHARED_FLEET``, which run after
this one.
"""

from __future__ import annotations

import re

import openai
import pytest
import requests

from tests.integration.fleet import demo_and_tiny, engine_gauge, wait_until

pytestmark = pytest.mark.integration

SHARED_FLEET = "demo-and-tiny"  # with test_metrics_names.py and test_top.py


@pytest.fixture(scope="module")
def fleet_models(tiny_model, demo_model):
    return demo_and_tiny(tiny_model, demo_model)


def test_lists_models(client):
    ids = sorted(m.id for m in client.models.list().data)
    assert ids == ["smollm2-135m", "tiny"]


def test_chat_answers_sensibly(client):
    reply = client.chat.completions.create(
        model="smollm2-135m",
        messages=[{"role": "user", "content": "What is the capital of France?"}],
        max_tokens=30,
        temperature=0,
    )
    assert "Paris" in reply.choices[0].message.content
    assert reply.model == "smollm2-135m"
    assert reply.usage.completion_tokens > 0


def test_chat_streams(client):
    stream = client.chat.completions.create(
        model="smollm2-135m",
        messages=[{"role": "user", "content": "What is the capital of France?"}],
        max_tokens=30,
        temperature=0,
        stream=True,
    )
    pieces = [c.choices[0].delta.content or "" for c in stream if c.choices]
    assert len(pieces) > 3
    assert "Paris" in "".join(pieces)


def test_completion(client):
    reply = client.completions.create(model="tiny", prompt="hello", max_tokens=8)
    assert reply.model == "tiny"
    assert reply.usage.completion_tokens == 8


def test_completion_streams(client):
    stream = client.completions.create(
        model="tiny", prompt="hello", max_tokens=16, stream=True, extra_body={"ignore_eos": True}
    )
    chunks = [c for c in stream]
    assert len(chunks) >= 8
    assert all(c.model == "tiny" for c in chunks)


def test_routes_by_model_name_and_names_the_replica(client):
    for model in ("tiny", "smollm2-135m", "tiny"):
        raw = client.completions.with_raw_response.create(model=model, prompt="hi", max_tokens=2)
        assert raw.headers["x-rayfleet-replica"].startswith(model + "#")
        assert raw.parse().model == model


def test_unknown_model_is_404_listing_models(client):
    with pytest.raises(openai.NotFoundError) as err:
        client.chat.completions.create(model="gpt-9", messages=[{"role": "user", "content": "x"}])
    body = err.value.body
    assert body["code"] == "model_not_found"
    assert "smollm2-135m" in body["message"] and "tiny" in body["message"]


def test_malformed_json_is_400(fleet):
    resp = requests.post(
        fleet.base_url + "/chat/completions",
        data=b'{"model": "tiny", "messages": [',
        headers={"content-type": "application/json"},
        timeout=30,
    )
    assert resp.status_code == 400
    assert resp.json()["error"]["type"] == "invalid_request_error"
    assert resp.headers["x-rayfleet-replica"] == "gateway"


@pytest.mark.parametrize(
    "body, param",
    [
        ({"model": "tiny", "messages": "hello"}, "messages"),
        ({"model": 7, "messages": []}, "model"),
        ({"model": "tiny", "messages": [], "max_tokens": "ten"}, "max_tokens"),
        ({"model": "tiny", "messages": [], "stream": "yes"}, "stream"),
        ({"messages": []}, "model"),
    ],
)
def test_wrong_field_type_is_400_naming_the_field(fleet, body, param):
    resp = requests.post(fleet.base_url + "/chat/completions", json=body, timeout=30)
    assert resp.status_code == 400
    assert resp.json()["error"]["param"] == param


def test_engine_validation_errors_pass_through_as_400(client):
    with pytest.raises(openai.BadRequestError):
        client.completions.create(model="tiny", prompt="hi", max_tokens=5000)


def test_health_and_metrics(fleet, client):
    client.completions.create(model="tiny", prompt="hi", max_tokens=2)
    health = requests.get(fleet.url + "/health", timeout=10)
    assert health.status_code == 200
    assert health.json()["models"] == {"smollm2-135m": 1, "tiny": 1}
    metrics = requests.get(fleet.url + "/metrics", timeout=10).text
    assert re.search(
        r'rayfleet_requests_total\{model="tiny",replica="tiny#\w+",status="200"\} [1-9]', metrics
    )
    assert 'rayfleet_time_to_first_byte_seconds_bucket{le="0.005",model="tiny"' in metrics
    assert "rayfleet_inflight_requests" in metrics


def test_status_shows_nodes_models_replicas(fleet):
    report = fleet.status()
    assert report["phase"] == "ready"
    assert report["models"] == {"smollm2-135m": 1, "tiny": 1}
    assert len(report["nodes"]) == 1 and report["nodes"][0]["alive"]
    replicas = {r["model"]: r for r in report["replicas"]}
    assert replicas["tiny"]["healthy"] and replicas["tiny"]["url"].startswith("http://127.0.0.1:")
    assert replicas["tiny"]["inflight"] == 0
    table = fleet.cli("status").stdout
    assert "tiny#" in table and "smollm2-135m" in table


def test_client_disconnect_aborts_the_upstream_request(fleet):
    # The demo model makes ~20 tokens/s here: 1500 tokens would take over a minute.
    replica = next(r for r in fleet.status()["replicas"] if r["model"] == "smollm2-135m")
    running = lambda: engine_gauge(replica["url"], "vllm:num_requests_running")  # noqa: E731
    generated = lambda: engine_gauge(replica["url"], "vllm:generation_tokens_total")  # noqa: E731
    before = generated()
    body = {
        "model": "smollm2-135m",
        "prompt": "Once upon a time",
        "max_tokens": 1500,
        "ignore_eos": True,
        "stream": True,
    }
    with requests.post(fleet.base_url + "/completions", json=body, stream=True, timeout=30) as resp:
        assert resp.status_code == 200
        lines = resp.iter_lines()
        for _ in range(3):
            next(lines)
        assert wait_until(lambda: running() == 1, 10), "the engine is not running the request"
    # The client has closed its connection: the engine must drop the request.
    assert wait_until(lambda: running() == 0, 20), "the engine kept generating after disconnect"
    assert generated() - before < 300
