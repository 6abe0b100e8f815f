"""``/openapi.json``: every route the gateway answers, request schemas that agree with the
validator, and every error in OpenAI's error JSON shape."""

from __future__ import annotations

import asyncio
import json

import jsonschema
import pytest
from aiohttp import web

from rayfleet.gateway.errors import RequestError, error_body
from rayfleet.gateway.validate import parse_request
from tests.unit.hostile import ROUTES, exchange, serving
from tests.unit.test_hostile_input import VALUES, good_body, wrong_types


async def _ok(_request: web.Request) -> web.Response:
    return web.json_response({})


def document() -> tuple[dict, set[tuple[str, str]]]:
    async def main():
        extra = [("POST", "/rayfleet/scale", _ok)]
        async with serving(extra_routes=extra) as served:
            answer = await exchange(served, b"GET /openapi.json HTTP/1.1\r\nHost: g\r\n\r\n")
            app = served.runner.app
            routes = {
                (route.method.lower(), route.resource.canonical)
                for route in app.router.routes()
                if route.method != "HEAD" and route.resource is not None
            }
            return answer.json(), routes

    return asyncio.run(main())


def test_every_route_the_gateway_answers_is_documented():
    doc, routes = document()
    assert doc["openapi"] == "3.1.0"
    documented = {(m, p) for p, ops in doc["paths"].items() for m in ops}
    assert routes == documented
    jsonschema.Draft202012Validator.check_schema(doc["components"]["schemas"]["Error"])


def test_every_error_answer_is_openai_error_json():
    doc, _ = document()
    error = doc["components"]["schemas"]["Error"]
    jsonschema.validate(error_body(400, "x", param="model"), error)
    for path, ops in doc["paths"].items():
        for op in ops.values():
            for status, answer in op["responses"].items():
                if int(status) < 400 or (path, status) == ("/health", "503"):  # a report
                    continue
                schema = answer["content"]["application/json"]["schema"]
                assert schema == {"$ref": "#/components/schemas/Error"}, (path, status)


@pytest.mark.parametrize("path", ROUTES)
def test_request_schemas_agree_with_the_validator(path):
    doc, _ = document()
    schema = doc["paths"][path]["post"]["requestBody"]["content"]["application/json"]["schema"]
    jsonschema.Draft202012Validator.check_schema(schema)
    good = {**good_body(path), "stream": None, "temperature": 1, "extra": VALUES}
    jsonschema.validate(good, schema)
    parse_request(path, json.dumps(good).encode())
    for case_path, field, value in wrong_types():
        if case_path != path:
            continue
        bad = {**good_body(path), field: value}
        with pytest.raises(jsonschema.ValidationError):
            jsonschema.validate(bad, schema)
        with pytest.raises(RequestError):
            parse_request(path, json.dumps(bad).encode())
