"""The KV cache of a simulated replica: a pool of blocks with a prefix cache on top.

Blocks are counted, not stored. A request reserves the blocks of its prompt and output
when it is admitted (``allocate``); the blocks its prompt shares with cached ones are
referenced instead of taken. A prompt block gets its chained hash once it is computed
(``commit``), and from then on any request whose prompt starts the same way reuses it;
the answer's full blocks get theirs, chained on, when it ends (engine.py, ``cache_answer``).
When a request finishes (``free``), its hashed blocks stay cached but evictable, least
recently used first, and the tail of a sequence before its head (as vLLM frees them), so
a chain is cut from its end: an answer's blocks go before its prompt's, and they evict
older prefixes as any block does. Unhashed blocks return to the free pool. A block is evicted
only when a new allocation needs room.

Simplification, stated: vLLM allocates output blocks as tokens are generated and
preempts when it runs out; here the whole output is reserved at admission, so nothing
is ever preempted and a request that does not fit waits.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass, field


@dataclass
class Allocation:
    """The blocks one request holds: hashed ones by hash, and a count of unhashed ones."""

    hashes: list[int] = field(default_factory=list)
    num_anonymous: int = 0


class KVCache:
    """``num_blocks`` KV blocks; hashed blocks with no reference are the prefix cache."""

    def __init__(self, num_blocks: int):
        self.num_blocks = num_blocks
        self.refs: dict[int, int] = {}
        self.evictable: OrderedDict[int, None] = OrderedDict()
        self.num_anonymous = 0

    @property
    def num_used_blocks(self) -> int:
        """Blocks held by requests (the numerator of vLLM's kv_cache_usage_perc)."""
        return len(self.refs) + self.num_anonymous

    @property
    def num_free_blocks(self) -> int:
        return self.num_blocks - self.num_used_blocks - len(self.evictable)

    @property
    def num_cached_blocks(self) -> int:
        return len(self.refs) + len(self.evictable)

    def num_hit_blocks(self, hashes: list[int]) -> int:
        """How many leading blocks of a prompt are cached (held or evictable)."""
        for i, h in enumerate(hashes):
            if h not in self.refs and h not in self.evictable:
                return i
        return len(hashes)

    def can_allocate(self, hit_hashes: list[int], num_new_blocks: int) -> bool:
        """Whether a request reusing ``hit_hashes`` and needing ``num_new_blocks`` more fits."""
        num_revived = sum(1 for h in hit_hashes if h in self.evictable)
        return num_new_blocks <= self.num_free_blocks + len(self.evictable) - num_revived

    def allocate(self, hit_hashes: list[int], num_new_blocks: int) -> Allocation:
        """Reference the cached blocks, then take new ones, evicting LRU blocks for room."""
        for h in hit_hashes:
            if h in self.evictable:
                del self.evictable[h]
                self.refs[h] = 1
            else:
                self.refs[h] += 1
        while self.num_free_blocks < num_new_blocks:
            self.evictable.popitem(last=False)
        self.num_anonymous += num_new_blocks
        return Allocation(list(hit_hashes), num_new_blocks)

    def commit(self, allocation: Allocation, block_hash: int) -> None:
        """A computed block gets its hash (unless another request cached it first)."""
        if allocation.num_anonymous == 0 or block_hash in self.refs:
            return
        if block_hash in self.evictable:
            return
        allocation.num_anonymous -= 1
        self.num_anonymous -= 1
        allocation.hashes.append(block_hash)
        self.refs[block_hash] = 1

    def free(self, allocation: Allocation) -> None:
        """Release a request's blocks: hashed ones become evictable, tail first."""
        for h in reversed(allocation.hashes):
            self.refs[h] -= 1
            if self.refs[h] == 0:
                del self.refs[h]
                self.evictable[h] = None
        self.num_anonymous -= allocation.num_anonymous
        allocation.hashes.clear()
        allocation.num_anonymous = 0
