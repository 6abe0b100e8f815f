"""A schema fuzz of every /v1 route: zero 5xx over more than 2,000 generated requests.

The gateway serves its OpenAPI document; the request schemas are read from it over
HTTP (not imported), and Hypothesis draws bodies from them with hypothesis-jsonschema:
bodies the schema allows (the model mostly one the fleet serves, so they reach the
recording upstream) and mutations that break them (a field replaced by any JSON value,
a required field dropped, a body that is not an object, bytes that are not JSON).
Two gateways are fuzzed: a plain one, and one with every policy that reads the body
(the tiny model's tokenizer counting prompts for a route's rules, context length,
max_tokens, n and message caps, a priority class). Every answer must be below 500, and
every error OpenAI's error JSON. Runs repeat
(``derandomize``); the gateway runs in a thread of its own, requests go over one
keep-alive connection.

hypothesis-jsonschema 0.23.1 cannot draw an object on Hypothesis 6.170 (its object
strategy calls ``many.more``, an internal Hypothesis removed): ``from_request_schema``
draws each property's value with ``from_schema`` and builds the objects itself
(``fixed_dictionaries``, with the schema's required and optional properties, plus extra
ones as ``additionalProperties`` allows).
"""

from __future__ import annotations

import asyncio
import http.client
import json
import threading
from collections import Counter
from collections.abc import Iterator
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis_jsonschema import from_schema

from rayfleet.config import parse_fleet
from rayfleet.gateway.policies import Policies
from tests.unit.hostile import ROUTES, Served, serving

EXAMPLES_PER_STRATEGY = 350  # per gateway: 3 routes x 2 strategies x 350 = 2,100 requests
FUZZ = settings(
    max_examples=EXAMPLES_PER_STRATEGY,
    deadline=None,
    derandomize=True,
    database=None,
    suppress_health_check=[
        HealthCheck.function_scoped_fixture,
        HealthCheck.too_slow,
        HealthCheck.data_too_large,
    ],
)
STATUSES: dict[str, Counter[int]] = {"plain": Counter(), "policies": Counter()}

# strings with lone surrogates too: JSON's "\ud800" escapes decode to them
texts = st.text() | st.text(st.characters(categories=["Cs"]) | st.characters(), max_size=80)
json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | texts,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(), inner, max_size=4),
    max_leaves=12,
)


class Client:
    """Requests to the gateway over one keep-alive connection, reopened when it closes."""

    def __init__(self, host: str, port: int, name: str):
        self.host, self.port, self.name = host, port, name
        self.conn = http.client.HTTPConnection(host, port, timeout=30)

    def send(self, method: str, path: str, body: bytes | None = None) -> tuple[int, str, bytes]:
        headers = {"Content-Type": "application/json"} if body is not None else {}
        try:
            self.conn.request(method, path, body=body, headers=headers)
            response = self.conn.getresponse()
        except (http.client.HTTPException, ConnectionError):
            self.conn.close()
            self.conn = http.client.HTTPConnection(self.host, self.port, timeout=30)
            self.conn.request(method, path, body=body, headers=headers)
            response = self.conn.getresponse()
        data = response.read()
        if response.getheader("Connection", "").lower() == "close":
            self.conn.close()
        return response.status, response.getheader("Content-Type", ""), data


def policies_of(tiny_model: Any) -> Policies:
    gateway = {
        "limits": {"max_tokens": 64, "max_n": 4, "max_messages": 8},
        "priority_classes": [{"name": "batch", "priority": 5}],
        "default_priority_class": "batch",
        "routes": [
            {
                "name": "auto",
                "tokenizer": "m",
                "rules": [
                    {"name": "short", "target": "m", "prompt_tokens_below": 100},
                    {"name": "long", "target": "m"},
                ],
            }
        ],
    }
    model = {"name": "m", "source": str(tiny_model), "engine_args": {"max_model_len": 128}}
    return Policies.from_fleet(parse_fleet({"gateway": gateway, "models": [model]}))


@pytest.fixture(scope="module", params=["plain", "policies"])
def client(request: pytest.FixtureRequest, tiny_model: Any) -> Iterator[Client]:
    """The real gateway and a recording upstream on a loop in a thread, per gateway."""
    policies = policies_of(tiny_model) if request.param == "policies" else None
    loop = asyncio.new_event_loop()
    ready = threading.Event()
    held: dict[str, Any] = {}

    async def main() -> None:
        held["stop"] = asyncio.Event()
        async with serving(policies=policies) as served:
            held["served"] = served
            ready.set()
            await held["stop"].wait()

    thread = threading.Thread(target=loop.run_until_complete, args=(main(),), daemon=True)
    thread.start()
    assert ready.wait(30), "the gateway did not start"
    served: Served = held["served"]
    yield Client(served.host, served.port, request.param)
    loop.call_soon_threadsafe(held["stop"].set)
    thread.join(30)
    loop.close()


@pytest.fixture(scope="module")
def schemas(client: Client) -> dict[str, dict[str, Any]]:
    status, _, raw = client.send("GET", "/openapi.json")
    assert status == 200
    document = json.loads(raw)
    assert document["openapi"].startswith("3.1")
    return {
        path: document["paths"][path]["post"]["requestBody"]["content"]["application/json"][
            "schema"
        ]
        for path in ROUTES
    }


def check(client: Client, path: str, body: bytes) -> None:
    status, content_type, raw = client.send("POST", path, body)
    STATUSES[client.name][status] += 1
    assert status < 500, (status, body[:300], raw[:300])
    if status >= 400:
        assert content_type.startswith("application/json"), (status, raw[:300])
        error = json.loads(raw)["error"]
        assert set(error) == {"message", "type", "param", "code"}


json_objects = st.dictionaries(st.text(max_size=8), json_values, max_size=4)


def from_property_schema(schema: dict[str, Any]) -> st.SearchStrategy[Any]:
    types = schema["type"] if isinstance(schema["type"], list) else [schema["type"]]
    others = [t for t in types if t != "object"]
    drawn = from_schema({**schema, "type": others}) if others else st.nothing()
    return drawn | json_objects if "object" in types else drawn


def from_request_schema(schema: dict[str, Any]) -> st.SearchStrategy[dict[str, Any]]:
    """Objects valid under a request schema of /openapi.json."""
    assert schema["type"] == "object"
    properties = {name: from_property_schema(s) for name, s in schema["properties"].items()}
    required = {name: properties[name] for name in schema["required"]}
    optional = {name: s for name, s in properties.items() if name not in required}
    known = st.fixed_dictionaries(required, optional=optional)
    if not schema.get("additionalProperties", True):
        return known
    extra = st.dictionaries(
        st.text(max_size=8).filter(lambda k: k not in properties), json_values, max_size=3
    )
    return st.tuples(known, extra).map(lambda t: {**t[1], **t[0]})


def valid_bodies(schema: dict[str, Any]) -> st.SearchStrategy[dict[str, Any]]:
    served_model = st.sampled_from(["m", "m", "auto", "other"])
    return st.tuples(from_request_schema(schema), served_model).map(
        lambda b: {**b[0], "model": b[1]}
    )


def broken_bodies(schema: dict[str, Any]) -> st.SearchStrategy[bytes]:
    fields = sorted(schema["properties"])
    replaced = st.tuples(valid_bodies(schema), st.sampled_from(fields), json_values).map(
        lambda t: {**t[0], t[1]: t[2]}
    )
    dropped = st.tuples(valid_bodies(schema), st.sampled_from(schema["required"])).map(
        lambda t: {k: v for k, v in t[0].items() if k != t[1]}
    )
    as_json = (replaced | dropped | json_values).map(lambda v: json.dumps(v).encode())
    return as_json | st.binary(max_size=200)


@pytest.mark.parametrize("path", ROUTES)
def test_bodies_the_schema_allows_get_no_5xx(client, schemas, path):
    @FUZZ
    @given(body=valid_bodies(schemas[path]))
    def fuzz(body: dict[str, Any]) -> None:
        check(client, path, json.dumps(body).encode())

    fuzz()


@pytest.mark.parametrize("path", ROUTES)
def test_bodies_that_break_the_schema_get_no_5xx(client, schemas, path):
    @FUZZ
    @given(body=broken_bodies(schemas[path]))
    def fuzz(body: bytes) -> None:
        check(client, path, body)

    fuzz()


def test_over_2000_requests_were_fuzzed_and_the_gateway_still_serves(client):
    # The counts come from the tests above, run before this one in this module.
    statuses = STATUSES[client.name]
    assert sum(statuses.values()) >= 2000, STATUSES
    assert statuses[200] > 0 and statuses[400] > 0 and statuses[404] > 0, STATUSES
    body = json.dumps({"model": "m", "prompt": "after"}).encode()
    assert client.send("POST", "/v1/completions", body)[0] == 200
