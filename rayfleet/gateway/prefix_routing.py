"""``PrefixRouting``: the replica that already holds the prompt's prefix, unless its queue
costs more than the prefill it saves.

For each candidate the pick estimates the work the request would wait for there, in one
unit: the time to prefill one block of the prompt (``block_chars`` characters, about one
KV block)::

    cost(replica) = alpha * uncached_blocks(replica) + num_inflight(replica) * request_cost

``uncached_blocks`` is the prompt's whole blocks past the longest prefix the replica holds
(prefix_index.py). ``request_cost`` is what one request in flight adds to a newcomer's
wait there, in the same unit: ``request_cost_blocks``, 2 unless set. Most requests in
flight are decoding, and with continuous batching a decoding sequence adds only its share
of each step to the newcomer's prefill (on the tiny model's calibrated spec, about a fifth
of one block's prefill). So a replica holding a shared prefix keeps winning while the
requests it has more than another cost less than the prefill it saves, and no longer: a
dominant prefix spreads to a second replica as soon as the first one's extra queue
outweighs it, with no fixed gap and no switch for the whole fleet. Replicas with
``max_inflight`` requests in flight are skipped while another has room. Ties go to the
tied replica where the prompt evicts least, and among those to a random one: one with room
for its new blocks (the emptiest), else the one whose least recently used prefix was used
longest ago. On two real vLLM servers that each hold 60% of the workload's prefixes,
groups placed by chance split unevenly (5 and 3 of 8, say), and the fuller server evicted
what it would have reused; once every index is full, a replica holding more groups than
its cache keeps evicting prefixes it uses again soon, so its oldest is recent, and a group
it lost goes to the other replica instead of back to it (chat on two simulated replicas
capped as the vLLM benchmark caps them: README, "Chat").

``request_cost_blocks: null`` learns the cost instead, as the recent mean of the blocks
each routed request had left to prefill (at least one); at saturation that spirals (a low
hit rate raises the mean, which breaks affinity sooner): 1.44x least load's throughput on
the simulated fleet, against 3.8x at 2 (README, "The request cost").

The cost alone lets one dominant prefix make its holders hot: a request whose prompt is
cached costs a newcomer little, while its decode steps keep the replica busy as long as
anyone's. So the pick is also bounded in load, as ``session`` is (``load_bound``): a
replica with ``ceil((1 + load_factor) * (all in flight + 1) / replicas)`` requests in
flight, at least 2, is passed over; some replica is always under the bound. A hot prefix
then spills to more replicas, each of which caches it once. ``load_factor`` is 0.5 unless
set: on the simulated fleet (8 replicas, one group taking half the requests) the holders'
busy time was 1.21x the mean at 0.5 and 1.31-1.38x at 1.0, and shared-prefix's hit rate
0.79 against 0.83.

The pick is one pass over the candidates that looks up only the replicas whose queue alone
(``num_inflight * request_cost``) costs no more than the best so far: the others cannot
win, and the choice is the one comparing every cost would make. Looking up all 64 of the
benchmark's replicas and then comparing in a second pass cost about 30 us of a 60 us pick
(benchmarks/prefix_pick.py); there, about 21 replicas a pick hold the prompt's first
block and have their held length searched.

The index learns on send: the chosen replica is recorded as holding every whole block of
the prompt (and, once the response ends, of the answer: below), and remembers for each
replica about as much as its KV cache holds (``size_index``: vLLM's cache_config_info,
read with each replica's /metrics, in tokens, times the prompt characters per token
learned from the replicas' usage reports; ``routing.index_blocks`` until the first
reading, and at most). A replica whose url or pid
changed (a restart) is forgotten and starts empty, as is one whose engine's start time
moved (``engine_started``: vLLM's process_start_time_seconds, read with its /metrics);
one that no candidate list has named for a minute is forgotten too.

Under ``gateway.workers`` each worker has its own index, and tells the others what each
pick taught it (``on_learn``, ``learn_from_peer``; index_sharing.py), so every worker's
index holds what the whole gateway sent.

The policy checks itself: ``observe_usage`` gets the prompt tokens and the cached tokens
a replica reported for a request it placed (vLLM's ``usage.prompt_tokens_details``, read
by the gateway once the response ended), so that the realised hit rate stands next to the
predicted one (``hit_rates``; per replica in ``/metrics`` through ``on_usage``).

It also gets the answer, and charges it (prompt_blocks.py): the replica's table records
the prompt again (its most recent) and after it the answer's whole blocks, the answer's
the most likely to go, as vLLM frees a sequence's tail first. The prompt's hashes, length
and last partial block come from the pick, kept in the request's ``memo``
(``observe_usage`` gets the ``RequestInfo`` the pick got), so the end of a response
neither renders nor hashes the prompt again.
"""

from __future__ import annotations

import logging
import math
import random
import time
from collections.abc import Callable, Sequence

from rayfleet.config.routing import RoutingConfig
from rayfleet.gateway.prefix_index import (
    BlockHasher,
    BlockTable,
    PrefixIndex,
    held_length,
    held_prefix,
)
from rayfleet.gateway.prompt_blocks import PromptBlocks, answer_blocks, prompt_blocks
from rayfleet.gateway.replica_policy import RequestInfo, load_bound
from rayfleet.gateway.replicas import Replica

log = logging.getLogger("rayfleet.gateway")

# What a pick reports: the replica chosen, the blocks it is predicted to hold, the blocks.
PickObserver = Callable[[Replica, int, int], None]
# What a replica reported of a request the policy placed: prompt tokens, cached tokens.
UsageCounter = Callable[[Replica, int, int], None]

_CHARS_PER_TOKEN = 4  # of English text: the index's size until usage has been reported
_COST_EWMA_WEIGHT = 1 / 64  # the learned request cost follows about the last 64 requests
_MIN_REQUEST_COST = 1.0


class PrefixRouting:
    """A ``ReplicaPolicy`` weighing cached prefixes against queued work."""

    name = "prefix"

    def __init__(
        self,
        config: RoutingConfig = RoutingConfig(policy="prefix"),
        *,
        rng: random.Random | None = None,
        observe: PickObserver | None = None,
        on_usage: UsageCounter | None = None,
        clock: Callable[[], float] = time.monotonic,
    ):
        self.block_chars = config.block_chars
        self.alpha = config.alpha
        self.max_inflight = config.max_inflight
        self.load_factor = config.bounded_load_factor
        self.fixed_cost = config.request_cost_blocks
        self.fixed_chars_per_token = config.chars_per_token
        self.learns_answer_text = config.answer_text
        self.num_usage_chars = 0  # prompt characters of the requests usage was reported for
        self.num_usage_tokens = 0  # and their prompt tokens
        self.index = PrefixIndex(config.index_blocks)
        self.hasher = BlockHasher(config.block_chars)
        self.learned_cost = _MIN_REQUEST_COST
        self._rng = rng or random.Random()
        self._observe = observe
        self._on_usage = on_usage
        self._clock = clock
        self.num_predicted_hit_blocks = 0
        self.num_prompt_blocks = 0
        self.num_realised_hit_tokens = 0
        self.num_realised_prompt_tokens = 0
        # Told what each pick taught the index: under gateway.workers, the other workers
        # learn it too (index_sharing.py).
        self.on_learn: Callable[[Replica, list[int]], None] | None = None

    def size_index(self, replica: Replica, kv_cache_tokens: int) -> None:
        """Bound what the index remembers of ``replica`` to what its KV cache holds:
        ``kv_cache_tokens`` (vLLM's cache_config_info) times ``chars_per_token``, in
        blocks of ``block_chars``; ``routing.index_blocks`` stays the upper bound."""
        num_blocks = math.ceil(kv_cache_tokens * self.chars_per_token / self.block_chars)
        self.index.size(replica.replica_id, num_blocks)

    def engine_started(self, replica: Replica, start_time: float) -> None:
        """Note when ``replica``'s engine started (vLLM's ``process_start_time_seconds``,
        read with its /metrics): a start that moved is a restart the url and pid do not
        show (an engine restarted in place, a simulator's restart), and its index starts
        empty."""
        if self.index.started(replica.replica_id, start_time):
            log.info("replica %s restarted: its prefix index starts empty", replica.replica_id)

    @property
    def chars_per_token(self) -> float:
        """Prompt characters per token: ``routing.chars_per_token``, else the ratio over
        every request whose usage a replica reported, else 4 (English text). Tokenizers
        differ: the tiny test model's reads about 5 characters a token of the routing
        benchmark's prompts, so at 4 the index would hold a fifth less than each cache."""
        if self.fixed_chars_per_token is not None:
            return self.fixed_chars_per_token
        if self.num_usage_tokens == 0:
            return _CHARS_PER_TOKEN
        return self.num_usage_chars / self.num_usage_tokens

    @property
    def request_cost(self) -> float:
        """What one request in flight weighs, in blocks to prefill."""
        return self.fixed_cost if self.fixed_cost is not None else self.learned_cost

    def pick(self, request: RequestInfo, replicas: Sequence[Replica]) -> Replica | None:
        if not replicas:
            return None
        if self.max_inflight is not None:
            roomy = [r for r in replicas if r.num_inflight < self.max_inflight]
            replicas = roomy or replicas
        hashes = self._prompt(request).hashes
        now = self._clock()
        tables = self.index.tables_of(replicas, now)
        bound = load_bound(replicas, self.load_factor)
        i, held = self._cheapest(replicas, tables, hashes, bound)
        self.index.record(tables[i], hashes, held)
        if self.on_learn is not None:
            self.on_learn(replicas[i], hashes)
        if self.fixed_cost is None:  # the weight is learned only where it is used
            self._learn(len(hashes) - held)
        self.index.sweep(now)
        self.num_predicted_hit_blocks += held
        self.num_prompt_blocks += len(hashes)
        if self._observe is not None:
            self._observe(replicas[i], held, len(hashes))
        return replicas[i]

    def _cheapest(
        self,
        replicas: Sequence[Replica],
        tables: Sequence[BlockTable],
        hashes: Sequence[int],
        bound: int,
    ) -> tuple[int, int]:
        """The position of the replica of least cost among those with fewer than ``bound``
        in flight, ties at random, and the blocks it holds. A replica whose queue alone
        costs more than the best so far is not looked up: its cost can only be higher."""
        alpha = self.alpha
        cost_each = self.request_cost
        num_blocks = len(hashes)
        first = hashes[0] if hashes else None
        best = math.inf
        tied: list[tuple[int, int]] = []  # (position, blocks held)
        guess = 1  # replicas holding a shared prefix mostly hold the same length
        for i, replica in enumerate(replicas):
            if replica.num_inflight >= bound:
                continue
            load = replica.num_inflight * cost_each
            if load > best:
                continue
            held = 0
            if first in tables[i]:
                held = guess = held_length(tables[i], hashes, guess)
            cost = alpha * (num_blocks - held) + load
            if cost < best:
                best = cost
                tied = [(i, held)]
            elif cost == best:
                tied.append((i, held))
        if len(tied) == 1:
            return tied[0]
        return self._rng.choice(self._roomiest(tied, tables, num_blocks))

    def _roomiest(
        self, tied: list[tuple[int, int]], tables: Sequence[BlockTable], num_blocks: int
    ) -> list[tuple[int, int]]:
        """Of replicas tied in cost, those where the prompt's new blocks evict least
        (``PrefixIndex.eviction_order``): one with room, the emptiest; else the one whose
        least recently used prefix was used longest ago. So the groups of a workload split
        evenly over the replicas instead of by chance, and a prefix that a replica holding
        more than its cache evicted moves to one with room instead of coming back."""
        order = self.index.eviction_order
        keys = [order(tables[i], num_blocks - held) for i, held in tied]
        least = min(keys)
        return [entry for entry, key in zip(tied, keys, strict=True) if key == least]

    def learn_from_peer(self, replica: Replica, hashes: Sequence[int]) -> None:
        """What another worker of the gateway sent ``replica``: it holds ``hashes`` now."""
        self.index.record(self.index.table_of(replica), hashes)

    def _learn(self, uncached_blocks: int) -> None:
        cost = max(float(uncached_blocks), _MIN_REQUEST_COST)
        self.learned_cost += (cost - self.learned_cost) * _COST_EWMA_WEIGHT

    def observe_usage(
        self,
        replica: Replica,
        request: RequestInfo,
        prompt_tokens: int,
        cached_tokens: int | None,
        completion_tokens: int = 0,
        answer: str | None = None,
    ) -> None:
        """Learn the tokenizer's characters per token from a request this policy placed,
        count what ``replica`` reported cached of it (when it reports that), and charge its
        answer's blocks to the replica's table (``answer``: its text, when known)."""
        prompt = self._prompt(request)
        if self.fixed_chars_per_token is None and prompt_tokens > 0:
            self.num_usage_chars += prompt.num_chars
            self.num_usage_tokens += prompt_tokens
        if completion_tokens > 0 or answer:
            self._charge_answer(replica, prompt, completion_tokens, request.path, answer)
        if cached_tokens is None:
            return
        self.num_realised_hit_tokens += cached_tokens
        self.num_realised_prompt_tokens += prompt_tokens
        if self._on_usage is not None:
            self._on_usage(replica, prompt_tokens, cached_tokens)

    def _prompt(self, request: RequestInfo) -> PromptBlocks:
        """The routing key of ``request``, worked out once for its pick and its usage."""
        prompt = request.memo.get(self)
        if not isinstance(prompt, PromptBlocks):
            prompt = prompt_blocks(self.hasher, request.path, request.body)
            request.memo[self] = prompt
        return prompt

    def wants_answer(self, request: RequestInfo) -> bool:
        """Whether ``observe_usage`` should get the answer's text: a completion's or a
        chat's single answer, which the index records after the prompt as the next turn
        will repeat it."""
        return (
            self.learns_answer_text
            and request.path.endswith("completions")
            and request.body.get("n") in (None, 1)
        )

    def _charge_answer(
        self, replica: Replica, prompt: PromptBlocks, num_tokens: int, path: str, answer: str | None
    ) -> None:
        """The replica now holds the prompt and its answer's whole blocks (prompt_blocks.py)."""
        sequence = answer_blocks(
            prompt,
            num_tokens,
            answer,
            path=path,
            block_chars=self.block_chars,
            chars_per_token=self.chars_per_token,
            getrandbits=self._rng.getrandbits,
        )
        if not sequence:
            return
        table = self.index.table_of(replica)
        self.index.record(table, sequence, held_prefix(table, prompt.hashes))
        if self.on_learn is not None:
            self.on_learn(replica, sequence)

    def hit_rates(self) -> tuple[float, float]:
        """(predicted, realised) hit rates so far: blocks predicted held over prompt blocks
        sent, and cached tokens reported over prompt tokens reported."""
        predicted = self.num_predicted_hit_blocks / max(self.num_prompt_blocks, 1)
        realised = self.num_realised_hit_tokens / max(self.num_realised_prompt_tokens, 1)
        return predicted, realised
