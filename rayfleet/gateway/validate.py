"""Read what the gateway needs from a request body, once, and refuse malformed ones.

Only the fields the gateway acts on, or whose wrong type would otherwise reach the
engine as a 500, are checked here; vLLM validates the rest and its 400s pass
through unchanged.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from rayfleet.gateway.errors import RequestError

# endpoint path -> the field holding the input, and the types it may take
INPUT_FIELDS: dict[str, tuple[str, tuple[type, ...], str]] = {
    "/v1/chat/completions": ("messages", (list,), "an array of messages"),
    "/v1/completions": ("prompt", (str, list), "a string or an array"),
    "/v1/embeddings": ("input", (str, list), "a string or an array"),
}

_OPTIONAL_TYPES: dict[str, tuple[tuple[type, ...], str]] = {
    "stream": ((bool,), "a boolean"),
    "max_tokens": ((int,), "an integer"),
    "max_completion_tokens": ((int,), "an integer"),
    "n": ((int,), "an integer"),
    "temperature": ((int, float), "a number"),
    "top_p": ((int, float), "a number"),
    "stream_options": ((dict,), "an object"),
}


@dataclass(frozen=True)
class ParsedRequest:
    model: str
    body: dict[str, Any]


def parse_request(path: str, raw: bytes) -> ParsedRequest:
    try:
        body = json.loads(raw)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise RequestError(400, f"Request body is not valid JSON: {exc}") from None
    if not isinstance(body, dict):
        raise RequestError(400, "Request body must be a JSON object.")

    model = body.get("model")
    if model is None:
        raise RequestError(400, "Missing required parameter: 'model'.", param="model")
    if not isinstance(model, str):
        raise RequestError(400, _type_message("model", "a string", model), param="model")

    field, types, described = INPUT_FIELDS[path]
    if field not in body:
        raise RequestError(400, f"Missing required parameter: '{field}'.", param=field)
    if not isinstance(body[field], types):
        raise RequestError(400, _type_message(field, described, body[field]), param=field)

    for name, (allowed, described) in _OPTIONAL_TYPES.items():
        value = body.get(name)
        if value is None:
            continue
        # bool is an int in Python; JSON true is not a valid max_tokens.
        if not isinstance(value, allowed) or (isinstance(value, bool) and bool not in allowed):
            raise RequestError(400, _type_message(name, described, value), param=name)
    return ParsedRequest(model=model, body=body)


_JSON_TYPES = {
    str: "a string",
    int: "an integer",
    float: "a number",
    bool: "a boolean",
    list: "an array",
    dict: "an object",
}


def _type_message(field: str, expected: str, value: Any) -> str:
    got = _JSON_TYPES.get(type(value), type(value).__name__)
    return f"Invalid type for '{field}': expected {expected}, but got {got}."
