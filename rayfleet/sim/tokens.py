"""The simulator's tokenizer: a deterministic, model-free stand-in for a real one.

Every ``CHARS_PER_TOKEN`` (4) characters of the prompt are one token, so a prompt of
``n`` characters is ``ceil(n / 4)`` tokens and a KV block of 16 tokens is 64 characters.
Chats are rendered to one prompt the way a chat template does (tools first, then each
message's role and content in order), so turn k of a conversation is a prefix of turn
k + 1. Block hashes are chained: block i's hash covers blocks 0..i, so two prompts share
cached block i only if they agree on everything before it, as in vLLM's prefix cache.
Real tokenizers merge across these seams and count differently; the simulator's latency
model is fitted in tokens, so only the ratio of characters to tokens is approximated.
"""

from __future__ import annotations

import json
import math
from typing import Any

from rayfleet.sim.spec import CHARS_PER_TOKEN

OUTPUT_TOKEN_TEXT = " tok"  # one simulated output token: exactly CHARS_PER_TOKEN characters


def num_tokens(text: str) -> int:
    return math.ceil(len(text) / CHARS_PER_TOKEN)


def render_chat(messages: list[dict[str, Any]], tools: list[Any] | None = None) -> str:
    """The prompt a chat request becomes: prefix-stable across turns."""
    parts = []
    if tools:
        parts.append("<tools>" + json.dumps(tools, sort_keys=True) + "\n")
    for message in messages:
        content = message.get("content") or ""
        if isinstance(content, list):  # OpenAI content parts: keep the text ones
            content = "".join(p.get("text", "") for p in content if isinstance(p, dict))
        parts.append(f"<{message.get('role', 'user')}>{content}\n")
    parts.append("<assistant>")
    return "".join(parts)


def block_hashes(text: str, block_size: int, parent: int = 0) -> list[int]:
    """Chained hashes of the full blocks of ``text`` (a partial last block is never
    cached), continuing the chain that ended in hash ``parent`` when given."""
    chars = block_size * CHARS_PER_TOKEN
    hashes = []
    for start in range(0, len(text) - chars + 1, chars):
        parent = hash((parent, text[start : start + chars]))
        hashes.append(parent)
    return hashes


def partial_block(text: str, block_size: int) -> str:
    """What follows the last full block of ``text``: where an answer's first block starts."""
    return text[len(text) - len(text) % (block_size * CHARS_PER_TOKEN) :]
