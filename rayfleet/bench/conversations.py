"""Chat sessions sent as a closed loop, as a chat application's client sends them.

A workload's chat turns (``Prompt.session`` set) carry the whole history, with fixed text
where the assistant's answers go. The sender (``bench.drive``) sends each turn only once
the turn before it in its session has ended, with the answers that session really got in
place of the fixed text, so the history a server sees is the one it wrote (and the prefix
its cache holds, answer included):

    turn = conversations.turn(prompt)       # at scheduling time, in the session's order
    prompt, ready_s = await turn.ready()     # waits for the turn before; real answers in
    ...send prompt, keeping the answer's text...
    turn.end(result)                         # the next turn may go

A failed turn's answer stays the fixed text. ``ready_s`` is when the turn could first be
sent (its predecessor's end), so a turn's queueing time does not count the wait for it.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, replace

from rayfleet.bench.client import RequestResult
from rayfleet.bench.datasets import Prompt


@dataclass
class Turn:
    """One chat turn of a session: what it waits for, and what it tells the next."""

    prompt: Prompt
    answers: list[str | None]
    after: asyncio.Future[float] | None
    ended: asyncio.Future[float]

    async def ready(self) -> tuple[Prompt, float]:
        """The prompt with its session's answers so far in place of the fixed ones, once the
        turn before has ended, and the time it ended (now for a session's first turn)."""
        ready_s = await asyncio.shield(self.after) if self.after else time.perf_counter()
        return with_answers(self.prompt, self.answers), ready_s

    def end(self, result: RequestResult | None) -> None:
        """Record this turn's answer (None when it failed or never ran) and free the next."""
        if self.ended.done():
            return
        self.answers.append(result.text if result is not None and result.ok else None)
        self.ended.set_result(time.perf_counter())


class Conversations:
    """The sessions of one run: each session's answers so far and its latest turn."""

    def __init__(self) -> None:
        self._answers: dict[int, list[str | None]] = {}
        self._latest: dict[int, Turn] = {}

    def turn(self, prompt: Prompt) -> Turn | None:
        """The next turn of ``prompt``'s session (None for a prompt of no session); call in
        the session's order."""
        if prompt.session is None:
            return None
        previous = self._latest.get(prompt.session)
        answers = self._answers.setdefault(prompt.session, [])
        after = previous.ended if previous else None
        turn = Turn(prompt, answers, after, asyncio.get_running_loop().create_future())
        self._latest[prompt.session] = turn
        return turn


def with_answers(prompt: Prompt, answers: list[str | None]) -> Prompt:
    """``prompt`` with its n-th assistant message replaced by ``answers[n]`` where that is
    known."""
    if not prompt.messages or all(answer is None for answer in answers):
        return prompt
    messages = []
    num_seen = 0
    for role, content in prompt.messages:
        if role == "assistant":
            answer = answers[num_seen] if num_seen < len(answers) else None
            content = answer if answer is not None else content
            num_seen += 1
        messages.append((role, content))
    return replace(prompt, messages=tuple(messages))
