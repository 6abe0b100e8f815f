"""Request bodies the gateway refuses before they reach an engine."""

import json

import pytest

from rayfleet.gateway.errors import RequestError
from rayfleet.gateway.validate import parse_request

CHAT = "/v1/chat/completions"


def parse(body, path=CHAT):
    raw = body if isinstance(body, bytes) else json.dumps(body).encode()
    return parse_request(path, raw)


def test_reads_model_and_keeps_the_body():
    body = {"model": "m", "messages": [], "stream": True}
    parsed = parse(body)
    assert (parsed.model, parsed.body) == ("m", body)


@pytest.mark.parametrize(
    "raw, param",
    [
        (b"{not json", None),
        (b"[1, 2]", None),
        (b'"text"', None),
        ({"messages": []}, "model"),
        ({"model": ["m"], "messages": []}, "model"),
        ({"model": "m"}, "messages"),
        ({"model": "m", "messages": {"role": "user"}}, "messages"),
        ({"model": "m", "messages": [], "max_tokens": True}, "max_tokens"),
        ({"model": "m", "messages": [], "max_tokens": 1.5}, "max_tokens"),
        ({"model": "m", "messages": [], "temperature": "hot"}, "temperature"),
        ({"model": "m", "messages": [], "n": "2"}, "n"),
    ],
)
def test_rejects_with_400_and_param(raw, param):
    with pytest.raises(RequestError) as err:
        parse(raw)
    assert err.value.status == 400
    assert err.value.param == param


def test_input_fields_per_endpoint():
    with pytest.raises(RequestError, match="'prompt'"):
        parse({"model": "m", "messages": []}, "/v1/completions")
    with pytest.raises(RequestError, match="'input'"):
        parse({"model": "m", "input": 3}, "/v1/embeddings")
    assert parse({"model": "m", "input": ["a", "b"]}, "/v1/embeddings").model == "m"
