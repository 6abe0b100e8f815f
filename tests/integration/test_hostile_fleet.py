"""Hostile requests the engine itself must answer: the real gateway in front of a real vLLM
server on the tiny model (max_model_len 1024). Every answer below 500 and OpenAI's
error JSON when refused, and the engine still serving afterwards.

- ``max_tokens`` over the context: refused by the gateway's context check, and, with that
  check off, by vLLM, whose 400 passes through;
- a huge ``n``: the gateway's cap refuses it; with no cap, vLLM answers it below 500;
- ``stream`` as a string, a 20,000-deep body and invalid UTF-8 never reach the engine.
"""

from __future__ import annotations

import pytest
import requests

from tests.integration.test_gateway_policies import entry, make_gateway, serving

CHAT = "/v1/chat/completions"
MESSAGES = [{"role": "user", "content": "hello"}]


@pytest.fixture(scope="module")
def urls(tiny_model, vllm_tiny):
    """A gateway with its default checks and one with no context check and no caps."""
    checked = make_gateway(
        tiny_model, {"limits": {"max_n": 16}}, [entry("tiny", vllm_tiny.url)], ("tiny",)
    )
    open_ = make_gateway(
        tiny_model,
        {"limits": {"check_context": False}},
        [entry("tiny", vllm_tiny.url)],
        ("tiny",),
    )
    with serving(checked) as checked_url, serving(open_) as open_url:
        yield checked_url, open_url


def post(url: str, body: dict | bytes) -> requests.Response:
    if isinstance(body, bytes):
        return requests.post(
            url + CHAT, data=body, headers={"Content-Type": "application/json"}, timeout=120
        )
    return requests.post(url + CHAT, json=body, timeout=120)


def error_of(response: requests.Response, status: int) -> dict:
    assert response.status_code == status, response.text[:300]
    error = response.json()["error"]
    assert error["message"] and "Traceback" not in error["message"]
    return error


def still_serving(url: str) -> None:
    body = {"model": "tiny", "messages": MESSAGES, "max_tokens": 2}
    assert post(url, body).json()["choices"]


def test_max_tokens_over_the_context_is_400_from_the_gateway_or_the_engine(urls):
    checked, open_ = urls
    body = {"model": "tiny", "messages": MESSAGES, "max_tokens": 5000}
    assert error_of(post(checked, body), 400)["code"] == "context_length_exceeded"
    from_engine = post(open_, body)
    assert from_engine.headers["x-rayfleet-replica"] == "tiny#1"  # vLLM's own answer
    error_of(from_engine, 400)
    still_serving(open_)


def test_a_huge_n_is_refused_by_the_cap_and_answered_below_500_by_the_engine(urls):
    checked, open_ = urls
    body = {"model": "tiny", "messages": MESSAGES, "max_tokens": 1, "n": 10**9}
    assert error_of(post(checked, body), 400)["param"] == "n"
    answer = post(open_, body)
    assert answer.status_code < 500, answer.text[:300]
    if answer.status_code >= 400:
        error_of(answer, answer.status_code)
    still_serving(open_)


@pytest.mark.parametrize(
    "raw",
    [
        b'{"model": "tiny", "messages": [], "stream": "true"}',
        b'{"model": "tiny", "messages": ' + b"[" * 20_000 + b"]" * 20_000 + b"}",
        b'{"model": "tiny", "messages": [{"role": "user", "content": "\xff\xfe"}]}',
    ],
    ids=["stream-as-string", "deep-nesting", "invalid-utf8"],
)
def test_malformed_bodies_never_reach_the_engine(urls, raw):
    checked, _ = urls
    answer = post(checked, raw)
    error_of(answer, 400)
    assert answer.headers["x-rayfleet-replica"] == "gateway"
    still_serving(checked)
