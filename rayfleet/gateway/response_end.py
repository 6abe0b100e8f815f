"""What the end of a relayed response says, read as bytes: the usage it reports, whether a
stream's last event reached the client, how to close an event the upstream cut off, and
the answer's text.

These read only ``Exchange.end()``, ``Exchange.tail()`` and ``Exchange.body()``
(upstream.py), by byte searches, and hold no state: attempt.py decides what to count from
their answers, and they are tested on bytes alone, without a request or a replica. Only
``answer_text`` decodes JSON (a whole body; of a stream, only its text pieces, in one
decode).
"""

from __future__ import annotations

import json
import re
from typing import Any, NamedTuple

from rayfleet.gateway.upstream import Exchange

_CACHED_TOKENS = b'"cached_tokens":'
_PROMPT_TOKENS = b'"prompt_tokens":'
_NUMBER = re.compile(rb"\s*(\d+)")
_STREAM_END = b"data: [DONE]"
# A JSON string's body, unrolled (a run of plain characters, then escapes each followed by
# another run: a third faster than an alternation per character), and the keys whose
# strings are a stream's text pieces: a chat delta's "content" (a logprobs "content" is a
# list, a "reasoning_content" another key) and a completion's "text".
_STRING = rb'"([^"\\]*(?:\\.[^"\\]*)*)"'
_CHAT_PIECE = re.compile(rb'"content":\s*' + _STRING)
_TEXT_PIECE = re.compile(rb'"text":\s*' + _STRING)


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


def answer_text(body: bytes, streamed: bool, chat: bool) -> str | None:
    """The text of a response's first choice: a whole body's ``message.content`` (``chat``)
    or ``text``, or a stream's text pieces (its deltas' ``content``, or ``text``) joined.
    None when there is none. A stream of several choices mixes them: ask only for one."""
    if streamed:
        pieces = (_CHAT_PIECE if chat else _TEXT_PIECE).findall(body)
        if not pieces:
            return None
        try:
            texts = json.loads(b'["' + b'","'.join(pieces) + b'"]')
        except ValueError:
            return None
        return "".join(texts)
    try:
        answer = json.loads(body)
    except ValueError:
        return None
    return _first_text(answer, chat)


def _first_text(answer: Any, chat: bool) -> str | None:
    choices = answer.get("choices") if isinstance(answer, dict) else None
    if not isinstance(choices, list) or not choices or not isinstance(choices[0], dict):
        return None
    choice = choices[0]
    if chat:
        message = choice.get("message")
        choice = message if isinstance(message, dict) else {}
        text = choice.get("content")
    else:
        text = choice.get("text")
    return text if isinstance(text, str) else None
