"""One simulated replica's engine: a scheduler stepping in real time on the event loop.

Each step batches every running request's next token (decodes) with prefill chunks of
new or partly prefilled requests, within ``max_num_batched_tokens`` and
``max_num_seqs`` (vLLM v1's continuous batching with chunked prefill, running requests
first, then waiting ones in arrival order). The step sleeps for its modelled cost
(``EngineSpec.step_cost_s``), then hands out tokens: a request whose prompt is fully
computed gets its first token at the end of that step, a decoding one its next.

A new request's prompt is matched against the prefix cache at admission, block by block
and never the whole prompt (vLLM recomputes at least the last token), and only the
uncached part is prefilled. A request whose blocks do not fit waits, and so do the ones
behind it (first come, first served). Time is the loop's own clock, so a gateway in
front sees real latencies; one step loop runs per replica.

Callers ``submit`` a ``SimRequest`` and read its ``events`` queue: the number of tokens
made so far after each step that made one, then ``None`` at the end (``error`` set when
the replica restarted under it).
"""

from __future__ import annotations

import asyncio
import time
from collections import deque
from dataclasses import dataclass, field

from rayfleet.sim.cache import Allocation, KVCache
from rayfleet.sim.spec import EngineSpec
from rayfleet.sim.stats import EngineStats
from rayfleet.sim.tokens import OUTPUT_TOKEN_TEXT, block_hashes


@dataclass(eq=False)
class SimRequest:
    """A request as the engine sees it: its prompt's length and block hashes, and the
    prompt's text after its last full block (where the answer's first block starts)."""

    num_prompt_tokens: int
    max_tokens: int
    hashes: list[int]
    tail: str = ""
    arrival_s: float = field(default_factory=time.monotonic)
    num_cached_tokens: int = 0
    num_computed_tokens: int = 0
    num_output_tokens: int = 0
    allocation: Allocation = field(default_factory=Allocation)
    events: asyncio.Queue[int | None] = field(default_factory=asyncio.Queue)
    error: str = ""

    @property
    def is_prefilling(self) -> bool:
        return self.num_computed_tokens < self.num_prompt_tokens


@dataclass
class Step:
    """One step's batch: prefill chunks by request, and the decoding requests."""

    chunks: list[tuple[SimRequest, int]] = field(default_factory=list)
    decodes: list[SimRequest] = field(default_factory=list)

    @property
    def num_prefill_tokens(self) -> int:
        return sum(n for _, n in self.chunks)


class Engine:
    """The scheduler, KV cache and counters of one simulated replica."""

    def __init__(self, spec: EngineSpec):
        self.spec = spec
        self.cache = KVCache(spec.num_gpu_blocks)
        self.waiting: deque[SimRequest] = deque()
        self.running: list[SimRequest] = []
        self.stats = EngineStats()
        self.generation = 0
        self._wake = asyncio.Event()

    def num_blocks_needed(self, request: SimRequest) -> int:
        total = request.num_prompt_tokens + request.max_tokens
        return -(-total // self.spec.block_size)

    def submit(self, request: SimRequest) -> None:
        """Queue a request; its tokens arrive on ``request.events``."""
        self.waiting.append(request)
        self._wake.set()

    async def run(self) -> None:
        """Step while there is work, sleep on an event while there is none."""
        loop = asyncio.get_running_loop()
        while True:
            if not self.running and not self.waiting:
                self._wake.clear()
                await self._wake.wait()
            step = self.schedule()
            cost_s = self.spec.step_cost_s(step.num_prefill_tokens, len(step.decodes))
            start_s, generation = loop.time(), self.generation
            await asyncio.sleep(cost_s)
            if generation != self.generation:  # restarted during the step: its work is lost
                continue
            self.stats.busy_s += max(cost_s, loop.time() - start_s)
            self.stats.num_steps += 1
            self.finish(step)

    def schedule(self) -> Step:
        step = Step()
        budget = self.spec.max_num_batched_tokens
        for request in self.running:
            if budget <= 0:
                break
            if request.is_prefilling:
                chunk = min(budget, request.num_prompt_tokens - request.num_computed_tokens)
                step.chunks.append((request, chunk))
                budget -= chunk
            else:
                step.decodes.append(request)
                budget -= 1
        while self.waiting and budget > 0 and len(self.running) < self.spec.max_num_seqs:
            request = self.waiting[0]
            if not self.admit(request):
                break
            self.waiting.popleft()
            self.running.append(request)
            chunk = min(budget, request.num_prompt_tokens - request.num_computed_tokens)
            step.chunks.append((request, chunk))
            budget -= chunk
        return step

    def admit(self, request: SimRequest) -> bool:
        """Match the prompt against the cache and reserve its blocks, if they fit."""
        block_size = self.spec.block_size
        max_hit_blocks = (request.num_prompt_tokens - 1) // block_size
        hits = request.hashes[: self.cache.num_hit_blocks(request.hashes[:max_hit_blocks])]
        num_new = self.num_blocks_needed(request) - len(hits)
        if not self.cache.can_allocate(hits, num_new):
            return False
        request.allocation = self.cache.allocate(hits, num_new)
        request.num_cached_tokens = request.num_computed_tokens = len(hits) * block_size
        self.stats.prefix_cache_queries += request.num_prompt_tokens
        self.stats.prefix_cache_hits += request.num_cached_tokens
        return True

    def finish(self, step: Step) -> None:
        """Hand out the step's tokens and retire finished requests."""
        now_s = time.monotonic()
        block_size = self.spec.block_size
        for request, chunk in step.chunks:
            before = request.num_computed_tokens // block_size
            request.num_computed_tokens += chunk
            after = min(request.num_computed_tokens // block_size, len(request.hashes))
            for h in request.hashes[before:after]:
                self.cache.commit(request.allocation, h)
            if not request.is_prefilling:
                self.stats.record_first_token(request, now_s)
                self.emit(request)
        for request in step.decodes:
            self.emit(request)
        if any(r.num_output_tokens >= r.max_tokens for r in self.running):
            self.running = [r for r in self.running if not self.retire_if_done(r)]

    def emit(self, request: SimRequest) -> None:
        request.num_output_tokens += 1
        self.stats.generation_tokens += 1
        request.events.put_nowait(request.num_output_tokens)

    def retire_if_done(self, request: SimRequest) -> bool:
        if request.num_output_tokens < request.max_tokens:
            return False
        self.cache_answer(request)
        self.cache.free(request.allocation)
        self.stats.num_finished += 1
        request.events.put_nowait(None)
        return True

    def cache_answer(self, request: SimRequest) -> None:
        """Hash the answer's full blocks, chained on from the prompt's, as vLLM hashes every
        full block of a sequence: freed, they stay cached (the next turn of a chat, which
        repeats the answer, reuses them) and take room from older prefixes like any block."""
        answer = request.tail + OUTPUT_TOKEN_TEXT * request.num_output_tokens
        parent = request.hashes[-1] if request.hashes else 0
        for h in block_hashes(answer, self.spec.block_size, parent):
            self.cache.commit(request.allocation, h)

    def abort(self, request: SimRequest) -> None:
        """Drop a request whose client went away (vLLM aborts it too)."""
        if request in self.waiting:
            self.waiting.remove(request)
        elif request in self.running:
            self.running.remove(request)
            self.cache.free(request.allocation)

    def restart(self) -> None:
        """What a process restart does: in-flight requests fail, the cache and the
        counters start empty, and the start time moves (vLLM's process_start_time)."""
        for request in [*self.running, *self.waiting]:
            request.error = "replica restarted"
            request.events.put_nowait(None)
        self.running.clear()
        self.waiting.clear()
        self.cache = KVCache(self.spec.num_gpu_blocks)
        self.stats = EngineStats()
        self.generation += 1
