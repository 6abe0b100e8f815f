"""Keys and leaks, checked on the wire: the gateway with API keys in front of a recording
replica and a recording fallback provider.

A client's key must reach neither (the upstreams record every header and body they
got), must not be logged (every record of every logger, and the request log), and
must not show in /rayfleet/status, which also shows no provider key or URL and no prompt.
A key limited to one model reaches neither another model nor a route to it. Keys are
compared in constant time: every configured hash is compared, whichever matches.
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import logging

import aiohttp
import pytest

from rayfleet.config import parse_fleet
from rayfleet.gateway.access_log import close_access_log, open_access_log
from rayfleet.gateway.auth import hash_key
from rayfleet.gateway.errors import RequestError
from rayfleet.gateway.policies import Policies
from tests.unit.hostile import recording_upstream, serving

ALPHA, BETA = "sk-alpha-0123456789", "sk-beta-9876543210"
PROVIDER_KEY = "sk-provider-secret-55"
PROMPT = "a prompt nobody else may read 7f3a"


def policies(provider_url: str) -> Policies:
    gateway = {
        "api_keys": [
            {"name": "alpha", "key_sha256": hash_key(ALPHA)},
            {"name": "beta", "key_sha256": hash_key(BETA), "models": ["a"]},
        ],
        "routes": [
            {"name": "to-b", "rules": [{"name": "b", "target": "b"}]},
            {"name": "outside", "rules": [{"name": "p", "target": "fallback:p"}]},
        ],
        "fallback": {
            "providers": [
                {
                    "name": "p",
                    "base_url": provider_url + "/v1",
                    "api_key_env": "RF_HOSTILE_PROVIDER_KEY",
                    "default_model": "remote",
                }
            ]
        },
    }
    models = [{"name": name, "source": "/models/none"} for name in ("a", "b")]
    return Policies.from_fleet(parse_fleet({"gateway": gateway, "models": models}))


def run(scenario, monkeypatch):
    monkeypatch.setenv("RF_HOSTILE_PROVIDER_KEY", PROVIDER_KEY)

    async def main():
        async with recording_upstream() as (provider, provider_url):
            fleet = serving(("a", "b"), policies(provider_url))
            async with fleet as served, aiohttp.ClientSession(served.url) as client:
                return await scenario(served, provider, client)

    return asyncio.run(main())


def bearer(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


async def ask(client, model: str, key: str, stream: bool = False) -> tuple[int, dict]:
    body = {"model": model, "prompt": PROMPT, "stream": stream}
    async with client.post("/v1/completions", json=body, headers=bearer(key)) as response:
        text = await response.text()
        return response.status, {"text": text, "headers": dict(response.headers)}


def test_keys_reach_no_upstream_and_no_log(monkeypatch, caplog, tmp_path):
    async def scenario(served, provider, client):
        answers = [
            await ask(client, "a", ALPHA),
            await ask(client, "b", ALPHA, stream=True),
            await ask(client, "outside", ALPHA),
            await ask(client, "a", BETA),
        ]
        return answers, served.upstream.requests, provider.requests

    request_log = open_access_log(tmp_path / "access.log")
    try:
        with caplog.at_level(logging.DEBUG):
            answers, replica_got, provider_got = run(scenario, monkeypatch)
    finally:
        close_access_log(request_log)  # its lines held are written
    assert [status for status, _ in answers] == [200, 200, 200, 200]
    assert len(replica_got) == 3 and len(provider_got) == 1
    for _, headers, body in replica_got:
        assert "authorization" not in {h.lower() for h in headers}  # stripped
        wire = repr(headers) + body.decode()
        assert ALPHA not in wire and BETA not in wire and PROVIDER_KEY not in wire
    _, headers, body = provider_got[0]
    assert headers["Authorization"] == f"Bearer {PROVIDER_KEY}"  # its own key, only
    assert ALPHA not in repr(headers) + body.decode()
    logged = "\n".join(r.getMessage() + repr(r.args) for r in caplog.records)
    logged += (tmp_path / "access.log").read_text()
    assert logged.count('"path":"/v1/completions"') == 4  # the request log's lines
    assert ALPHA not in logged and BETA not in logged and PROVIDER_KEY not in logged


def test_a_key_limited_to_one_model_reaches_no_other_model_nor_a_route_to_it(monkeypatch):
    async def scenario(served, provider, client):
        answers = [await ask(client, m, BETA) for m in ("b", "to-b", "outside", "a")]
        wrong = await ask(client, "a", BETA + "x")
        return answers, wrong, len(served.upstream.requests), len(provider.requests)

    answers, wrong, num_replica, num_provider = run(scenario, monkeypatch)
    assert [status for status, _ in answers] == [403, 403, 403, 200]
    assert all('"model_not_allowed"' in a["text"] for _, a in answers[:3])
    assert wrong[0] == 401 and (num_replica, num_provider) == (1, 0)


def test_status_leaks_no_key_no_provider_and_no_prompt(monkeypatch):
    async def scenario(served, provider, client):
        await ask(client, "a", ALPHA)
        await ask(client, "outside", ALPHA)
        async with client.get("/rayfleet/status") as response:
            return response.status, await response.text()

    status, text = run(scenario, monkeypatch)
    assert status == 200 and '"replicas"' in text
    for secret in (ALPHA, BETA, PROVIDER_KEY, PROMPT, "sha256:", '/v1"', "remote"):
        assert secret not in text, secret


@pytest.mark.parametrize("sent", [ALPHA, BETA, "sk-wrong", ALPHA[:-1]])
def test_every_configured_hash_is_compared_whichever_matches(monkeypatch, sent):
    monkeypatch.setenv("RF_HOSTILE_PROVIDER_KEY", PROVIDER_KEY)
    table = policies("http://127.0.0.1:1").keys
    calls = []
    real = hmac.compare_digest

    def counting(a, b):
        calls.append((a, b))
        return real(a, b)

    monkeypatch.setattr(hmac, "compare_digest", counting)
    with contextlib.suppress(RequestError):  # a wrong key is a 401; the comparisons count
        table.authenticate(f"Bearer {sent}")
    assert len(calls) == 2  # both keys, whether the first, the second or neither matched


def test_without_gateway_keys_a_client_token_is_not_forwarded_but_a_model_key_is():
    """No gateway keys: the client's Authorization still stops at the gateway. A model
    whose vLLM servers take ``--api-key`` (its engine args) gets that key, and only it."""
    fleet = parse_fleet(
        {
            "models": [
                {"name": "a", "source": "/models/none", "engine_args": {"api-key": "sk-a-own"}},
                {"name": "b", "source": "/models/none"},
            ]
        }
    )

    async def main():
        async with serving(("a", "b"), Policies.from_fleet(fleet)) as served:
            async with aiohttp.ClientSession(served.url) as client:
                for model in ("a", "b"):
                    status, _ = await ask(client, model, ALPHA)
                    assert status == 200
            return served.upstream.requests

    (_, to_a, _), (_, to_b, _) = asyncio.run(main())
    assert to_a["Authorization"] == "Bearer sk-a-own"
    assert "authorization" not in {h.lower() for h in to_b}
    assert ALPHA not in repr(to_a) + repr(to_b)


def test_a_key_over_its_rate_is_refused_before_its_body_is_read():
    """A flooding key costs the gateway no body parse: a broken body past the key's rate
    is a 429 (with Retry-After), not the 400 that parsing it would give."""
    fleet = parse_fleet(
        {
            "gateway": {
                "api_keys": [
                    {"name": "flood", "key_sha256": hash_key(ALPHA), "requests_per_minute": 1}
                ]
            },
            "models": [{"name": "a", "source": "/models/none"}],
        }
    )

    async def main():
        policies = Policies.from_fleet(fleet)
        async with (
            serving(("a",), policies) as served,
            aiohttp.ClientSession(served.url) as client,
        ):
            first, _ = await ask(client, "a", ALPHA)
            broken = {"data": b"{not json", "headers": bearer(ALPHA)}
            async with client.post("/v1/completions", **broken) as response:
                return first, response.status, response.headers.get("Retry-After")

    first, second, retry_after = asyncio.run(main())
    assert first == 200 and second == 429 and retry_after is not None


def test_a_request_no_replica_could_take_costs_its_key_nothing():
    """A 503 for want of a replica gives the key back its request and tokens: once the
    model has a replica again, a key of one request a minute is served, not refused for
    the minute the gateway could not serve it."""
    limited = {"name": "one", "key_sha256": hash_key(ALPHA), "requests_per_minute": 1}
    limited["tokens_per_minute"] = 100_000
    fleet = parse_fleet(
        {"gateway": {"api_keys": [limited]}, "models": [{"name": "a", "source": "/models/none"}]}
    )

    async def main():
        async with (
            serving(("a",), Policies.from_fleet(fleet), listed=[]) as served,
            aiohttp.ClientSession(served.url) as client,
        ):
            statuses = [(await ask(client, "a", ALPHA))[0] for _ in range(3)]
            served.listed.append("a")  # the model's replica is back
            await served.gateway.refresh()
            ok, _ = await ask(client, "a", ALPHA)
            refused, answer = await ask(client, "a", ALPHA)  # its one request is spent now
            return statuses, ok, refused, answer["headers"].get("Retry-After")

    statuses, ok, refused, retry_after = asyncio.run(main())
    assert statuses == [503, 503, 503]
    assert ok == 200
    assert refused == 429 and retry_after is not None
