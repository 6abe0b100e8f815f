"""Which prompt prefixes each replica holds: the key's block hashes and a bounded index.

    lead, rest = prompt_parts(path, body)   # prompt_key.py: the prompt, prefix-stable
    hashes = BlockHasher(64).hashes(lead, rest)  # one chained hash per whole block of 64 chars
    index = PrefixIndex(capacity_blocks=16384)
    index.size(replica_id, 4096)            # its KV cache holds about 4,096 blocks (vLLM says)
    tables = index.tables_of(replicas, now) # each replica's blocks; a restarted one empty
    held = held_prefix(tables[i], hashes)   # leading blocks of the prompt replica i holds
    index.record(tables[i], hashes, held)   # learn on send

The key. The prompt's text (prompt_key.py) is prefix-stable: turn k of a conversation is
a prefix of turn k+1. Only whole blocks of it are hashed (vLLM caches whole KV blocks only;
64 characters is about one 16-token block at about 4 characters per token), and block i's
hash covers blocks 0..i (``hash((previous, block))``), so one lookup answers "does this
replica hold the prompt up to block i". The hashes are Python's ``hash``, salted per
process: the index lives in one gateway process. The lead (tools and first message: a
system prompt many requests share) is hashed once per ``BlockHasher``'s memory of 64 leads:
a hit costs one str hash of the lead instead of a tuple hash per block: 8 us instead of 15
for the benchmark's 8 KB prompt with a 4 KB system prompt.

The index. Each replica's table maps a block's hash to its segment: up to 64 consecutive
blocks of one prompt, learnt together, aligned on multiples of 64 from the prompt's start.
Segments are kept least recently used first. Recording a prompt adds segments for the blocks
past its held prefix, last first, then makes the held blocks' segments the most recent, last
first: one lookup per segment, walking back from the prefix's last block to the start of
its segment. Past the table's capacity (``capacity_blocks``, or less once ``size`` has told
the index what the replica's KV cache holds) the least recently used segment loses its last
blocks, as many as are over; whole, if that is not enough, and then the next.
Each segment keeps when it was last used, on a clock of recordings the whole index shares,
so that replicas can be compared by what a new prefix would evict (``eviction_order``).
Whenever a block is learnt or used, so is every block before it, in a segment at least as
recent: a replica's blocks of any prompt form a prefix, a prompt's tail goes before its head
(as vLLM frees the tail of a sequence first), and ``held_prefix`` finds the prefix by
binary search (one lookup for a replica without the first block, about log2(blocks) for one
with it).

Measured by benchmarks/prefix_pick.py on the 2-core development machine (8 KB prompts, 64
replicas, 100k blocks), as the design stands against the one before it, an LRU dict per
replica in which recording moved each of the prompt's 128 blocks to the end (a delete and an
insert) and eviction deleted 1/16 of the capacity at once: recording cost 26 us of a 60 us
pick at p50 and 40 us when it evicted, with the tables out of cache; stamping all 128 blocks
in place and evicting generations of 64 with a check of each still cost 12-16 us. Segments
touch the 64 new blocks once to add and once to evict, and the held ones one lookup per
segment: 10 us. Before that, a table of hash -> bit mask of holders matched every replica in
one pass; its extra dictionary doubled the cache misses of recording and cost 50 us of a
120 us pick.

Memory: about 115 bytes per indexed block on CPython 3.11 (a dict entry, its share of the
table, the hash's int, its place in a segment; measured by benchmarks/prefix_pick.py), and
never more than ``capacity_blocks`` blocks: the default 16,384 blocks are about 2 MB per
replica, 125 MB for 64 replicas at most.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Container, Sequence
from dataclasses import dataclass, field
from itertools import repeat

from rayfleet.gateway.replicas import Replica

_FORGET_UNSEEN_S = 60.0  # a replica absent from every candidate list this long is gone
_SWEEP_EVERY_S = 1.0
_NUM_LEADS = 64  # leads whose block hashes are kept
_MIN_LEAD_BLOCKS = 4  # a shorter lead is hashed again
_MAX_LEAD_CHARS = 32_768  # a longer one too: at most 2 MB of ASCII leads kept
_SEGMENT_BLOCKS = 64  # at most, blocks learnt, used and evicted together


def block_hashes(text: str, block_chars: int, after: int | None = None) -> list[int]:
    """One hash per whole block of ``text``, each covering every block before it too (and
    the chain that ended in hash ``after``, when given)."""
    h = block_chars if after is None else after
    return [h := hash((h, block)) for block in _splitter(block_chars).findall(text)]


@functools.cache
def _splitter(block_chars: int) -> re.Pattern[str]:
    return re.compile(f".{{{block_chars}}}", re.DOTALL)  # whole blocks, in C


class BlockHasher:
    """``block_hashes`` of ``prompt_parts``, remembering the hashes of the last
    ``num_leads`` leads: one str hash of a 4 KB system prompt costs what 5 of its blocks do."""

    def __init__(self, block_chars: int, num_leads: int = _NUM_LEADS):
        self.block_chars = block_chars
        self.num_leads = num_leads
        self._leads: dict[str, list[int]] = {}  # least recently used first

    def hashes(self, lead: str, rest: str) -> list[int]:
        size = self.block_chars
        if not _MIN_LEAD_BLOCKS * size <= len(lead) <= _MAX_LEAD_CHARS:
            return block_hashes(lead + rest, size)
        leads = self._leads
        known = leads.pop(lead, None)
        if known is None:
            known = block_hashes(lead, size)
            if len(leads) >= self.num_leads:
                del leads[next(iter(leads))]
        leads[lead] = known
        # The lead's last partial block continues into the rest.
        return known + block_hashes(lead[len(known) * size :] + rest, size, known[-1])


class Segment:
    """Up to ``_SEGMENT_BLOCKS`` consecutive blocks of one prompt, from block ``start``, learnt
    together; they are used together, and forgotten from the last. ``used``: the index's
    count of recordings when it was last learnt or used."""

    __slots__ = ("hashes", "start", "used")

    def __init__(self, start: int, hashes: list[int], used: int = 0):
        self.start = start
        self.hashes = hashes
        self.used = used


class BlockTable(dict[int, Segment]):
    """One replica's blocks: hash -> its segment, with the segments least recently used first."""

    __slots__ = ("capacity", "segments")

    def __init__(self, capacity: int | None = None) -> None:
        super().__init__()
        self.segments: dict[Segment, None] = {}
        self.capacity = capacity  # blocks at most; None: the index's capacity_blocks


def held_prefix(blocks: Container[int], hashes: Sequence[int], guess: int = 1) -> int:
    """How many leading blocks of ``hashes`` are in ``blocks`` (prefix-closed), tried at
    ``guess`` first: replicas that hold a shared prefix mostly hold the same length."""
    if not hashes or hashes[0] not in blocks:
        return 0
    return held_length(blocks, hashes, guess)


def held_length(blocks: Container[int], hashes: Sequence[int], guess: int) -> int:
    """``held_prefix`` of ``blocks`` that hold the first block of ``hashes``."""
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


@dataclass(slots=True)
class _Holder:
    """One replica's place in the index."""

    replica: Replica
    url: str
    pid: int
    seen_at: float
    blocks: BlockTable = field(default_factory=BlockTable)


class PrefixIndex:
    """Bounded LRUs of block hashes, one per replica."""

    def __init__(self, capacity_blocks: int):
        self.capacity_blocks = capacity_blocks
        self._segment_blocks = max(1, min(_SEGMENT_BLOCKS, capacity_blocks // 4))
        self._holders: dict[str, _Holder] = {}  # by replica id
        self._sized: dict[str, int] = {}  # by replica id: its own bound, once known (size)
        self._started: dict[str, float] = {}  # by replica id: its engine's start time
        self._swept_at = 0.0
        # The last candidate list, its holders and tables, and when it was last named.
        self._named: list[Replica] = []
        self._named_holders: list[_Holder] = []
        self._named_tables: list[BlockTable] = []
        self._named_at = 0.0
        self._num_recorded = 0  # recordings so far: the segments' clock

    # -- membership -------------------------------------------------------------------

    def tables_of(self, replicas: Sequence[Replica], now: float) -> list[BlockTable]:
        """Each replica's block table, in order (a list to read, not to change); a replica
        first seen, or whose url or pid changed (a restart), gets an empty one."""
        if replicas == self._named:  # the same candidates as the last time: mostly so
            self._named_at = now
            return self._named_tables
        self._note_named()
        holders = self._holders
        named = []
        for replica in replicas:
            holder = holders.get(replica.replica_id)
            if holder is None or holder.replica is not replica:
                holder = self._admit(replica, holder)
            named.append(holder)
        self._named, self._named_holders, self._named_at = list(replicas), named, now
        self._named_tables = [holder.blocks for holder in named]
        return self._named_tables

    def table_of(self, replica: Replica) -> BlockTable:
        """The block table of one replica (an empty one if first seen or restarted)."""
        holder = self._holders.get(replica.replica_id)
        if holder is None or holder.replica is not replica:
            holder = self._admit(replica, holder)
            self._named = []  # the cached candidate tables may name the one replaced
        return holder.blocks

    def _note_named(self) -> None:
        """The replicas of the last candidate list were seen when it was last named."""
        for holder in self._named_holders:
            holder.seen_at = self._named_at

    def _admit(self, replica: Replica, known: _Holder | None) -> _Holder:
        if known is not None and (known.url, known.pid) == (replica.url, replica.pid):
            known.replica = replica  # the same server, in a Replica object of its own
            return known
        table = BlockTable(self._sized.get(replica.replica_id))
        holder = _Holder(replica, replica.url, replica.pid, 0.0, table)
        self._holders[replica.replica_id] = holder
        return holder

    def size(self, replica_id: str, num_blocks: int) -> None:
        """Bound a replica's table to ``num_blocks`` (what its KV cache holds), never above
        ``capacity_blocks``; the least recently used segments over it go now."""
        bound = max(1, min(num_blocks, self.capacity_blocks))
        self._sized[replica_id] = bound
        holder = self._holders.get(replica_id)
        if holder is not None:
            holder.blocks.capacity = bound
            self._evict(holder.blocks, len(holder.blocks) - bound)

    def started(self, replica_id: str, start_time: float) -> bool:
        """Note when a replica's engine started; True when that moved since the last
        note, a restart under the same url and pid: what it held is gone, and so is the
        replica's table here (its size bound stays)."""
        before = self._started.get(replica_id)
        self._started[replica_id] = start_time
        if before is None or before == start_time:
            return False
        self._holders.pop(replica_id, None)
        self._named = []
        return True

    def forget(self, replica_id: str) -> None:
        """Drop everything known of a replica (it left or restarted)."""
        self._holders.pop(replica_id, None)
        self._sized.pop(replica_id, None)
        self._started.pop(replica_id, None)
        self._named = []

    def sweep(self, now: float) -> None:
        """Forget replicas no candidate list has named for a while (at most once a second)."""
        if now - self._swept_at < _SWEEP_EVERY_S:
            return
        self._swept_at = now
        self._note_named()
        gone = [rid for rid, h in self._holders.items() if now - h.seen_at > _FORGET_UNSEEN_S]
        for replica_id in gone:
            self.forget(replica_id)

    # -- learning ---------------------------------------------------------------------

    def record(self, table: BlockTable, hashes: Sequence[int], held: int | None = None) -> None:
        """Learn that the replica of ``table`` now holds every block of ``hashes`` (as many
        as its capacity, of a longer prompt); the least recently used go.
        ``held``: ``held_prefix(table, hashes)``, when the caller has it already."""
        capacity = table.capacity or self.capacity_blocks
        if len(hashes) > capacity:
            hashes = hashes[:capacity]
        held = min(held_prefix(table, hashes) if held is None else held, len(hashes))
        segments = table.segments
        size = self._segment_blocks
        self._num_recorded = now = self._num_recorded + 1
        end = len(hashes)
        while end > held:  # the new blocks, last first, in segments aligned on ``size``
            start = max(held, (end - 1) // size * size)
            segment = Segment(start, list(hashes[start:end]), now)
            table.update(zip(segment.hashes, repeat(segment)))
            segments[segment] = None
            end = start
        at = held - 1
        while at >= 0:  # the held blocks' segments, last first: one lookup each
            segment = table[hashes[at]]
            del segments[segment]
            segments[segment] = None  # the most recent
            segment.used = now
            at = min(segment.start, at) - 1
        self._evict(table, len(table) - capacity)

    @staticmethod
    def _evict(table: BlockTable, num_blocks: int) -> None:
        """Forget ``num_blocks`` blocks, the least recently used segment's last first, as
        vLLM frees a sequence's tail first: a shared prefix that a cache has started to
        evict still hits for its head there, and the index says so."""
        segments = table.segments
        get = table.get
        while num_blocks > 0 and segments:
            segment = next(iter(segments))
            hashes = segment.hashes
            keep = max(0, len(hashes) - num_blocks)
            for h in hashes[keep:]:
                if get(h) is segment:  # not learnt again elsewhere (a hash collision)
                    del table[h]
            num_blocks -= len(hashes) - keep
            if keep:
                del hashes[keep:]
            else:
                del segments[segment]

    # -- what it holds ----------------------------------------------------------------

    def eviction_order(self, table: BlockTable, num_new_blocks: int) -> tuple[int, int]:
        """How little learning ``num_new_blocks`` more would cost the replica of ``table``,
        smaller first: a table with room for them evicts nothing (the emptier first); a full
        one evicts its least recently used segment, which costs less the longer ago it was
        used. A replica given more prefixes than its cache holds keeps evicting what it
        uses again soon: its oldest segment is recent, and new prefixes go elsewhere."""
        capacity = table.capacity or self.capacity_blocks
        if len(table) + num_new_blocks <= capacity:
            return (0, len(table))
        return (1, next(iter(table.segments)).used if table.segments else 0)

    def num_blocks(self) -> dict[str, int]:
        """Blocks indexed per replica id."""
        return {rid: len(h.blocks) for rid, h in self._holders.items()}

    @property
    def num_replicas(self) -> int:
        return len(self._holders)
