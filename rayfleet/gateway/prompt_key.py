"""The routing key's text: a request's prompt as the engine will see it, prefix-stable.

A chat's text is its tools (JSON, first, since a template puts them before the messages)
and then each message's role and content in order, so turn k of a conversation is a prefix
of turn k+1; a completion's is its prompt. prefix_index.py hashes it in whole blocks.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any


def prompt_text(path: str, body: Mapping[str, Any]) -> str:
    """The routing key of a request: its prompt as text, stable as a conversation grows."""
    lead, rest = prompt_parts(path, body)
    return lead + rest


def prompt_parts(path: str, body: Mapping[str, Any]) -> tuple[str, str]:
    """``prompt_text`` as (lead, rest), split where many requests share the text before:
    a chat's tools and first message (its system prompt, say); a completion has no lead."""
    if path.endswith("/chat/completions"):
        return _chat_parts(body)
    prompt = body.get("prompt", body.get("input", ""))
    if isinstance(prompt, str):
        return "", prompt
    if isinstance(prompt, list) and prompt and all(isinstance(p, str) for p in prompt):
        return "", "\x1e".join(prompt)
    return "", json.dumps(prompt, separators=(",", ":"))


def _chat_parts(body: Mapping[str, Any]) -> tuple[str, str]:
    parts: list[str] = []
    tools = body.get("tools")
    if tools:
        parts.append(json.dumps(tools, separators=(",", ":"), sort_keys=True))
    messages = [m for m in body.get("messages") or () if isinstance(m, Mapping)]
    for message in messages[:1]:
        _append_message(parts, message)
    lead = "".join(parts)
    parts.clear()
    for message in messages[1:]:
        _append_message(parts, message)
    return lead, "".join(parts)


def assistant_turn(content: str) -> str:
    """The text an assistant message of ``content`` adds to a chat's key."""
    return f"\x1eassistant\x1f{content}"


def _append_message(parts: list[str], message: Mapping[str, Any]) -> None:
    parts.append(f"\x1e{message.get('role', '')}\x1f")
    content = message.get("content")
    if isinstance(content, str):
        parts.append(content)
    elif isinstance(content, list):
        for item in content:
            text = item.get("text") if isinstance(item, Mapping) else None
            parts.append(text if isinstance(text, str) else json.dumps(item, sort_keys=True))
    calls = message.get("tool_calls")
    if calls:
        parts.append(json.dumps(calls, separators=(",", ":"), sort_keys=True))
