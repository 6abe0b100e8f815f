"""A benchmark's prompts as a JSONL file that other load generators read too.

``rayfleet bench dataset`` makes the prompts ``rayfleet bench`` would send (any dataset,
the cache-reuse workloads included, same flags and seed) and writes one object a line:

- ``prompt``: the text. A chat turn's is its whole history, a ``role: content`` line a
  message, so each turn's text starts with the one before it and a tool that sends plain
  completions still sees the prefixes the workload shares;
- ``output_tokens``: what vLLM's ``vllm bench serve --dataset-name custom`` reads (with
  ``--custom-output-len -1``), and ``max_tokens``, what ``rayfleet bench --dataset-name
  jsonl`` reads: both the tokens to ask for;
- ``input_tokens``: the prompt's length in tokens, as counted when it was made;
- a chat turn's ``messages`` (``[{"role": ..., "content": ...}]``) and ``session``, which
  ``rayfleet bench --dataset-name jsonl`` sends as a chat, each session's turns in order
  and each with the answers its session got.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from rayfleet.bench.datasets import Prompt
from rayfleet.errors import RayfleetError


def prompt_row(prompt: Prompt) -> dict[str, Any]:
    """One line of the file, as a dict."""
    row: dict[str, Any] = {
        "prompt": flat_text(prompt),
        "output_tokens": prompt.num_output_tokens,
        "max_tokens": prompt.num_output_tokens,
        "input_tokens": prompt.num_input_tokens,
    }
    if prompt.messages:
        row["messages"] = [{"role": role, "content": text} for role, text in prompt.messages]
    if prompt.session is not None:
        row["session"] = prompt.session
    return row


def flat_text(prompt: Prompt) -> str:
    """A chat turn's history as one text, prefix-stable across its session's turns; a
    prompt of no history as it is."""
    if not prompt.messages:
        return prompt.text
    return "".join(f"{role}: {content}\n" for role, content in prompt.messages)


def write_dataset(prompts: Sequence[Prompt], path: Path) -> None:
    """Write ``prompts`` to ``path``, one JSON object a line (``-`` for stdout)."""
    lines = "".join(json.dumps(prompt_row(p), ensure_ascii=False) + "\n" for p in prompts)
    if str(path) == "-":
        print(lines, end="")
        return
    try:
        path.write_text(lines, encoding="utf-8")
    except OSError as exc:
        raise RayfleetError(f"--output: cannot write {path} ({exc.strerror})") from None
