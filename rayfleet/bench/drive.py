"""Send one schedule of requests from one event loop, and count what comes back.

A chat session's turns go as a closed loop (``bench.conversations``): each once the turn
before it has ended, with the answers its session got.

``drive`` is the sending loop that ``runner.py`` runs in its own process or in each worker
process, on the event loop ``use_uvloop`` chooses; ``Counts`` is its live progress and
``RunOutput`` what it returns.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import time
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from rayfleet.bench.client import RequestResult, Target, open_session, request_headers, send_request
from rayfleet.bench.conversations import Conversations, Turn
from rayfleet.bench.datasets import Prompt


@dataclass
class Counts:
    """Live progress: requests done, failed, and output tokens so far."""

    num_done: int = 0
    num_failed: int = 0
    num_output_tokens: int = 0

    def add(self, result: RequestResult) -> None:
        self.num_done += 1
        if result.ok:
            self.num_output_tokens += result.num_output_tokens
        else:
            self.num_failed += 1


@dataclass
class RunOutput:
    """The requests of one run and its wall-clock span."""

    results: list[RequestResult] = field(default_factory=list)
    start_s: float = 0.0
    end_s: float = 0.0
    num_cancelled: int = 0
    interrupted: bool = False

    @property
    def duration_s(self) -> float:
        return self.end_s - self.start_s


def use_uvloop() -> None:
    """uvloop when installed, unless RAYFLEET_BENCH_EVENT_LOOP=asyncio asks for asyncio's own
    loop (the one vLLM's benchmark runs on, to compare the two clients like with like)."""
    if os.environ.get("RAYFLEET_BENCH_EVENT_LOOP", "uvloop") == "asyncio":
        return
    with contextlib.suppress(ImportError):
        import uvloop

        asyncio.set_event_loop_policy(uvloop.EventLoopPolicy())


async def drive(
    target: Target,
    prompts: Sequence[Prompt],
    offsets_s: np.ndarray,
    max_concurrency: int | None,
    counts: Counts,
    stop: asyncio.Event,
    start_s: float | None = None,
    max_connections: int | None = None,
) -> RunOutput:
    """Send each prompt at its offset from ``start_s`` (now if None) with at most
    ``max_concurrency`` in flight over at most ``max_connections`` connections; stop
    early when ``stop`` is set."""
    headers = request_headers(target)
    limit = asyncio.Semaphore(max_concurrency) if max_concurrency else contextlib.nullcontext()
    tasks: list[asyncio.Task[RequestResult]] = []

    conversations = Conversations()

    async def one(prompt: Prompt, scheduled_s: float, turn: Turn | None) -> RequestResult:
        result = None
        try:
            if turn:
                prompt, ready_s = await turn.ready()
                scheduled_s = max(scheduled_s, ready_s)
            async with limit:
                result = await send_request(session, target, prompt, headers, bool(turn))
        finally:
            if turn:
                turn.end(result)
        result.scheduled_s = scheduled_s
        counts.add(result)
        return result

    async def dispatch(run_start_s: float) -> None:
        for prompt, offset_s in zip(prompts, offsets_s.tolist(), strict=True):
            # A loop, not one sleep: uvloop's timers count from the time its loop iteration
            # began, so on a busy machine one sleep can wake before the request is due.
            while (delay_s := run_start_s + offset_s - time.perf_counter()) > 0:
                await asyncio.sleep(delay_s)
            turn = conversations.turn(prompt)
            tasks.append(asyncio.create_task(one(prompt, run_start_s + offset_s, turn)))
        if tasks:
            await asyncio.wait(tasks)

    async with open_session(max_concurrency, max_connections) as session:
        output = RunOutput(start_s=start_s if start_s is not None else time.perf_counter())
        dispatcher = asyncio.create_task(dispatch(output.start_s))
        stopper = asyncio.create_task(stop.wait())
        await asyncio.wait({dispatcher, stopper}, return_when=asyncio.FIRST_COMPLETED)
        output.interrupted = stop.is_set()
        for task in (dispatcher, stopper, *tasks):
            task.cancel()
        await asyncio.gather(dispatcher, stopper, *tasks, return_exceptions=True)
        output.end_s = time.perf_counter()
    finished = [t for t in tasks if not t.cancelled()]
    output.results = [t.result() for t in finished]
    output.num_cancelled = len(tasks) - len(finished)
    return output
