"""Cache-reuse workloads: prompts that share prefixes the way real traffic does.

- ``shared-prefix``: G groups x P prompts; a group's prompts share one system prompt of S
  tokens, each adds its own question of Q tokens, and asks for O tokens (SGLang's
  generated-shared-prefix; its published setting is 64 x 16 with 2048/128/256). All G x P
  prompts, shuffled; ``--num-prompts`` takes that many, cycling.
- ``chat``: G sessions of T turns, each session opening with one of a few shared system
  prompts (each as many sessions as the next, in a random order); every turn re-sends the
  whole history (system, then user and assistant turns) plus a new user message of Q
  tokens. Scheduled turn by turn (turn 1 of every session, then turn 2, ...), and sent as
  a closed loop: a turn waits for its predecessor's answer and carries the answers its
  session got, as a chat application's client does (``bench.drive``). The dataset holds O
  tokens of fixed text for each answer, which a sender that keeps no answers (another
  tool's, or a failed turn) sends instead. Sent as chat messages; ``--num-prompts`` past
  G x T starts new sessions.
- ``zipf``: every prompt picks a group with probability proportional to
  ``1 / rank ** exponent``; ``--zipf-dominant-share`` sends that share to group 0 first
  (1.0: one single dominant group). Each prompt is its group's system prompt plus a
  question of its own.
- ``no-reuse``: the control, prompts of S + Q tokens sharing nothing.

With ``--tokenizer`` lengths are exact in the model's tokens (``datasets.random_text``);
without one they are the simulator's tokens (``rayfleet sim``: 4 characters each), so a
simulated fleet needs no model files.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from rayfleet.bench.datasets import (
    DatasetSpec,
    Prompt,
    Tokenizer,
    WorkloadShape,
    count_tokens,
    cycled,
    ordinary_token_ids,
    random_text,
)
from rayfleet.errors import RayfleetError

WORKLOAD_NAMES = ("shared-prefix", "chat", "zipf", "no-reuse")
SIM_CHARS_PER_TOKEN = 4  # rayfleet.sim.tokens' ratio (not imported: bench stays light)


class TextMaker:
    """Random text of a given length in tokens, and its length counted back."""

    def __init__(self, tokenizer: Tokenizer | None, rng: np.random.Generator):
        self.tokenizer = tokenizer
        self.rng = rng
        self.allowed = ordinary_token_ids(tokenizer, rng) if tokenizer is not None else None

    def text(self, num_tokens: int) -> str:
        if self.tokenizer is not None:
            return random_text(self.tokenizer, num_tokens, self.rng, self.allowed)
        letters = self.rng.integers(97, 123, size=num_tokens * SIM_CHARS_PER_TOKEN, dtype=np.uint8)
        return letters.tobytes().decode()

    def count(self, text: str) -> int:
        if self.tokenizer is not None:
            return count_tokens(self.tokenizer, text)
        return -(-len(text) // SIM_CHARS_PER_TOKEN)


def make_workload(spec: DatasetSpec, tokenizer: Tokenizer | None) -> list[Prompt]:
    """The prompts of a cache-reuse workload, in send order."""
    check_shape(spec.workload)
    makers: dict[str, Callable[[DatasetSpec, TextMaker], list[Prompt]]] = {
        "shared-prefix": shared_prefix_prompts,
        "chat": chat_prompts,
        "zipf": zipf_prompts,
        "no-reuse": no_reuse_prompts,
    }
    text = TextMaker(tokenizer, np.random.default_rng(spec.seed))
    prompts = makers[spec.name](spec, text)
    return cycled(prompts, spec.num_prompts)


def check_shape(shape: WorkloadShape) -> None:
    for flag, value in (
        ("--gsp-num-groups", shape.num_groups),
        ("--gsp-prompts-per-group", shape.prompts_per_group),
        ("--gsp-system-prompt-len", shape.system_prompt_len),
        ("--gsp-question-len", shape.question_len),
        ("--gsp-output-len", shape.output_len),
        ("--chat-num-turns", shape.num_turns),
        ("--chat-num-system-prompts", shape.num_system_prompts),
    ):
        if value < 1:
            raise RayfleetError(f"{flag} must be at least 1, got {value}")
    if shape.zipf_exponent <= 0 or not 0 <= shape.zipf_dominant_share <= 1:
        raise RayfleetError(
            "--zipf-exponent must be positive and --zipf-dominant-share in [0, 1], e.g. 1.1 and 0"
        )


def shared_prefix_prompts(spec: DatasetSpec, text: TextMaker) -> list[Prompt]:
    shape = spec.workload
    prompts = []
    for _ in range(shape.num_groups):
        system = text.text(shape.system_prompt_len)
        for _ in range(shape.prompts_per_group):
            prompt = system + text.text(shape.question_len)
            prompts.append(Prompt(prompt, text.count(prompt), shape.output_len))
    order = text.rng.permutation(len(prompts))
    return [prompts[i] for i in order]


def chat_prompts(spec: DatasetSpec, text: TextMaker) -> list[Prompt]:
    shape = spec.workload
    systems = [text.text(shape.system_prompt_len) for _ in range(shape.num_system_prompts)]
    reply = text.text(shape.output_len)
    # Each system prompt opens as many sessions as the next, in a random order: sessions
    # that took them in turn would meet a round-robin router in step (two replicas, an even
    # number of system prompts: each replica would see half of them, by the order alone).
    order = text.rng.permutation(shape.num_groups) % len(systems)
    histories: list[list[tuple[str, str]]] = [[("system", systems[i])] for i in order.tolist()]
    prompts = []
    for turn in range(shape.num_turns):
        for session, history in enumerate(histories):
            if turn:
                history.append(("assistant", reply))
            history.append(("user", text.text(shape.question_len)))
            num_tokens = sum(text.count(content) for _, content in history)
            prompts.append(
                Prompt(
                    history[-1][1],
                    num_tokens,
                    shape.output_len,
                    messages=tuple(history),
                    session=session,
                )
            )
    return prompts


def zipf_prompts(spec: DatasetSpec, text: TextMaker) -> list[Prompt]:
    shape = spec.workload
    ranks = np.arange(1, shape.num_groups + 1, dtype=float)
    popularity = ranks**-shape.zipf_exponent
    popularity /= popularity.sum()
    groups = text.rng.choice(shape.num_groups, size=spec.num_prompts, p=popularity)
    dominant = text.rng.random(spec.num_prompts) < shape.zipf_dominant_share
    groups[dominant] = 0
    systems: dict[int, str] = {}
    prompts = []
    for group in groups.tolist():
        if group not in systems:
            systems[group] = text.text(shape.system_prompt_len)
        prompt = systems[group] + text.text(shape.question_len)
        prompts.append(Prompt(prompt, text.count(prompt), shape.output_len))
    return prompts


def no_reuse_prompts(spec: DatasetSpec, text: TextMaker) -> list[Prompt]:
    shape = spec.workload
    prompts = []
    for _ in range(spec.num_prompts):
        prompt = text.text(shape.system_prompt_len + shape.question_len)
        prompts.append(Prompt(prompt, text.count(prompt), shape.output_len))
    return prompts
