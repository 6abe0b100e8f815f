"""Read what the gateway needs from a request body, once, and refuse malformed ones.

Only the fields the gateway acts on, or whose wrong type would otherwise reach the
engine as a 500, are checked here; vLLM validates the rest and its 400s pass
through unchanged.

The tables below name JSON Schema types ("string", "integer", ...): ``parse_request``
checks them and openapi.py publishes the same tables as the request schemas of
``/openapi.json``, so the document says exactly what the gateway refuses.
"""

from __future__ import annotations

import functools
import json
from dataclasses import dataclass
from typing import Any

from rayfleet.gateway.errors import RequestError

# endpoint path -> the field holding the input and the JSON types it may take
INPUT_FIELDS: dict[str, tuple[str, tuple[str, ...]]] = {
    "/v1/chat/completions": ("messages", ("array",)),
    "/v1/completions": ("prompt", ("string", "array")),
    "/v1/embeddings": ("input", ("string", "array")),
}

# optional fields the gateway reads (null counts as absent)
OPTIONAL_FIELDS: dict[str, tuple[str, ...]] = {
    "stream": ("boolean",),
    "max_tokens": ("integer",),
    "max_completion_tokens": ("integer",),
    "n": ("integer",),
    "temperature": ("number",),
    "top_p": ("number",),
    "stream_options": ("object",),
}

# JSON type -> the Python types json.loads gives for it (bool is an int in Python, and
# JSON true is not a valid max_tokens: booleans match "boolean" only)
_PYTHON_TYPES: dict[str, tuple[type, ...]] = {
    "string": (str,),
    "integer": (int,),
    "number": (int, float),
    "boolean": (bool,),
    "array": (list,),
    "object": (dict,),
}

_ARTICLES = {"array": "an", "integer": "an", "object": "an"}


@dataclass(frozen=True)
class ParsedRequest:
    model: str
    body: dict[str, Any]


def parse_request(path: str, raw: bytes) -> ParsedRequest:
    try:
        body = json.loads(raw)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise RequestError(400, f"Request body is not valid JSON: {exc}") from None
    except RecursionError:
        # json's decoder recurses once per nesting level: 20,000 levels exhaust the stack
        raise RequestError(400, "Request body is nested too deeply to parse.") from None
    if not isinstance(body, dict):
        raise RequestError(400, "Request body must be a JSON object.")

    model = body.get("model")
    if model is None:
        raise RequestError(400, "Missing required parameter: 'model'.", param="model")
    if not isinstance(model, str):
        raise RequestError(400, _type_message("model", ("string",), model), param="model")

    field, types = INPUT_FIELDS[path]
    if field not in body:
        raise RequestError(400, f"Missing required parameter: '{field}'.", param=field)
    if not is_json_type(body[field], types):
        raise RequestError(400, _type_message(field, types, body[field]), param=field)

    for name, allowed in OPTIONAL_FIELDS.items():
        value = body.get(name)
        if value is not None and not is_json_type(value, allowed):
            raise RequestError(400, _type_message(name, allowed, value), param=name)
    return ParsedRequest(model=model, body=body)


def is_json_type(value: Any, types: tuple[str, ...]) -> bool:
    if isinstance(value, bool):
        return "boolean" in types
    return isinstance(value, _python_types(types))


@functools.cache
def _python_types(types: tuple[str, ...]) -> tuple[type, ...]:
    """The Python types of ``types`` together (the tables above hold a few tuples)."""
    return tuple(kind for t in types for kind in _PYTHON_TYPES[t])


def _described(types: tuple[str, ...]) -> str:
    return " or ".join(f"{_ARTICLES.get(t, 'a')} {t}" for t in types)


def _json_type_of(value: Any) -> str:
    if isinstance(value, bool):
        return "boolean"
    for name in ("string", "integer", "number", "array", "object"):
        if isinstance(value, _PYTHON_TYPES[name]):
            return name
    return "null" if value is None else type(value).__name__


def _type_message(field: str, expected: tuple[str, ...], value: Any) -> str:
    got = _described((_json_type_of(value),))
    return f"Invalid type for '{field}': expected {_described(expected)}, but got {got}."
