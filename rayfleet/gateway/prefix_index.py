"""Which prompt prefixes each replica holds: the routing key and a bounded index of it.

    text = prompt_text(path, body)          # the prompt as the engine sees it, prefix-stable
    hashes = block_hashes(text, 64)         # one chained hash per whole block of 64 chars
    index = PrefixIndex(capacity_blocks=16384)
    tables = index.tables_of(replicas, now) # each replica's blocks; a restarted one empty
    held = held_prefix(tables[i], hashes)   # leading blocks of the prompt replica i holds
    index.record(tables[i], hashes)         # learn on send

The key. A chat's text is its tools (JSON, first, since a template puts them before the
messages) and then each message's role and content in order, so turn k of a conversation
is a prefix of turn k+1; a completion's is its prompt. Only whole blocks are hashed (vLLM
caches whole KV blocks only; 64 characters is about one 16-token block at about 4
characters per token), and block i's hash covers blocks 0..i (``hash((previous, block))``),
so one lookup answers "does this replica hold the prompt up to block i". The hashes are
Python's ``hash``, salted per process: the index lives in one gateway process.

The index is an LRU of block hashes per replica, at most ``capacity_blocks`` each. A
prompt is recorded last block first, so its first blocks are the most recent and are
evicted last (as vLLM frees the tail of a sequence before its head). Since block i of a
chain is touched after block j > i every time, it is always the more recent: a replica's
blocks of any prompt form a prefix, and ``held_prefix`` finds its length by binary search
(one lookup for a replica without the first block, about log2(blocks) for one with it).
A first version kept a table of hash -> bit mask of holders to match every replica in one
pass; its extra dictionary, 100k entries at the benchmark's size, doubled the cache misses
of recording and cost 50 us of a 120 us pick on the 2-core development machine.

Memory: about 112 bytes per indexed block on CPython 3.11 (a dict entry, its share of
the table, the hash's int; measured by benchmarks/prefix_pick.py), plus up to 1/16 over
capacity between evictions: the default 16,384 blocks are about 2 MB per replica, 125 MB
for 64 replicas at most.
"""

from __future__ import annotations

import itertools
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from rayfleet.gateway.replicas import Replica

_FORGET_UNSEEN_S = 60.0  # a replica absent from every candidate list this long is gone
_SWEEP_EVERY_S = 1.0


def prompt_text(path: str, body: Mapping[str, Any]) -> str:
    """The routing key of a request: its prompt as text, stable as a conversation grows."""
    if path.endswith("/chat/completions"):
        return _chat_text(body)
    prompt = body.get("prompt", body.get("input", ""))
    if isinstance(prompt, str):
        return prompt
    if isinstance(prompt, list) and prompt and all(isinstance(p, str) for p in prompt):
        return "\x1e".join(prompt)
    return json.dumps(prompt, separators=(",", ":"))


def _chat_text(body: Mapping[str, Any]) -> str:
    parts: list[str] = []
    tools = body.get("tools")
    if tools:
        parts.append(json.dumps(tools, separators=(",", ":"), sort_keys=True))
    for message in body.get("messages") or ():
        if not isinstance(message, Mapping):
            continue
        parts.append(f"\x1e{message.get('role', '')}\x1f")
        content = message.get("content")
        if isinstance(content, str):
            parts.append(content)
        elif isinstance(content, list):
            for item in content:
                text = item.get("text") if isinstance(item, Mapping) else None
                parts.append(text if isinstance(text, str) else json.dumps(item, sort_keys=True))
        calls = message.get("tool_calls")
        if calls:
            parts.append(json.dumps(calls, separators=(",", ":"), sort_keys=True))
    return "".join(parts)


def block_hashes(text: str, block_chars: int) -> list[int]:
    """One hash per whole block of ``text``, each covering every block before it too."""
    h = block_chars
    ends = range(block_chars, len(text) + 1, block_chars)
    return [h := hash((h, text[end - block_chars : end])) for end in ends]


Blocks = dict[int, None]  # insertion-ordered: the least recently used first


def held_by(tables: Sequence[Blocks], hashes: Sequence[int]) -> list[int]:
    """For each table, how many leading blocks of ``hashes`` it holds."""
    if not hashes:
        return [0] * len(tables)
    first = hashes[0]
    held = []
    guess = 1
    for blocks in tables:
        if first in blocks:
            guess = held_prefix(blocks, hashes, guess)
            held.append(guess)
        else:
            held.append(0)
    return held


def held_prefix(blocks: Blocks, hashes: Sequence[int], guess: int = 1) -> int:
    """How many leading blocks of ``hashes`` are in ``blocks`` (prefix-closed), tried at
    ``guess`` first: replicas that hold a shared prefix mostly hold the same length."""
    if not hashes or hashes[0] not in blocks:
        return 0
    n = len(hashes)
    guess = guess if 1 <= guess <= n else 1
    if hashes[guess - 1] in blocks:
        if guess == n or hashes[guess] not in blocks:
            return guess
        low, high = guess + 1, n  # the answer is in [low, high]
    else:
        low, high = 1, guess - 1
    while low < high:
        mid = (low + high + 1) // 2
        if hashes[mid - 1] in blocks:
            low = mid
        else:
            high = mid - 1
    return low


@dataclass
class _Holder:
    """One replica's place in the index."""

    replica: Replica
    url: str
    pid: int
    seen_at: float
    blocks: Blocks = field(default_factory=dict)


class PrefixIndex:
    """Bounded LRUs of block hashes, one per replica."""

    def __init__(self, capacity_blocks: int):
        self.capacity_blocks = capacity_blocks
        self._slack = capacity_blocks // 16
        self._holders: dict[str, _Holder] = {}  # by replica id
        self._swept_at = 0.0

    # -- membership -------------------------------------------------------------------

    def tables_of(self, replicas: Sequence[Replica], now: float) -> list[Blocks]:
        """Each replica's block table, in order; a replica first seen, or whose url or pid
        changed (a restart), gets an empty one."""
        holders = self._holders
        tables = []
        for replica in replicas:
            holder = holders.get(replica.replica_id)
            if holder is None or holder.replica is not replica:
                holder = self._admit(replica, holder)
            holder.seen_at = now
            tables.append(holder.blocks)
        return tables

    def _admit(self, replica: Replica, known: _Holder | None) -> _Holder:
        if known is not None and (known.url, known.pid) == (replica.url, replica.pid):
            known.replica = replica  # the same server, in a Replica object of its own
            return known
        holder = _Holder(replica, replica.url, replica.pid, 0.0)
        self._holders[replica.replica_id] = holder
        return holder

    def forget(self, replica_id: str) -> None:
        """Drop everything known of a replica (it left or restarted)."""
        self._holders.pop(replica_id, None)

    def sweep(self, now: float) -> None:
        """Forget replicas no candidate list has named for a while (at most once a second)."""
        if now - self._swept_at < _SWEEP_EVERY_S:
            return
        self._swept_at = now
        gone = [rid for rid, h in self._holders.items() if now - h.seen_at > _FORGET_UNSEEN_S]
        for replica_id in gone:
            self.forget(replica_id)

    # -- learning ---------------------------------------------------------------------

    def record(self, blocks: Blocks, hashes: Sequence[int]) -> None:
        """Learn that the replica of ``blocks`` now holds every block of ``hashes``; the
        least recently used go, a slack of 1/16 of the capacity at a time."""
        for h in reversed(hashes):
            if h in blocks:
                del blocks[h]  # to the end: the most recent
            blocks[h] = None
        excess = len(blocks) - self.capacity_blocks
        if excess > self._slack:
            for old in list(itertools.islice(blocks, excess)):
                del blocks[old]

    # -- what it holds ----------------------------------------------------------------

    def num_blocks(self) -> dict[str, int]:
        """Blocks indexed per replica id."""
        return {rid: len(h.blocks) for rid, h in self._holders.items()}

    @property
    def num_replicas(self) -> int:
        return len(self._holders)
