"""Prompts for a benchmark, made offline and seeded so runs repeat.

Four datasets:
- ``random``: random token ids decoded to text, with given input and output lengths.
- ``prefix``: K shared system prompts of a given length, each followed by a random
  suffix (the prefix-cache case).
- ``mixed``: mostly short prompts with a share of long ones (head-of-line blocking).
- ``jsonl``: the user's own prompts, one JSON object a line.
- ``shared-prefix``, ``chat``, ``zipf``, ``no-reuse``: cache-reuse workloads
  (``bench.workloads``; shaped by ``WorkloadShape``; no tokenizer needed).

Token counts are exact for the given tokenizer; the server's own count (from ``usage``)
replaces them in the results when it reports one.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Protocol, cast

import numpy as np

from rayfleet.errors import RayfleetError

DATASET_NAMES = ("random", "prefix", "mixed", "jsonl", "shared-prefix", "chat", "zipf", "no-reuse")
CACHE_WORKLOADS = ("shared-prefix", "chat", "zipf", "no-reuse")


class Tokenizer(Protocol):
    """What the datasets need from a Hugging Face tokenizer."""

    vocab_size: int
    all_special_ids: list[int]

    def encode(self, text: str, add_special_tokens: bool = ...) -> list[int]: ...

    def decode(self, ids: list[int]) -> str: ...


@dataclass(frozen=True)
class Prompt:
    """One request to send: text, its length in tokens, and how many tokens to ask for;
    ``messages`` (role, content) when it is a chat turn with history, and ``session`` when
    that history is a conversation's: its turns are sent one after another, each with the
    answers the turns before it got in place of its assistant messages (``bench.drive``)."""

    text: str
    num_input_tokens: int
    num_output_tokens: int
    messages: tuple[tuple[str, str], ...] | None = None
    session: int | None = None


@dataclass(frozen=True)
class WorkloadShape:
    """The cache-reuse workloads' shape (flag names after SGLang's generated-shared-prefix)."""

    num_groups: int = 64
    prompts_per_group: int = 16
    system_prompt_len: int = 2048
    question_len: int = 128
    output_len: int = 256
    num_turns: int = 4
    num_system_prompts: int = 4
    zipf_exponent: float = 1.1
    zipf_dominant_share: float = 0.0


@dataclass(frozen=True)
class DatasetSpec:
    """Which dataset to make and its shape (flag names follow vLLM's benchmark)."""

    name: str = "random"
    num_prompts: int = 1000
    random_input_len: int = 1024
    random_output_len: int = 128
    random_range_ratio: float = 0.0
    prefix_len: int = 256
    suffix_len: int = 64
    num_prefixes: int = 4
    mixed_long_input_len: int = 2048
    mixed_long_fraction: float = 0.1
    dataset_path: Path | None = None
    seed: int = 0
    workload: WorkloadShape = WorkloadShape()


def load_tokenizer(name_or_path: str) -> Tokenizer:
    """A Hugging Face tokenizer from a local directory or a hub name (imported lazily)."""
    try:
        from transformers import AutoTokenizer

        # transformers' tokenizer classes have the methods ``Tokenizer`` names, untyped.
        return cast(Tokenizer, AutoTokenizer.from_pretrained(name_or_path))
    except Exception as exc:  # noqa: BLE001 - transformers raises many kinds: "not loadable"
        raise RayfleetError(
            f"--tokenizer: cannot load a tokenizer from {name_or_path!r} "
            f"({type(exc).__name__}); pass --tokenizer DIR, a local model or tokenizer directory"
        ) from None


def make_prompts(spec: DatasetSpec, tokenizer: Tokenizer | None) -> list[Prompt]:
    """The prompts of ``spec``, in send order."""
    if spec.num_prompts < 1:
        raise RayfleetError("--num-prompts must be at least 1")
    if spec.name == "jsonl":
        return jsonl_prompts(spec, tokenizer)
    if spec.name in CACHE_WORKLOADS:
        from rayfleet.bench.workloads import make_workload

        return make_workload(spec, tokenizer)
    if spec.name not in DATASET_NAMES:
        raise RayfleetError(
            f"--dataset-name {spec.name!r} is unknown; use one of {', '.join(DATASET_NAMES)}"
        )
    if tokenizer is None:
        raise RayfleetError(
            f"--dataset-name {spec.name} makes prompts of exact token lengths and needs the "
            "model's tokenizer; pass --tokenizer DIR (or a hub name)"
        )
    rng = np.random.default_rng(spec.seed)
    if spec.name == "random":
        return random_prompts(spec, tokenizer, rng)
    if spec.name == "prefix":
        return prefix_prompts(spec, tokenizer, rng)
    return mixed_prompts(spec, tokenizer, rng)


def random_prompts(
    spec: DatasetSpec, tokenizer: Tokenizer, rng: np.random.Generator
) -> list[Prompt]:
    input_lens = _lengths(spec.random_input_len, spec.random_range_ratio, spec.num_prompts, rng)
    output_lens = _lengths(spec.random_output_len, spec.random_range_ratio, spec.num_prompts, rng)
    allowed = ordinary_token_ids(tokenizer, rng)
    texts = [random_text(tokenizer, n_in, rng, allowed) for n_in in input_lens]
    return [
        Prompt(text, count_tokens(tokenizer, text), n_out)
        for text, n_out in zip(texts, output_lens, strict=True)
    ]


def prefix_prompts(
    spec: DatasetSpec, tokenizer: Tokenizer, rng: np.random.Generator
) -> list[Prompt]:
    if spec.num_prefixes < 1:
        raise RayfleetError("--prefix-repetition-num-prefixes must be at least 1")
    allowed = ordinary_token_ids(tokenizer, rng)
    prefixes = [
        random_text(tokenizer, spec.prefix_len, rng, allowed) for _ in range(spec.num_prefixes)
    ]
    prompts = []
    for i in range(spec.num_prompts):
        prefix = prefixes[i % spec.num_prefixes]
        suffix = random_text(tokenizer, spec.suffix_len, rng, allowed)
        text = prefix + " " + suffix
        prompts.append(Prompt(text, count_tokens(tokenizer, text), spec.random_output_len))
    order = rng.permutation(len(prompts))
    return [prompts[i] for i in order]


def mixed_prompts(
    spec: DatasetSpec, tokenizer: Tokenizer, rng: np.random.Generator
) -> list[Prompt]:
    if not 0.0 <= spec.mixed_long_fraction <= 1.0:
        raise RayfleetError("--mixed-long-fraction must be between 0 and 1, e.g. 0.1")
    is_long = rng.random(spec.num_prompts) < spec.mixed_long_fraction
    allowed = ordinary_token_ids(tokenizer, rng)
    prompts = []
    for long in is_long:
        num_tokens = spec.mixed_long_input_len if long else spec.random_input_len
        text = random_text(tokenizer, num_tokens, rng, allowed)
        prompts.append(Prompt(text, count_tokens(tokenizer, text), spec.random_output_len))
    return prompts


def jsonl_prompts(spec: DatasetSpec, tokenizer: Tokenizer | None) -> list[Prompt]:
    """Prompts from a JSONL file: ``{"prompt": "...", "max_tokens": 64}`` a line.

    ``max_tokens`` is optional (default ``--random-output-len``); a chat turn may add its
    ``messages`` (``[{"role": ..., "content": ...}, ...]``, sent to a chat endpoint in place
    of the prompt) and its ``session`` (a number: the session's turns go one after another,
    in file order), as ``rayfleet bench dataset`` writes them. The file is cycled until
    ``--num-prompts`` prompts are made.
    """
    if spec.dataset_path is None:
        raise RayfleetError("--dataset-name jsonl needs --dataset-path FILE.jsonl")
    rows = [_jsonl_row(spec.dataset_path, n, line) for n, line in _jsonl_lines(spec.dataset_path)]
    if not rows:
        raise RayfleetError(
            f"--dataset-path {spec.dataset_path} has no prompts; add lines like "
            '{"prompt": "Hello"}'
        )
    prompts = []
    for row in rows:
        num_input = count_tokens(tokenizer, row.text) if tokenizer is not None else 0
        num_output = row.num_output_tokens or spec.random_output_len
        prompts.append(replace(row, num_input_tokens=num_input, num_output_tokens=num_output))
    return cycled(prompts, spec.num_prompts)


def cycled(prompts: list[Prompt], num_prompts: int) -> list[Prompt]:
    """``num_prompts`` of ``prompts``, repeated as often as needed; a repeat of a chat turn
    belongs to a new session, so a conversation never goes on past its own last turn."""
    sessions = [p.session for p in prompts if p.session is not None]
    num_sessions = max(sessions) + 1 if sessions else 0
    out = []
    for i in range(num_prompts):
        prompt = prompts[i % len(prompts)]
        repeat = i // len(prompts)
        if repeat and prompt.session is not None:
            prompt = replace(prompt, session=prompt.session + repeat * num_sessions)
        out.append(prompt)
    return out


def random_text(
    tokenizer: Tokenizer,
    num_tokens: int,
    rng: np.random.Generator,
    allowed: np.ndarray | None = None,
) -> str:
    """Text that encodes to ``num_tokens`` tokens (exactly, unless merges at the seams
    make that impossible within a few tries; callers count the result)."""
    if num_tokens < 1:
        raise RayfleetError("input lengths must be at least 1 token; raise --random-input-len")
    if allowed is None:
        allowed = ordinary_token_ids(tokenizer, rng)
    ids = list(rng.choice(allowed, size=num_tokens))
    text = tokenizer.decode(ids)
    for _ in range(8):
        ids = tokenizer.encode(text, add_special_tokens=False)
        if len(ids) == num_tokens:
            return text
        if len(ids) > num_tokens:
            ids = ids[:num_tokens]
        else:
            ids = ids + list(rng.choice(allowed, size=num_tokens - len(ids)))
        text = tokenizer.decode(ids)
    return text


def count_tokens(tokenizer: Tokenizer, text: str) -> int:
    return len(tokenizer.encode(text, add_special_tokens=False))


def ordinary_token_ids(
    tokenizer: Tokenizer, rng: np.random.Generator, max_checked: int = 50_000
) -> np.ndarray:
    """Ids that are not special and decode to whole characters that encode back to
    themselves (a byte-level piece of a character would not survive a round trip)."""
    special = set(tokenizer.all_special_ids)
    candidates = [i for i in range(tokenizer.vocab_size) if i not in special]
    if len(candidates) > max_checked:  # a large vocabulary: a random sample is plenty
        candidates = sorted(rng.choice(candidates, size=max_checked, replace=False).tolist())
    ids = []
    for i in candidates:
        text = tokenizer.decode([i])
        if (
            text
            and "\ufffd" not in text
            and tokenizer.encode(text, add_special_tokens=False) == [i]
        ):
            ids.append(i)
    return np.array(ids or candidates)


def _lengths(mean: int, range_ratio: float, count: int, rng: np.random.Generator) -> list[int]:
    if mean < 1:
        raise RayfleetError(f"lengths must be at least 1 token, got {mean}; raise the length flag")
    if not 0.0 <= range_ratio < 1.0:
        raise RayfleetError("--random-range-ratio must be in [0, 1), e.g. 0.2")
    low = max(1, int(mean * (1 - range_ratio)))
    high = max(low, int(mean * (1 + range_ratio)))
    return [int(x) for x in rng.integers(low, high + 1, size=count)]


def _jsonl_lines(path: Path) -> Iterator[tuple[int, str]]:
    try:
        with open(path, encoding="utf-8") as f:
            for number, line in enumerate(f, start=1):
                if line.strip():
                    yield number, line
    except OSError as exc:
        raise RayfleetError(f"--dataset-path: cannot read {path} ({exc.strerror})") from None


def _jsonl_row(path: Path, number: int, line: str) -> Prompt:
    """The line's prompt; its token counts are the ones the file gives (0 when none)."""
    where = f"--dataset-path {path}:{number}"
    try:
        row: Any = json.loads(line)
    except json.JSONDecodeError:
        raise RayfleetError(f"{where} is not JSON; write one object a line") from None
    if not isinstance(row, dict) or not isinstance(row.get("prompt"), str):
        raise RayfleetError(f'{where} needs a "prompt" string')
    max_tokens = row.get("max_tokens")
    if max_tokens is not None and (not isinstance(max_tokens, int) or max_tokens < 1):
        raise RayfleetError(f'{where}: "max_tokens" must be a positive integer')
    session = row.get("session")
    if session is not None and (not isinstance(session, int) or session < 0):
        raise RayfleetError(f'{where}: "session" must be a number of 0 or more')
    messages = _jsonl_messages(where, row.get("messages"))
    return Prompt(row["prompt"], 0, max_tokens or 0, messages=messages, session=session)


def _jsonl_messages(where: str, value: Any) -> tuple[tuple[str, str], ...] | None:
    if value is None:
        return None
    if not isinstance(value, list) or not value:
        raise RayfleetError(f'{where}: "messages" must be a non-empty list')
    messages = []
    for message in value:
        fields = ("role", "content")
        role, content = (message.get(f) if isinstance(message, dict) else None for f in fields)
        if not isinstance(role, str) or not isinstance(content, str):
            raise RayfleetError(
                f'{where}: each of "messages" needs "role" and "content" strings, '
                'like {"role": "user", "content": "Hello"}'
            )
        messages.append((role, content))
    return tuple(messages)
