"""A routed request's blocks: its prompt's, and after the response, its answer's too.

``prompt_blocks`` cuts a request's routing key (prompt_key.py) into whole blocks of
``block_chars`` characters, chain-hashed (prefix_index.py), and keeps the characters
after the last whole block. ``answer_blocks`` is what the replica holds once it answered:
vLLM caches every whole block of a sequence, the answer's too, and they stay cached after
the request and push older prefixes out. So the sequence is the prompt's blocks followed
by the answer's whole blocks. With the answer's text (a single answer; response_end.py's
``answer_text``), the answer's blocks are hashed as the next request will repeat it: a
chat's next turn (the answer as the assistant's message) is predicted to hit through the
answer, as vLLM hits. The answer takes at least the room its ``completion_tokens`` fill
(vLLM holds tokens, and an answer's characters per token need not be the prompt's): what
the text does not cover, or all of it without the text, is placeholders (random 63-bit
numbers no prompt matches). Without that charge the index outlived the cache whenever
answers were long (README: at SGLang's 1,536/128/256 shape on two vLLM servers, predicted
0.83 and 0.76 against 0.74 and 0.69 realised; 0.67 and 0.69 against 0.70 and 0.71 with
it).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from rayfleet.gateway.prefix_index import BlockHasher, block_hashes
from rayfleet.gateway.prompt_key import assistant_turn, prompt_parts


@dataclass(frozen=True, slots=True)
class PromptBlocks:
    """A request's routing key as the index uses it: its whole blocks' hashes, and its
    length in characters (the last block's part, and characters per token)."""

    hashes: list[int]
    num_chars: int
    tail: str  # the characters after the last whole block


def prompt_blocks(hasher: BlockHasher, path: str, body: Mapping[str, Any]) -> PromptBlocks:
    """The blocks of the request to ``path`` with ``body``."""
    lead, rest = prompt_parts(path, body)
    hashes = hasher.hashes(lead, rest)
    cut = len(hashes) * hasher.block_chars
    tail = rest[cut - len(lead) :] if cut >= len(lead) else lead[cut:] + rest
    return PromptBlocks(hashes, len(lead) + len(rest), tail)


def answer_blocks(
    prompt: PromptBlocks,
    num_tokens: int,
    answer: str | None,
    *,
    path: str,
    block_chars: int,
    chars_per_token: float,
    getrandbits: Callable[[int], int],
) -> list[int]:
    """The blocks a replica holds once it answered ``prompt`` with ``num_tokens`` tokens
    (``answer``: their text, when known): the prompt's, then the answer's. Empty when the
    answer fills no whole block."""
    chars = prompt.num_chars % block_chars + num_tokens * chars_per_token
    num_blocks = int(chars) // block_chars
    known: list[int] = []
    if answer:
        if path.endswith("/chat/completions"):
            answer = assistant_turn(answer)
        parent = prompt.hashes[-1] if prompt.hashes else None
        known = block_hashes(prompt.tail + answer, block_chars, parent)
    if not known and num_blocks == 0:
        return []
    placeholders = (getrandbits(63) for _ in range(num_blocks - len(known)))
    return [*prompt.hashes, *known, *placeholders]
