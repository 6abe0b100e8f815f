"""Prompt text and token counts, for rules and limits.

``prompt_of(path, body)`` pulls the text a request feeds the model (chat message
contents, completion prompts, embedding inputs) once. Its token count is bounded
above by its UTF-8 length (every token of a byte-level or byte-fallback tokenizer
covers at least one byte), which lets most checks pass without tokenizing.

``TokenCounter`` holds one tokenizer per model, loaded once at gateway start from
the model's local ``tokenizer.json`` (the ``tokenizers`` library, no transformers
import) or, failing that, with transformers' ``AutoTokenizer``. Counts exclude
special tokens and chat-template tokens, so they never exceed what the engine
sees. A model whose tokenizer cannot be loaded is estimated at 4 bytes per token.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any

Encoder = Callable[[str], int]  # text -> its number of tokens

log = logging.getLogger("rayfleet.gateway")

BYTES_PER_TOKEN_ESTIMATE = 4


class Prompt:
    """What the model reads from one request: text, and token ids given as such."""

    __slots__ = ("_num_bytes", "num_id_tokens", "text")

    def __init__(self, text: str, num_id_tokens: int = 0):
        self.text = text
        self.num_id_tokens = num_id_tokens
        self._num_bytes: int | None = None

    @property
    def num_bytes(self) -> int:
        if self._num_bytes is None:
            self._num_bytes = len(self.text.encode("utf-8", "surrogatepass"))
        return self._num_bytes

    def max_tokens_bound(self) -> int:
        """No tokenizer makes more tokens than this from the prompt."""
        return self.num_bytes + self.num_id_tokens


def prompt_of(path: str, body: dict[str, Any]) -> Prompt:
    if path == "/v1/chat/completions":
        messages = body.get("messages") or []
        return Prompt("\n".join(_message_text(m) for m in messages))
    value = body.get("prompt" if path == "/v1/completions" else "input")
    if isinstance(value, str):
        return Prompt(value)
    if isinstance(value, list):
        if value and all(isinstance(v, int) for v in value):
            return Prompt("", num_id_tokens=len(value))
        texts, ids = [], 0
        for item in value:
            if isinstance(item, str):
                texts.append(item)
            elif isinstance(item, list):
                ids += len(item)
        return Prompt("\n".join(texts), num_id_tokens=ids)
    return Prompt("")


def _message_text(message: Any) -> str:
    if not isinstance(message, dict):
        return ""
    content = message.get("content")
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "\n".join(
            part.get("text", "")
            for part in content
            if isinstance(part, dict) and isinstance(part.get("text"), str)
        )
    return ""


class TokenCounter:
    """Token counts per model, with tokenizers loaded once (``load``)."""

    def __init__(self, sources: dict[str, str]):
        self.sources = dict(sources)
        self._encoders: dict[str, Encoder | None] = {}

    def load(self, models: list[str] | None = None) -> None:
        """Load the tokenizers of ``models`` (default: all). Blocking; call off the loop."""
        for model in models if models is not None else list(self.sources):
            if model not in self._encoders and model in self.sources:
                self._encoders[model] = _load_encoder(self.sources[model])

    def has_tokenizer(self, model: str) -> bool:
        return self._encoders.get(model) is not None

    def count(self, model: str | None, prompt: Prompt) -> int:
        encode = self._encoders.get(model) if model is not None else None
        if encode is None:
            return -(-prompt.num_bytes // BYTES_PER_TOKEN_ESTIMATE) + prompt.num_id_tokens
        return (encode(_encodable(prompt.text)) if prompt.text else 0) + prompt.num_id_tokens


def _encodable(text: str) -> str:
    """``text`` with lone surrogates (JSON allows "\\ud800") replaced: tokenizers refuse
    them with a TypeError, which was a 500 for a request a route had to count."""
    if text.isascii():
        return text
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return text.encode("utf-8", "replace").decode("utf-8")
    return text


def _load_encoder(source: str) -> Encoder | None:
    path = Path(source).expanduser()
    try:
        if (path / "tokenizer.json").is_file():
            from tokenizers import Tokenizer

            tokenizer = Tokenizer.from_file(str(path / "tokenizer.json"))
            if hasattr(tokenizer, "encode_batch_fast"):  # no offsets: a third faster
                fast = tokenizer.encode_batch_fast
                return lambda text: len(fast([text], add_special_tokens=False)[0].ids)
            return lambda text: len(tokenizer.encode(text, add_special_tokens=False).ids)
        from transformers import AutoTokenizer

        auto = AutoTokenizer.from_pretrained(str(path) if path.exists() else source)
        return lambda text: len(auto.encode(text, add_special_tokens=False))
    except Exception as exc:  # noqa: BLE001 - an unreachable hub id must not stop the gateway
        log.warning(
            "no tokenizer for %s (%s); estimating %d bytes per token",
            source,
            type(exc).__name__,
            BYTES_PER_TOKEN_ESTIMATE,
        )
        return None


def context_length(source: str, engine_args: dict[str, Any]) -> int | None:
    """The model's context: engine_args max_model_len, else config.json, else None."""
    value = engine_args.get("max_model_len")
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    if isinstance(value, str) and value.isdigit():
        return int(value)
    config_path = Path(source).expanduser() / "config.json"
    if value is None and config_path.is_file():
        try:
            config = json.loads(config_path.read_text())
        except (OSError, ValueError):
            return None
        for section in (config, config.get("text_config") or {}):
            length = section.get("max_position_embeddings")
            if isinstance(length, int):
                return length
    return None
