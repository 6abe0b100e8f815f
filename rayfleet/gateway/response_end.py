"""What the end of a relayed response says, read as bytes: the usage it reports, whether a
stream's last event reached the client, and how to close an event the upstream cut off.

These read only ``Exchange.end()`` and ``Exchange.tail()`` (upstream.py), by byte
searches with no JSON decoding, and hold no state: attempt.py decides what to count from
their answers, and they are tested on bytes alone, without a request or a replica.
"""

from __future__ import annotations

import re
from typing import NamedTuple

from rayfleet.gateway.upstream import Exchange

_CACHED_TOKENS = b'"cached_tokens":'
_PROMPT_TOKENS = b'"prompt_tokens":'
_NUMBER = re.compile(rb"\s*(\d+)")
_STREAM_END = b"data: [DONE]"


class Usage(NamedTuple):
    """The token counts of a response's usage."""

    prompt_tokens: int
    cached_tokens: int | None  # None: the replica does not report them
    completion_tokens: int  # 0 when the usage has none


def usage_tokens(end: bytes) -> Usage | None:
    """The last usage in ``end``, the end of a response body; cached_tokens None when it
    reports none (vLLM without ``--enable-prompt-tokens-details``); None when there is no
    usage."""
    at = end.rfind(_PROMPT_TOKENS)
    prompt = _NUMBER.match(end, at + len(_PROMPT_TOKENS)) if at >= 0 else None
    if prompt is None:
        return None
    at = end.find(_CACHED_TOKENS, prompt.end())
    cached = _NUMBER.match(end, at + len(_CACHED_TOKENS)) if at >= 0 else None
    return Usage(
        int(prompt.group(1)),
        int(cached.group(1)) if cached is not None else None,
        last_count(b"completion_tokens", end) or 0,
    )


def last_count(key: bytes, end: bytes) -> int | None:
    """The number after the last ``"key":`` in ``end`` (``b"completion_tokens"``: the
    usage's, which comes after any the answer itself holds); None when there is none."""
    field = b'"' + key + b'":'
    at = end.rfind(field)
    number = _NUMBER.match(end, at + len(field)) if at >= 0 else None
    return int(number.group(1)) if number is not None else None


def event_boundary(last_chunk: bytes) -> bytes:
    """What ends an SSE event the upstream cut off mid-way, so that ours stands alone."""
    if not last_chunk or last_chunk.endswith(b"\n\n"):
        return b""
    return b"\n" if last_chunk.endswith(b"\n") else b"\n\n"


def delivered_whole(exchange: Exchange) -> bool:
    """Whether the client has had a stream's ``data: [DONE]``, its last event: the
    answer whole, though the response itself had not ended when the client closed."""
    tail = exchange.tail()
    return tail is not None and tail.rstrip().endswith(_STREAM_END)
