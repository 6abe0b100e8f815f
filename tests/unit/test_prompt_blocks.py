"""A routed request's blocks (prompt_blocks.py), and the relay's content type parsing
(relay_wire.py)."""

from __future__ import annotations

import itertools

from rayfleet.gateway.prefix_index import BlockHasher, block_hashes
from rayfleet.gateway.prompt_blocks import answer_blocks, prompt_blocks
from rayfleet.gateway.relay_wire import content_type

BLOCK = 8
COMPLETIONS = "/v1/completions"


def counting() -> itertools.count[int]:
    return itertools.count(10**12)


def test_a_prompt_is_its_whole_blocks_and_the_characters_after_them():
    prompt = prompt_blocks(BlockHasher(BLOCK), COMPLETIONS, {"prompt": "abcdefgh" * 2 + "xyz"})
    assert prompt.hashes == block_hashes("abcdefgh" * 2, BLOCK)
    assert (prompt.num_chars, prompt.tail) == (19, "xyz")


def test_an_answer_s_text_continues_the_prompt_s_chain_then_placeholders_fill_its_room():
    prompt = prompt_blocks(BlockHasher(BLOCK), COMPLETIONS, {"prompt": "abcdefgh" + "xyz"})
    fresh = counting()
    # 3 characters of the prompt's tail and 5 tokens of 4 characters: 23, two whole blocks;
    # the text "12345" completes one with the tail, the other is a placeholder.
    blocks = answer_blocks(
        prompt, 5, "12345", path=COMPLETIONS, block_chars=BLOCK, chars_per_token=4,
        getrandbits=lambda _: next(fresh),
    )  # fmt: skip
    repeated = block_hashes("abcdefgh" + "xyz12345", BLOCK)
    assert blocks[:2] == repeated
    assert blocks[2:] == [10**12]


def test_an_answer_without_text_takes_its_room_in_placeholders_and_none_when_it_fills_none():
    prompt = prompt_blocks(BlockHasher(BLOCK), COMPLETIONS, {"prompt": "abcdefgh"})
    fresh = counting()
    blocks = answer_blocks(
        prompt, 4, None, path=COMPLETIONS, block_chars=BLOCK, chars_per_token=4,
        getrandbits=lambda _: next(fresh),
    )  # fmt: skip
    assert blocks == [*prompt.hashes, 10**12, 10**12 + 1]
    none = answer_blocks(
        prompt, 1, None, path=COMPLETIONS, block_chars=BLOCK, chars_per_token=4,
        getrandbits=lambda _: next(fresh),
    )  # fmt: skip
    assert none == []


def test_a_content_type_s_media_type_and_charset():
    assert content_type(b"text/event-stream; charset=utf-8") == ("text/event-stream", "utf-8")
    assert content_type(b'application/json;Charset="latin-1"') == ("application/json", "latin-1")
    assert content_type(b"application/json") == ("application/json", None)
