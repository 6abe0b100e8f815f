"""Bad input through the real gateway: every case answered with OpenAI's error JSON and the
right status, never a 5xx or a traceback, and the gateway still serving afterwards.

Requests go over raw sockets (hostile.exchange) so that bodies and heads no HTTP client
would send reach the gateway as they are. The upstream records what it got: a refused
request must never reach it.
"""

from __future__ import annotations

import asyncio
import json
import logging

import pytest
from aiohttp import web

from rayfleet.config import parse_fleet
from rayfleet.gateway.limits import Limits
from rayfleet.gateway.policies import Policies
from rayfleet.gateway.validate import INPUT_FIELDS, OPTIONAL_FIELDS
from tests.unit.hostile import (
    ROUTES,
    assert_openai_error,
    exchange,
    post,
    read_answer,
    serving,
    still_serving,
)

# one value of each JSON type, to send where that type is not allowed
VALUES = {
    "string": "x",
    "integer": 3,
    "number": 1.5,
    "boolean": True,
    "array": [1],
    "object": {"a": 1},
}
INPUT = {"/v1/chat/completions": [{"role": "user", "content": "hi"}]}


def good_body(path: str) -> dict:
    field, _ = INPUT_FIELDS[path]
    return {"model": "m", field: INPUT.get(path, "hi")}


def wrong_types() -> list[tuple[str, str, object]]:
    """(route, field, a value of a type the field does not take) for every field of
    every route's schema."""
    cases = []
    for path in ROUTES:
        field, allowed = INPUT_FIELDS[path]
        fields = {"model": ("string",), field: allowed, **OPTIONAL_FIELDS}
        for name, types in fields.items():
            for json_type, value in VALUES.items():
                integral = json_type == "integer" and "number" in types
                if json_type not in types and not integral:
                    cases.append((path, name, value))
    return cases


def run(scenario, **kwargs):
    async def main():
        async with serving(**kwargs) as served:
            result = await scenario(served)
            reached = list(served.upstream.requests)
            await still_serving(served)
            return result, reached

    return asyncio.run(main())


@pytest.fixture(autouse=True)
def no_error_logged(caplog):
    """A client's bad request is not the gateway's error: nothing logged at ERROR."""
    with caplog.at_level(logging.INFO):
        yield
    assert [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR] == []


@pytest.mark.parametrize("path", ROUTES)
@pytest.mark.parametrize(
    "raw",
    [b"{not json", b"", b"[1, 2]", b'"text"', b"3", b"null", b'{"model": "m",}', b"\xff\xfe{}"],
)
def test_malformed_or_non_object_json_is_400(path, raw):
    async def scenario(served):
        return assert_openai_error(await exchange(served, post(path, raw)), 400)

    error, reached = run(scenario)
    assert error["type"] == "invalid_request_error" and reached == []


@pytest.mark.parametrize("path, field, value", wrong_types())
def test_every_field_of_every_schema_refuses_a_wrong_type(path, field, value):
    async def scenario(served):
        body = {**good_body(path), field: value}
        answer = await exchange(served, post(path, json.dumps(body).encode()))
        return assert_openai_error(answer, 400)

    error, reached = run(scenario)
    assert error["param"] == field and f"'{field}'" in error["message"]
    assert reached == []


@pytest.mark.parametrize("path", ROUTES)
def test_missing_input_or_model_is_400_naming_it(path):
    field, _ = INPUT_FIELDS[path]

    async def scenario(served):
        errors = []
        for missing in ("model", field):
            body = {k: v for k, v in good_body(path).items() if k != missing}
            answer = await exchange(served, post(path, json.dumps(body).encode()))
            errors.append(assert_openai_error(answer, 400)["param"])
        return errors

    params, reached = run(scenario)
    assert params == ["model", field] and reached == []


def test_unknown_model_is_404_and_stream_as_a_string_is_400():
    async def scenario(served):
        path = "/v1/chat/completions"
        unknown = await exchange(served, post(path, b'{"model": "nope", "messages": []}'))
        stream = {**good_body(path), "stream": "true"}
        as_string = await exchange(served, post(path, json.dumps(stream).encode()))
        return assert_openai_error(unknown, 404), assert_openai_error(as_string, 400)

    (unknown, as_string), reached = run(scenario)
    assert "nope" in unknown["message"] and as_string["param"] == "stream"
    assert reached == []


@pytest.mark.parametrize("path", ROUTES)
def test_deep_nesting_is_400_not_a_500(path):
    field, _ = INPUT_FIELDS[path]
    depth = 20_000
    raw = b'{"model": "m", "%b": %b%b}' % (field.encode(), b"[" * depth, b"]" * depth)

    async def scenario(served):
        return assert_openai_error(await exchange(served, post(path, raw)), 400)

    error, reached = run(scenario)
    assert "nested too deeply" in error["message"] and reached == []


def test_a_prompt_of_one_megabyte_reaches_the_replica_whole():
    prompt = "word " * (1024 * 1024 // 5)

    async def scenario(served):
        body = json.dumps({"model": "m", "prompt": prompt}).encode()
        answer = await exchange(served, post("/v1/completions", body))
        return answer.status

    status, reached = run(scenario)
    assert status == 200
    assert json.loads(reached[0][2])["prompt"] == prompt


def test_huge_n_and_max_tokens_over_the_caps_are_400():
    limits = Limits(max_n=8, max_tokens=100, check_context=False)

    async def scenario(served):
        errors = []
        for extra in ({"n": 10**12}, {"max_tokens": 10**12}, {"max_completion_tokens": 101}):
            body = {"model": "m", "prompt": "hi", **extra}
            answer = await exchange(served, post("/v1/completions", json.dumps(body).encode()))
            errors.append(assert_openai_error(answer, 400)["param"])
        return errors

    params, reached = run(scenario, policies=Policies(["m"], default_limits=limits))
    assert params == ["n", "max_tokens", "max_completion_tokens"] and reached == []


def test_a_declared_huge_body_is_413_before_it_is_read():
    cap = 1024 * 1024

    async def scenario(served):
        reader, writer = await asyncio.open_connection(served.host, served.port)
        # the head declares 1 GB; the body never comes, yet the answer does
        writer.write(
            b"POST /v1/completions HTTP/1.1\r\nHost: g\r\nContent-Type: application/json\r\n"
            b"Content-Length: %d\r\n\r\n{" % (1024**3)
        )
        answer = await read_answer(reader)
        writer.close()
        return answer

    policies = Policies(["m"], default_limits=Limits(max_body_bytes=cap, check_context=False))
    answer, reached = run(scenario, policies=policies)
    assert assert_openai_error(answer, 413)["code"] == "body_too_large"
    assert answer.closed and reached == []


def test_a_chunked_body_over_the_limit_is_413_and_the_connection_closed():
    cap = 256 * 1024

    async def scenario(served):
        reader, writer = await asyncio.open_connection(served.host, served.port)
        writer.write(
            b"POST /v1/completions HTTP/1.1\r\nHost: g\r\nContent-Type: application/json\r\n"
            b"Transfer-Encoding: chunked\r\n\r\n"
        )
        chunk = b"x" * 64 * 1024
        for _ in range(8):  # 512 KB, twice the limit, and no end
            writer.write(b"%x\r\n%b\r\n" % (len(chunk), chunk))
        await writer.drain()
        answer = await read_answer(reader)
        writer.close()
        return answer

    policies = Policies(["m"], default_limits=Limits(max_body_bytes=cap, check_context=False))
    answer, reached = run(scenario, policies=policies)
    assert_openai_error(answer, 413)
    assert answer.closed and reached == []


def test_the_default_limit_refuses_a_declared_body_over_64_megabytes():
    async def scenario(served):
        head = post("/v1/completions", b"")[: -len(b"Content-Length: 0\r\n\r\n")]
        answer = await exchange(served, head + b"Content-Length: %d\r\n\r\n" % (65 * 1024**2))
        return answer

    answer, reached = run(scenario)
    assert_openai_error(answer, 413)
    assert answer.closed and reached == []


@pytest.mark.parametrize(
    "head, status",
    [
        (b"X-Big: " + b"a" * 64 * 1024 + b"\r\n", 431),
        (b"".join(b"X-H%d: v\r\n" % i for i in range(500)), 431),
        (b"X-" + b"n" * 64 * 1024 + b": v\r\n", 431),
    ],
    ids=["64KB-header", "500-headers", "64KB-header-name"],
)
def test_header_over_the_limits_is_431(head, status):
    async def scenario(served):
        return await exchange(served, post("/v1/completions", b"{}", head))

    answer, reached = run(scenario)
    assert_openai_error(answer, status)
    assert answer.closed and reached == []


def test_a_request_line_of_64kb_is_414():
    async def scenario(served):
        line = b"GET /v1/models?" + b"a" * 64 * 1024 + b" HTTP/1.1\r\nHost: g\r\n\r\n"
        return await exchange(served, line)

    answer, _ = run(scenario)
    assert_openai_error(answer, 414)
    assert answer.closed


def test_garbage_instead_of_http_is_400_json():
    async def scenario(served):
        return await exchange(served, b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03\r\n\r\n")

    answer, _ = run(scenario)
    assert_openai_error(answer, 400)


def test_an_exception_escaping_a_handler_is_a_500_in_error_json(caplog):
    async def boom(_request: web.Request) -> web.StreamResponse:
        raise RuntimeError("a bug")

    async def scenario(served):
        return await exchange(served, b"GET /boom HTTP/1.1\r\nHost: g\r\n\r\n")

    answer, _ = run(scenario, extra_routes=[("GET", "/boom", boom)])
    error = assert_openai_error(answer, 500)
    assert "a bug" not in error["message"]  # internals stay in the log
    assert any("a bug" in str(r.exc_info) for r in caplog.records if r.levelno >= logging.ERROR)
    caplog.clear()  # logged at ERROR on purpose: a handler's bug is the gateway's error


@pytest.mark.parametrize("model", ["m", "auto"])
def test_lone_surrogates_in_a_prompt_a_route_counts_are_no_500(tiny_model, model):
    # JSON allows "\ud800"; the tokenizer refused the decoded text with a TypeError.
    rules = [
        {"name": "short", "target": "m", "prompt_tokens_below": 10},
        {"name": "rest", "target": "m"},
    ]
    config = {
        "gateway": {"routes": [{"name": "auto", "rules": rules}]},
        "models": [
            {"name": "m", "source": str(tiny_model), "engine_args": {"max_model_len": 4096}}
        ],
    }
    policies = Policies.from_fleet(parse_fleet(config))
    raw = b'{"model": "%b", "prompt": "%b"}' % (model.encode(), b"a\\ud800b " * 200)

    async def scenario(served):
        return await exchange(served, post("/v1/completions", raw))

    answer, reached = run(scenario, policies=policies)
    assert answer.status == 200, answer.body[:300]
    assert json.loads(reached[0][2])["prompt"].count("\ud800") == 200
