"""The gateway's OpenAPI 3.1 document, served at ``GET /openapi.json``.

``openapi_document(extra_paths)`` builds it from validate.py's tables (the request
schemas are what ``parse_request`` checks: the required model and input field, the
optional fields' types, anything else allowed and passed to the engine) and from
errors.py's status table (every error is OpenAI's error JSON). Fuzz tests draw requests
from these schemas, so a field the validator learns appears here without a second edit.
"""

from __future__ import annotations

from typing import Any

from rayfleet.gateway.errors import REPLICA_HEADER
from rayfleet.gateway.validate import INPUT_FIELDS, OPTIONAL_FIELDS

OPENAPI_PATH = "/openapi.json"

_ERROR_SCHEMA: dict[str, Any] = {
    "type": "object",
    "required": ["error"],
    "properties": {
        "error": {
            "type": "object",
            "required": ["message", "type", "param", "code"],
            "properties": {
                "message": {"type": "string"},
                "type": {"type": "string"},
                "param": {"type": ["string", "null"]},
                "code": {"type": ["string", "integer", "null"]},
            },
        }
    },
}

# status -> when the gateway answers it on the /v1 POST routes
_PROXY_ERRORS = {
    "400": "Malformed JSON, a missing or mistyped field, or a cap exceeded",
    "401": "Missing or wrong API key",
    "403": "The API key may not use this model",
    "404": "Unknown model or route",
    "408": "The body was not received in time, or the request ran out of time",
    "413": "Body larger than the limit (refused before it is read)",
    "429": "The API key is over a rate or concurrency limit (with Retry-After)",
    "502": "The replicas (and the fallback provider) failed before responding",
    "503": "No healthy replica and no fallback provider",
}
# answered by the HTTP layer on any route, before a handler runs
_PROTOCOL_ERRORS = {
    "414": "Request line longer than the limit",
    "431": "A header longer than the limit, or too many headers",
}

_SUMMARIES = {
    "/v1/chat/completions": "Chat completion, streamed as server-sent events when stream is true",
    "/v1/completions": "Text completion, streamed as server-sent events when stream is true",
    "/v1/embeddings": "Embeddings of a string or an array of inputs",
}


def request_schema(path: str) -> dict[str, Any]:
    """The JSON Schema of a /v1 POST route's body, as ``parse_request`` enforces it."""
    field, types = INPUT_FIELDS[path]
    properties: dict[str, Any] = {"model": {"type": "string"}, field: {"type": list(types)}}
    for name, allowed in OPTIONAL_FIELDS.items():
        properties[name] = {"type": [*allowed, "null"]}
    return {
        "type": "object",
        "required": ["model", field],
        "properties": properties,
        "additionalProperties": True,
    }


def _errors(statuses: dict[str, str]) -> dict[str, Any]:
    ref = {"$ref": "#/components/schemas/Error"}
    return {
        status: {"description": text, "content": {"application/json": {"schema": ref}}}
        for status, text in {**statuses, **_PROTOCOL_ERRORS}.items()
    }


def _answer(description: str, media: str = "application/json") -> dict[str, Any]:
    return {"description": description, "content": {media: {"schema": {}}}}


def _proxy_operation(path: str) -> dict[str, Any]:
    ok = _answer("The engine's answer; x-rayfleet-replica names who served it")
    ok["content"]["text/event-stream"] = {"schema": {"type": "string"}}
    return {
        "post": {
            "summary": _SUMMARIES[path],
            "security": [{"bearer": []}, {}],
            "requestBody": {
                "required": True,
                "content": {"application/json": {"schema": request_schema(path)}},
            },
            "responses": {"200": ok, **_errors(_PROXY_ERRORS)},
        }
    }


def _get(summary: str, answers: dict[str, Any], errors: dict[str, str]) -> dict[str, Any]:
    return {"get": {"summary": summary, "responses": {**answers, **_errors(errors)}}}


def openapi_document(extra_paths: list[tuple[str, str]] | None = None) -> dict[str, Any]:
    """The document; ``extra_paths`` are the fleet's admin routes as (method, path)."""
    paths: dict[str, Any] = {path: _proxy_operation(path) for path in INPUT_FIELDS}
    keyed = {"401": "Missing or wrong API key"}
    paths["/v1/models"] = _get("The models and routes served", {"200": _answer("A list")}, keyed)
    paths["/health"] = _get(
        "ok when every model has a healthy replica",
        {"200": _answer("ok"), "503": _answer("degraded: a model has no healthy replica")},
        keyed,
    )
    paths["/metrics"] = _get(
        "Prometheus metrics", {"200": _answer("Exposition text", "text/plain")}, keyed
    )
    paths["/rayfleet/status"] = _get("Replicas, health and load", {"200": _answer("Status")}, {})
    paths[OPENAPI_PATH] = _get("This document", {"200": _answer("OpenAPI 3.1")}, {})
    for method, path in extra_paths or []:
        operation: dict[str, Any] = {"summary": "Fleet administration", "responses": _errors(keyed)}
        paths.setdefault(path, {})[method.lower()] = {
            **operation,
            "responses": {"200": _answer("Done"), **operation["responses"]},
        }
    return {
        "openapi": "3.1.0",
        "info": {
            "title": "rayfleet gateway",
            "version": "1",
            "description": "OpenAI-compatible endpoint of a fleet of vLLM servers; every "
            f"answer names who served it in {REPLICA_HEADER}.",
        },
        "paths": paths,
        "components": {
            "schemas": {"Error": _ERROR_SCHEMA},
            "securitySchemes": {"bearer": {"type": "http", "scheme": "bearer"}},
        },
    }
