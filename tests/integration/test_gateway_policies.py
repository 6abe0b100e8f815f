"""Gateway policies against real vLLM servers: limits, routes, fallback, priorities,
timeouts, API keys and quotas, per-replica protection, client disconnects.

No Ray: each test module builds ``Gateway(models, source, policies=...)`` directly,
with a static registry of entries pointing at real vLLM servers, and serves it in a
thread of the test process. Two vLLM servers on the tiny model, shared by every test:
``vllm_tiny`` (session, FCFS, served as ``tiny``) and ``prio`` (this module: the demo
model, which makes ~20 tokens/s here so that timeouts and disconnects happen mid-way
whatever the machine's load; priority scheduling, one sequence at a time so that
requests queue; served as ``tiny-prio``), which also plays the external "fallback
provider". The gateway counts tokens with the tiny model's tokenizer for both names.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import subprocess
import sys
import threading
import time
from datetime import UTC, datetime, timedelta

import openai
import pytest
import requests

from rayfleet.config import parse_fleet
from rayfleet.control.engine import free_port
from rayfleet.control.state import RunState
from rayfleet.gateway.app import Gateway
from rayfleet.gateway.auth import hash_key
from rayfleet.gateway.policies import Policies
from rayfleet.gateway.server import start_gateway
from tests.integration.fleet import engine_gauge, serving_engine

pytestmark = pytest.mark.integration

PRIO_ARGS = {
    "enforce_eager": True,
    "max_model_len": 2048,
    "dtype": "float32",
    "scheduling_policy": "priority",
    "max_num_seqs": 1,
}


def static_source(entries: list[dict]):
    async def source() -> list[dict]:
        return entries

    return source


def entry(model: str, url: str, replica_id: str = "") -> dict:
    return {"replica_id": replica_id or f"{model}#1", "model": model, "url": url}


@contextlib.contextmanager
def serving(gateway: Gateway):
    port = free_port()
    loop = asyncio.new_event_loop()
    ready = threading.Event()
    failure: list[BaseException] = []

    def run() -> None:
        asyncio.set_event_loop(loop)
        try:
            runner = loop.run_until_complete(start_gateway(gateway, "127.0.0.1", port))
        except BaseException as exc:  # reported to the test below
            failure.append(exc)
            ready.set()
            return
        ready.set()
        loop.run_forever()
        loop.run_until_complete(runner.cleanup())
        loop.close()

    thread = threading.Thread(target=run, name="gateway", daemon=True)
    thread.start()
    if not ready.wait(120):
        raise TimeoutError("the gateway did not start within 120 s")
    if failure:
        raise failure[0]
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        loop.call_soon_threadsafe(loop.stop)
        thread.join(60)


def wait_for(predicate, timeout_s: float, poll_s: float = 0.05) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(poll_s)
    return False


# -- fixtures ----------------------------------------------------------------------------


@pytest.fixture(scope="module")
def prio(demo_model):
    """vLLM with the priority scheduler and one sequence at a time: requests queue."""
    with serving_engine(demo_model, "tiny-prio", PRIO_ARGS, timeout_s=900) as engine:
        yield engine


def make_gateway(tiny_model, gateway: dict, entries: list[dict], names, clock=None) -> Gateway:
    models = [
        {"name": n, "source": str(tiny_model), "engine_args": {"max_model_len": 1024}}
        for n in names
    ]
    policies = Policies.from_fleet(parse_fleet({"gateway": gateway, "models": models}), clock=clock)
    return Gateway(list(names), static_source(entries), policies=policies, poll_interval_s=0.2)


def hhmm(moment: datetime) -> str:
    return moment.strftime("%H:%M")


def idle(engine) -> None:
    """Wait until the engine runs and queues nothing (earlier tests left no work behind)."""
    assert wait_for(
        lambda: (
            not any(
                engine_gauge(engine.url, k)
                for k in ("vllm:num_requests_running", "vllm:num_requests_waiting")
            )
        ),
        120,
    ), "engine still busy"


@pytest.fixture(scope="module")
def main_url(tiny_model, vllm_tiny, prio):
    now = datetime.now(UTC)
    backup = {
        "name": "backup",
        "base_url": prio.url + "/v1",
        "api_key_env": "RF_TEST_BACKUP_KEY",
        "default_model": "tiny-prio",
    }
    gateway = {
        "timezone": "UTC",
        "limits": {"max_tokens": 256, "max_n": 2, "max_body_bytes": 20000, "max_messages": 8},
        "model_limits": {
            "clamped": {"max_tokens": 16, "max_tokens_action": "clamp"},
            "tiny-prio": {"max_tokens": 1000},
        },
        "priority_classes": [
            {"name": "high", "priority": -10},
            {"name": "low", "priority": 10},
            {"name": "brief", "priority": 0, "timeout_s": 2.0},
            {"name": "impatient", "priority": 0, "stream_idle_timeout_s": 0.3},
        ],
        "fallback": {"providers": [backup]},
        "routes": [
            {
                "name": "auto",
                "rules": [
                    {"name": "vip", "target": "tiny-prio", "priority_classes": ["high"]},
                    {"name": "short", "target": "tiny", "prompt_tokens_below": 20},
                    {"name": "long", "target": "tiny-prio"},
                ],
            },
            {
                "name": "night",
                "rules": [
                    {
                        "name": "off-peak",
                        "target": "fallback:backup",
                        "time_of_day": {
                            "from": hhmm(now - timedelta(hours=1)),
                            "to": hhmm(now + timedelta(hours=1)),
                        },
                    },
                    {"name": "day", "target": "tiny"},
                ],
            },
            {
                "name": "daytime",
                "rules": [
                    {
                        "name": "off-peak",
                        "target": "fallback:backup",
                        "time_of_day": {
                            "from": hhmm(now + timedelta(hours=2)),
                            "to": hhmm(now + timedelta(hours=3)),
                        },
                    },
                    {"name": "day", "target": "tiny"},
                ],
            },
            {
                "name": "down-first",
                "rules": [
                    {"name": "ghost-first", "target": "ghost"},
                    {"name": "then-tiny", "target": "tiny"},
                ],
            },
            {
                "name": "all-down",
                "fallback": "backup",
                "rules": [{"name": "only-ghost", "target": "ghost"}],
            },
            {"name": "clamped", "rules": [{"name": "all", "target": "tiny"}]},
        ],
    }
    entries = [
        entry("tiny", vllm_tiny.url),
        entry("tiny-prio", prio.url),
        entry("flaky", f"http://127.0.0.1:{free_port()}"),
    ]
    os.environ["RF_TEST_BACKUP_KEY"] = "provider-secret"
    try:
        gw = make_gateway(tiny_model, gateway, entries, ("tiny", "tiny-prio", "ghost", "flaky"))
    finally:
        del os.environ["RF_TEST_BACKUP_KEY"]
    with serving(gw) as url:
        yield url


@pytest.fixture(scope="module")
def client(main_url):
    return openai.OpenAI(base_url=main_url + "/v1", api_key="unused", max_retries=0)


def raw_completion(client, **kwargs):
    return client.completions.with_raw_response.create(**kwargs)


# -- limits ------------------------------------------------------------------------------


def _refused(resp, status: int) -> dict:
    assert resp.status_code == status, resp.text
    assert resp.headers["x-rayfleet-replica"] == "gateway"
    error = resp.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    return error


def test_max_tokens_over_the_cap_is_400_stating_it(main_url, client):
    with pytest.raises(openai.BadRequestError) as err:
        client.completions.create(model="tiny", prompt="hi", max_tokens=300)
    assert "the limit for 'tiny' is 256" in err.value.body["message"]
    assert err.value.response.headers["x-rayfleet-replica"] == "gateway"
    # the per-model cap of tiny-prio is higher than the global one
    with pytest.raises(openai.BadRequestError) as err:
        client.completions.create(model="tiny-prio", prompt="hi", max_tokens=1001)
    assert "the limit for 'tiny-prio' is 1000" in err.value.body["message"]


def test_max_tokens_clamped_where_configured(client):
    raw = raw_completion(
        client, model="clamped", prompt="hi", max_tokens=200, extra_body={"ignore_eos": True}
    )
    assert raw.parse().usage.completion_tokens == 16
    assert raw.headers["x-rayfleet-route"] == "all"


def test_n_messages_and_body_caps(main_url):
    url = main_url + "/v1"
    error = _refused(
        requests.post(
            url + "/completions", json={"model": "tiny", "prompt": "hi", "n": 3}, timeout=30
        ),
        400,
    )
    assert error["param"] == "n" and "limit for 'tiny' is 2" in error["message"]
    messages = [{"role": "user", "content": "hi"}] * 9
    error = _refused(
        requests.post(
            url + "/chat/completions", json={"model": "tiny", "messages": messages}, timeout=30
        ),
        400,
    )
    assert "9 messages; the limit for 'tiny' is 8" in error["message"]
    error = _refused(
        requests.post(
            url + "/completions", json={"model": "tiny", "prompt": "x" * 30000}, timeout=30
        ),
        413,
    )
    assert "limit is 20000 bytes" in error["message"]


def test_context_overflow_is_refused_before_the_engine(client, vllm_tiny):
    before = engine_gauge(vllm_tiny.url, "vllm:generation_tokens_total")
    with pytest.raises(openai.BadRequestError) as err:
        client.completions.create(model="tiny", prompt="hello world " * 600, max_tokens=200)
    body = err.value.body
    assert body["code"] == "context_length_exceeded"
    assert "maximum context length is 1024 tokens" in body["message"]
    assert "plus max_tokens 200" in body["message"]
    assert err.value.response.headers["x-rayfleet-replica"] == "gateway"
    assert engine_gauge(vllm_tiny.url, "vllm:generation_tokens_total") == before


# -- routes ------------------------------------------------------------------------------


def test_route_by_prompt_length_and_priority_class(main_url, client):
    short = raw_completion(client, model="auto", prompt="hi", max_tokens=2)
    assert short.headers["x-rayfleet-route"] == "short"
    assert short.headers["x-rayfleet-replica"] == "tiny#1" and short.parse().model == "tiny"
    long = raw_completion(client, model="auto", prompt="hello world " * 40, max_tokens=2)
    assert long.headers["x-rayfleet-route"] == "long"
    assert long.headers["x-rayfleet-replica"] == "tiny-prio#1"
    vip = client.chat.completions.with_raw_response.create(
        model="auto",
        messages=[{"role": "user", "content": "hi"}],
        max_tokens=2,
        extra_headers={"x-rayfleet-priority": "high"},
    )
    assert vip.headers["x-rayfleet-route"] == "vip" and vip.parse().model == "tiny-prio"
    metrics = requests.get(main_url + "/metrics", timeout=10).text
    assert 'rayfleet_route_decisions_total{route="auto",rule="short",target="tiny"} 1.0' in metrics


def test_route_by_time_of_day(client):
    night = raw_completion(client, model="night", prompt="hi", max_tokens=2)
    assert night.headers["x-rayfleet-route"] == "off-peak"
    assert night.headers["x-rayfleet-replica"] == "fallback:backup"
    assert night.parse().model == "tiny-prio"
    day = raw_completion(client, model="daytime", prompt="hi", max_tokens=2)
    assert (
        day.headers["x-rayfleet-route"] == "day" and day.headers["x-rayfleet-replica"] == "tiny#1"
    )


def test_unavailable_target_falls_through_then_to_fallback(client):
    through = raw_completion(client, model="down-first", prompt="hi", max_tokens=2)
    assert through.headers["x-rayfleet-route"] == "then-tiny"
    assert through.headers["x-rayfleet-replica"] == "tiny#1"
    fallback = raw_completion(client, model="all-down", prompt="hi", max_tokens=2)
    assert fallback.headers["x-rayfleet-route"] == "fallback"
    assert fallback.headers["x-rayfleet-replica"] == "fallback:backup"


def test_models_list_names_routes(client):
    ids = {m.id for m in client.models.list().data}
    assert {"tiny", "tiny-prio", "auto", "night", "all-down"} <= ids


# -- fallback provider -------------------------------------------------------------------


def test_model_without_replica_goes_to_the_provider(client):
    raw = client.chat.completions.with_raw_response.create(
        model="ghost", messages=[{"role": "user", "content": "hi"}], max_tokens=4
    )
    assert raw.headers["x-rayfleet-replica"] == "fallback:backup"
    assert raw.parse().choices[0].message.content is not None


def test_failure_before_first_byte_goes_to_the_provider_streaming(main_url, client):
    stream = client.completions.create(
        model="flaky", prompt="hi", max_tokens=8, stream=True, extra_body={"ignore_eos": True}
    )
    chunks = list(stream)
    assert stream.response.headers["x-rayfleet-replica"] == "fallback:backup"
    assert sum(len(c.choices[0].text) > 0 for c in chunks if c.choices) >= 4
    metrics = requests.get(main_url + "/metrics", timeout=10).text
    assert (
        'rayfleet_fallback_requests_total{model="flaky",provider="backup",reason="failure"}'
        in metrics
    )


# -- priorities and timeouts -------------------------------------------------------------


def test_high_priority_overtakes_queued_low_priority(client, prio):
    idle(prio)
    finished: list[str] = []
    lock = threading.Lock()

    def send(label: str, priority_class: str, max_tokens: int) -> None:
        client.completions.create(
            model="tiny-prio",
            prompt="hi",
            max_tokens=max_tokens,
            extra_body={"ignore_eos": True},
            extra_headers={"x-rayfleet-priority": priority_class},
        )
        with lock:
            finished.append(label)

    def start(*args) -> threading.Thread:
        thread = threading.Thread(target=send, args=args)
        thread.start()
        return thread

    threads = [start("low-1", "low", 30)]
    assert wait_for(lambda: engine_gauge(prio.url, "vllm:num_requests_running") == 1, 30)
    threads += [start("low-2", "low", 30), start("low-3", "low", 30)]
    assert wait_for(lambda: engine_gauge(prio.url, "vllm:num_requests_waiting") == 2, 30)
    threads.append(start("high", "high", 4))
    for thread in threads:
        thread.join(300)
    assert len(finished) == 4
    # FCFS would finish it last; the priority scheduler runs it before both queued lows.
    assert finished.index("high") <= 1, finished
    assert {"low-2", "low-3"} <= set(finished[finished.index("high") + 1 :]), finished


def test_total_timeout_is_408_and_aborts_the_engine_request(main_url, prio):
    idle(prio)
    started = time.monotonic()
    resp = requests.post(
        main_url + "/v1/completions",
        json={"model": "tiny-prio", "prompt": "hi", "max_tokens": 1000, "ignore_eos": True},
        headers={"x-rayfleet-priority": "brief"},
        timeout=60,
    )
    error = _refused(resp, 408)
    assert error["code"] == "timeout" and "priority class 'brief'" in error["message"]
    assert time.monotonic() - started < 15
    assert wait_for(lambda: not engine_gauge(prio.url, "vllm:num_requests_running"), 20)


def test_total_timeout_ends_a_stream_with_an_error_event(main_url, prio):
    idle(prio)
    started = time.monotonic()
    with requests.post(
        main_url + "/v1/completions",
        json={
            "model": "tiny-prio",
            "prompt": "hi",
            "max_tokens": 1000,
            "ignore_eos": True,
            "stream": True,
        },
        headers={"x-rayfleet-priority": "brief"},
        stream=True,
        timeout=60,
    ) as resp:
        assert resp.status_code == 200
        events, first_at = [], None
        for line in resp.iter_lines():
            if line.startswith(b"data: "):
                first_at = first_at or time.monotonic() - started
                events.append(line)
    assert events[-1] == b"data: [DONE]"
    last = json.loads(events[-2][len(b"data: ") :])
    assert last["error"]["code"] == "timeout"
    assert 1 < len(events) - 2 < 1000, f"not started and cut short: first event at {first_at} s"
    assert wait_for(lambda: not engine_gauge(prio.url, "vllm:num_requests_running"), 20)


def test_stream_idle_timeout_on_a_queued_request(main_url, prio):
    idle(prio)
    busy = {
        "model": "tiny-prio",
        "prompt": "hi",
        "max_tokens": 500,
        "ignore_eos": True,
        "stream": True,
    }
    with requests.post(main_url + "/v1/completions", json=busy, stream=True, timeout=60) as held:
        lines = held.iter_lines()  # kept: a dropped iterator closes the connection
        next(lines)  # it runs; the engine takes one sequence at a time
        resp = requests.post(
            main_url + "/v1/completions",
            json={"model": "tiny-prio", "prompt": "hi", "max_tokens": 5},
            headers={"x-rayfleet-priority": "impatient"},
            timeout=60,
        )
        error = _refused(resp, 408)
        assert "0.3 s without output" in error["message"]
    assert wait_for(lambda: not engine_gauge(prio.url, "vllm:num_requests_waiting"), 20)


def test_client_disconnect_aborts_the_engine_request(main_url, prio):
    idle(prio)
    before = engine_gauge(prio.url, "vllm:generation_tokens_total")
    body = {
        "model": "tiny-prio",
        "prompt": "hi",
        "max_tokens": 1000,
        "ignore_eos": True,
        "stream": True,
    }
    with requests.post(
        main_url + "/v1/completions",
        json=body,
        stream=True,
        timeout=30,
        headers={"x-rayfleet-priority": "low"},
    ) as resp:
        assert resp.status_code == 200
        lines = resp.iter_lines()
        for _ in range(3):
            next(lines)
        assert engine_gauge(prio.url, "vllm:num_requests_running") == 1
    assert wait_for(lambda: not engine_gauge(prio.url, "vllm:num_requests_running"), 20)
    assert engine_gauge(prio.url, "vllm:generation_tokens_total") - before < 300


# -- queue depth -------------------------------------------------------------------------


def test_every_replica_over_queue_depth_goes_to_the_provider(tiny_model, prio, vllm_tiny):
    idle(prio)
    gateway = {
        "fallback": {
            "max_queue_depth": 1,
            "providers": [
                {"name": "spare", "base_url": vllm_tiny.url + "/v1", "default_model": "tiny"}
            ],
        }
    }
    gw = make_gateway(tiny_model, gateway, [entry("tiny-prio", prio.url)], ("tiny-prio",))
    with serving(gw) as url:
        body = {
            "model": "tiny-prio",
            "prompt": "hi",
            "max_tokens": 600,
            "ignore_eos": True,
            "stream": True,
        }
        with requests.post(url + "/v1/completions", json=body, stream=True, timeout=60) as held:
            assert held.headers["x-rayfleet-replica"] == "tiny-prio#1"
            lines = held.iter_lines()  # kept: a dropped iterator closes the connection
            next(lines)
            second = requests.post(
                url + "/v1/completions",
                json={"model": "tiny-prio", "prompt": "hi", "max_tokens": 2},
                timeout=60,
            )
            assert second.status_code == 200
            assert second.headers["x-rayfleet-replica"] == "fallback:spare"
            assert second.json()["model"] == "tiny"
        metrics = requests.get(url + "/metrics", timeout=10).text
        assert 'provider="spare",reason="queue_depth"} 1.0' in metrics


# -- API keys and quotas -----------------------------------------------------------------


@pytest.fixture(scope="module")
def keyed_url(tiny_model, vllm_tiny, prio, tmp_path_factory):
    key_file = tmp_path_factory.mktemp("keys") / "beta.key"
    key_file.write_text("sk-beta\n")
    gateway = {
        "priority_classes": [{"name": "high", "priority": -10}],
        "routes": [
            {
                "name": "auto",
                "rules": [
                    {"name": "vip", "target": "tiny-prio", "priority_classes": ["high"]},
                    {"name": "rest", "target": "tiny"},
                ],
            }
        ],
        "api_keys": [
            {
                "name": "alpha",
                "key_sha256": hash_key("sk-alpha"),
                "models": ["tiny"],
                "requests_per_minute": 3,
            },
            {"name": "beta", "key_file": str(key_file), "max_concurrent": 1},
            {"name": "gamma", "key_sha256": hash_key("sk-gamma"), "priority_class": "high"},
            {"name": "delta", "key_sha256": hash_key("sk-delta"), "tokens_per_minute": 300},
        ],
        "open_metrics": False,
        "open_health": True,
    }
    gw = make_gateway(
        tiny_model,
        gateway,
        [entry("tiny", vllm_tiny.url), entry("tiny-prio", prio.url)],
        ("tiny", "tiny-prio"),
    )
    with serving(gw) as url:
        yield url


def keyed(url: str, key: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=url + "/v1", api_key=key, max_retries=0)


def test_no_key_or_wrong_key_is_401(keyed_url):
    error = _refused(
        requests.post(
            keyed_url + "/v1/completions", json={"model": "tiny", "prompt": "hi"}, timeout=30
        ),
        401,
    )
    assert error["type"] == "authentication_error"
    with pytest.raises(openai.AuthenticationError):
        keyed(keyed_url, "sk-wrong").completions.create(model="tiny", prompt="hi", max_tokens=2)
    assert _refused(requests.get(keyed_url + "/v1/models", timeout=30), 401)


def test_key_limited_to_its_models(keyed_url):
    with pytest.raises(openai.PermissionDeniedError) as err:
        keyed(keyed_url, "sk-alpha").completions.create(
            model="tiny-prio", prompt="hi", max_tokens=2
        )
    assert "may use: tiny" in err.value.body["message"]


def test_requests_per_minute_is_429_with_retry_after(keyed_url):
    alpha = keyed(keyed_url, "sk-alpha")
    for _ in range(3):
        alpha.completions.create(model="tiny", prompt="hi", max_tokens=2)
    with pytest.raises(openai.RateLimitError) as err:
        alpha.completions.create(model="tiny", prompt="hi", max_tokens=2)
    retry_after = int(err.value.response.headers["retry-after"])
    assert 1 <= retry_after <= 20
    assert err.value.response.headers["x-rayfleet-replica"] == "gateway"


def test_concurrent_requests_per_key_is_429(keyed_url):
    beta = keyed(keyed_url, "sk-beta")
    stream = beta.completions.create(
        model="tiny-prio", prompt="hi", max_tokens=300, stream=True, extra_body={"ignore_eos": True}
    )
    chunks = iter(stream)  # kept: a dropped iterator closes the connection
    try:
        next(chunks)
        with pytest.raises(openai.RateLimitError) as err:
            beta.completions.create(model="tiny", prompt="hi", max_tokens=2)
        assert "already has 1 requests in flight" in err.value.body["message"]
    finally:
        stream.close()
    assert wait_for(lambda: _accepted(beta), 30), "the slot was not given back"


def _accepted(client) -> bool:
    try:
        client.completions.create(model="tiny", prompt="hi", max_tokens=2)
        return True
    except openai.RateLimitError:
        return False


def test_tokens_per_minute_is_429(keyed_url):
    delta = keyed(keyed_url, "sk-delta")
    delta.completions.create(model="tiny", prompt="hi", max_tokens=200)
    with pytest.raises(openai.RateLimitError) as err:
        delta.completions.create(model="tiny", prompt="hi", max_tokens=200)
    assert "300 tokens per minute" in err.value.body["message"]
    assert int(err.value.response.headers["retry-after"]) >= 1


def test_key_priority_class_drives_routing(keyed_url):
    raw = keyed(keyed_url, "sk-gamma").completions.with_raw_response.create(
        model="auto", prompt="hi", max_tokens=2
    )
    assert raw.headers["x-rayfleet-route"] == "vip" and raw.parse().model == "tiny-prio"


def test_metrics_keyed_health_open_and_no_key_leaks(keyed_url):
    assert requests.get(keyed_url + "/health", timeout=10).status_code == 200
    _refused(requests.get(keyed_url + "/metrics", timeout=10), 401)
    metrics = requests.get(
        keyed_url + "/metrics", timeout=10, headers={"Authorization": "Bearer sk-gamma"}
    )
    assert metrics.status_code == 200
    assert 'rayfleet_api_key_requests_total{key="gamma"}' in metrics.text
    assert "sk-" not in metrics.text and 'reason="unauthorized"' in metrics.text


# -- per-replica protection --------------------------------------------------------------


def test_failing_replica_cools_down_and_status_shows_it(tiny_model, vllm_tiny, tmp_path):
    dead = entry("tiny", f"http://127.0.0.1:{free_port()}", "tiny#dead")
    gateway = {"replica_protection": {"max_consecutive_failures": 2, "cooldown_s": 2.0}}
    gw = make_gateway(tiny_model, gateway, [entry("tiny", vllm_tiny.url), dead], ("tiny",))
    with serving(gw) as url:

        def dead_state() -> dict:
            report = requests.get(url + "/rayfleet/status", timeout=10).json()
            return next(r for r in report["replicas"] if r["replica_id"] == "tiny#dead")

        client = openai.OpenAI(base_url=url + "/v1", api_key="unused", max_retries=0)
        for _ in range(8):  # every request succeeds: a failing pick is retried elsewhere
            assert client.completions.create(model="tiny", prompt="hi", max_tokens=2).choices
        state = dead_state()
        assert state["consecutive_failures"] == 2 and not state["healthy"]
        assert state["cooldown_remaining_s"] > 0

        home = tmp_path / "home"
        RunState(pid=os.getpid(), gateway_url=url, phase="ready").save(home / "run" / "fleet.json")
        shown = subprocess.run(
            [sys.executable, "-m", "rayfleet.cli", "status"],
            timeout=120,
            capture_output=True,
            text=True,
            env={**os.environ, "RAYFLEET_HOME": str(home), "COLUMNS": "200"},
        )
        line = next(ln for ln in shown.stdout.splitlines() if "tiny#dead" in ln)
        assert "cooling down" in line, shown.stdout

        assert wait_for(lambda: dead_state()["healthy"], 10)
        assert wait_for(
            lambda: (
                client.completions.create(model="tiny", prompt="hi", max_tokens=2)
                and not dead_state()["healthy"]
            ),
            30,
        )
        assert dead_state()["consecutive_failures"] == 3, "tried again, failed once, out again"
        metrics = requests.get(url + "/metrics", timeout=10).text
        assert 'rayfleet_replica_cooldowns_total{model="tiny",replica="tiny#dead"} 2.0' in metrics


# -- after the first byte: no replay -----------------------------------------------------


@contextlib.contextmanager
def cutting_relay(upstream_port: int, cut_after_bytes: int):
    """A TCP relay to a real vLLM server that drops both connections once it has passed
    ``cut_after_bytes`` of the response: a network fault in the middle of a stream."""
    import socket

    listener = socket.create_server(("127.0.0.1", 0))
    port = listener.getsockname()[1]
    stop = threading.Event()

    def pump(src, dst, limit=None):
        passed = 0
        try:
            while True:
                data = src.recv(4096)
                if not data:
                    break
                if limit is not None and passed + len(data) > limit:
                    dst.sendall(data[: limit - passed])
                    break
                dst.sendall(data)
                passed += len(data)
        except OSError:
            pass
        for s in (src, dst):
            with contextlib.suppress(OSError):
                s.shutdown(socket.SHUT_RDWR)
            s.close()

    def accept():
        listener.settimeout(0.2)
        while not stop.is_set():
            try:
                client, _ = listener.accept()
            except (TimeoutError, OSError):
                continue
            server = socket.create_connection(("127.0.0.1", upstream_port))
            threading.Thread(target=pump, args=(client, server), daemon=True).start()
            threading.Thread(
                target=pump, args=(server, client, cut_after_bytes), daemon=True
            ).start()

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        stop.set()
        thread.join(5)
        listener.close()


def test_stream_broken_after_first_byte_ends_with_error_not_replayed(tiny_model, vllm_tiny, prio):
    with cutting_relay(vllm_tiny.port, cut_after_bytes=3000) as relay:
        gateway = {
            "fallback": {
                "providers": [
                    {"name": "backup", "base_url": prio.url + "/v1", "default_model": "tiny-prio"}
                ]
            }
        }
        gw = make_gateway(tiny_model, gateway, [entry("tiny", relay, "tiny#cut")], ("tiny",))
        with serving(gw) as url:
            body = {
                "model": "tiny",
                "prompt": "hi",
                "max_tokens": 500,
                "ignore_eos": True,
                "stream": True,
            }
            with requests.post(url + "/v1/completions", json=body, stream=True, timeout=60) as resp:
                assert resp.status_code == 200
                assert resp.headers["x-rayfleet-replica"] == "tiny#cut"
                events = [line for line in resp.iter_lines() if line.startswith(b"data: ")]
            assert events[-1] == b"data: [DONE]"
            assert json.loads(events[-2][len(b"data: ") :])["error"]["code"] == "upstream_error"
            assert 2 < len(events) < 100
            metrics = requests.get(url + "/metrics", timeout=10).text
            assert "rayfleet_fallback_requests_total{" not in metrics, (
                "a broken stream was replayed"
            )
