"""Which prompt prefixes each replica holds: the routing key and a bounded index of it.

    text = prompt_text(path, body)          # the prompt as the engine sees it, prefix-stable
    hashes = block_hashes(text, 64)         # one chained hash per whole block of 64 chars
    index = PrefixIndex(capacity_blocks=16384)
    slot = index.slot_of(replica)           # a replica's place; a restarted one starts empty
    matched = index.match(hashes, mask)     # {slot: blocks of the prompt's prefix it holds}
    index.record(slot, hashes)              # learn on send

The key. A chat's text is its tools (JSON, first, since a template puts them before the
messages) and then each message's role and content in order, so turn k of a conversation
is a prefix of turn k+1; a completion's is its prompt. Only whole blocks are hashed (vLLM
caches whole KV blocks only; 64 characters is about one 16-token block at about 4
characters per token), and block i's hash covers blocks 0..i (``hash((previous, block))``),
so one lookup per block answers "does this replica hold the prefix up to here". The hashes
are Python's ``hash``, salted per process: the index lives in one gateway process.

The index. Each replica has an LRU of the block hashes last sent to it, at most
``capacity_blocks``; a second table maps each hash to a bit mask of the replicas holding
it, so matching a prompt against every replica is one dictionary lookup per block (not
per block and replica), stopping at the first block no candidate holds. A prompt is
recorded last block first, so that its first blocks are the most recent and are evicted
last, as vLLM frees the tail of a sequence before its head.

Memory: about 190 bytes per indexed block per replica on CPython 3.11 (an OrderedDict
entry with its link, the hash object, and the mask table's share), so the default 16,384
blocks are about 3 MB per replica and 64 replicas at the default about 200 MB at most.
benchmarks/prefix_pick.py measures it.
"""

from __future__ import annotations

import json
from collections import OrderedDict
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
    hashes = []
    h = block_chars
    for start in range(0, len(text) - block_chars + 1, block_chars):
        h = hash((h, text[start : start + block_chars]))
        hashes.append(h)
    return hashes


@dataclass
class _Holder:
    """One replica's place in the index."""

    slot: int
    replica: Replica
    url: str
    pid: int
    seen_at: float
    blocks: OrderedDict[int, None] = field(default_factory=OrderedDict)


class PrefixIndex:
    """Bounded per-replica LRUs of block hashes, with a mask table for matching."""

    def __init__(self, capacity_blocks: int):
        self.capacity_blocks = capacity_blocks
        self._holders: dict[str, _Holder] = {}  # by replica id
        self._by_slot: dict[int, _Holder] = {}
        self._masks: dict[int, int] = {}  # block hash -> bit mask of the slots holding it
        self._free_slots: list[int] = []
        self._next_slot = 0
        self._swept_at = 0.0

    # -- membership -------------------------------------------------------------------

    def slot_of(self, replica: Replica, now: float) -> int:
        """``replica``'s slot; a replica whose url or pid changed is forgotten first."""
        holder = self._holders.get(replica.replica_id)
        if holder is not None and holder.replica is not replica:
            if holder.url != replica.url or holder.pid != replica.pid:
                self.forget(replica.replica_id)
                holder = None
            else:
                holder.replica = replica
        if holder is None:
            slot = self._free_slots.pop() if self._free_slots else self._take_slot()
            holder = _Holder(slot, replica, replica.url, replica.pid, now)
            self._holders[replica.replica_id] = holder
            self._by_slot[slot] = holder
        holder.seen_at = now
        return holder.slot

    def _take_slot(self) -> int:
        self._next_slot += 1
        return self._next_slot - 1

    def forget(self, replica_id: str) -> None:
        """Drop everything known of a replica (it left or restarted)."""
        holder = self._holders.pop(replica_id, None)
        if holder is None:
            return
        del self._by_slot[holder.slot]
        keep = ~(1 << holder.slot)
        masks = self._masks
        for h in holder.blocks:
            mask = masks[h] & keep
            if mask:
                masks[h] = mask
            else:
                del masks[h]
        self._free_slots.append(holder.slot)

    def sweep(self, now: float) -> None:
        """Forget replicas no candidate list has named for a while (at most once a second)."""
        if now - self._swept_at < _SWEEP_EVERY_S:
            return
        self._swept_at = now
        gone = [rid for rid, h in self._holders.items() if now - h.seen_at > _FORGET_UNSEEN_S]
        for replica_id in gone:
            self.forget(replica_id)

    # -- matching and learning --------------------------------------------------------

    def match(self, hashes: Sequence[int], alive: int) -> dict[int, int]:
        """For each slot in the mask ``alive``, how many leading blocks of ``hashes`` it
        holds; slots holding none are left out."""
        matched: dict[int, int] = {}
        masks = self._masks
        count = 0
        for h in hashes:
            holders = masks.get(h, 0) & alive
            dropped = alive ^ holders
            if dropped:
                if count:
                    _assign(matched, dropped, count)
                alive = holders
                if not alive:
                    return matched
            count += 1
        if count:
            _assign(matched, alive, count)
        return matched

    def record(self, slot: int, hashes: Sequence[int]) -> None:
        """Learn that the replica in ``slot`` now holds every block of ``hashes``."""
        holder = self._by_slot[slot]
        blocks = holder.blocks
        masks = self._masks
        bit = 1 << slot
        for h in reversed(hashes):
            if h in blocks:
                blocks.move_to_end(h)
            else:
                blocks[h] = None
                masks[h] = masks.get(h, 0) | bit
        keep = ~bit
        while len(blocks) > self.capacity_blocks:
            old, _ = blocks.popitem(last=False)
            mask = masks[old] & keep
            if mask:
                masks[old] = mask
            else:
                del masks[old]

    # -- what it holds ----------------------------------------------------------------

    def num_blocks(self) -> dict[str, int]:
        """Blocks indexed per replica id."""
        return {rid: len(h.blocks) for rid, h in self._holders.items()}

    @property
    def num_replicas(self) -> int:
        return len(self._holders)


def _assign(matched: dict[int, int], slots: int, count: int) -> None:
    while slots:
        low = slots & -slots
        matched[low.bit_length() - 1] = count
        slots ^= low
