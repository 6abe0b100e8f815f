"""The prefix index's parts on their own: the remembered hashes of shared leads, the
segments that bound each replica's table while keeping what it holds prefix-closed, and
the tables of a candidate list named again."""

from __future__ import annotations

import itertools
import random

from rayfleet.gateway.prefix_index import (
    BlockHasher,
    BlockTable,
    PrefixIndex,
    block_hashes,
    held_prefix,
)
from rayfleet.gateway.prompt_key import prompt_parts, prompt_text
from rayfleet.gateway.replicas import Replica

CHAT = "/v1/chat/completions"
BLOCK = 64


def text(rng: random.Random, num_chars: int) -> str:
    return "".join(rng.choice("ab \n\u00e9\U0001f600") for _ in range(num_chars))


def chain(rng: random.Random, num_blocks: int) -> list[int]:
    return [rng.getrandbits(62) for _ in range(num_blocks)]


def num_listed(table: BlockTable) -> int:
    return sum(len(segment.hashes) for segment in table.segments)


def recency(table: BlockTable, hashes: list[int]) -> list[int]:
    """Each block's segment's place from the least recently used."""
    place = {segment: n for n, segment in enumerate(table.segments)}
    return [place[table[h]] for h in hashes]


# -- the key ------------------------------------------------------------------------


def test_prompt_parts_split_the_prompt_text_after_the_first_message():
    tools = [{"type": "function", "function": {"name": "f"}}]
    messages = [
        {"role": "system", "content": "be brief"},
        {"role": "user", "content": [{"type": "text", "text": "hi"}]},
        {"role": "assistant", "content": "yes", "tool_calls": [{"id": "1"}]},
    ]
    body = {"messages": messages, "tools": tools}
    lead, rest = prompt_parts(CHAT, body)
    assert lead + rest == prompt_text(CHAT, body)
    assert lead.endswith("\x1esystem\x1fbe brief") and rest.startswith("\x1euser\x1fhi")
    assert prompt_parts(CHAT, {"messages": messages[:1]}) == ("\x1esystem\x1fbe brief", "")
    assert prompt_parts("/v1/completions", {"prompt": "abc"}) == ("", "abc")


def test_hashes_of_a_lead_and_a_rest_are_those_of_the_whole_text():
    """Whatever the lead's length (a partial last block, too short or too long to be
    remembered) and whether it was remembered, forgotten or never seen."""
    rng = random.Random(4)
    hasher = BlockHasher(BLOCK, num_leads=3)
    leads = [text(rng, n) for n in (0, 100, 4 * BLOCK, 4 * BLOCK + 1, 1000, 40_000)]
    leads += [text(rng, rng.randrange(5 * BLOCK, 30 * BLOCK)) for _ in range(4)]
    for _ in range(300):
        lead, rest = rng.choice(leads), text(rng, rng.randrange(0, 6 * BLOCK))
        hashes = hasher.hashes(lead, rest)
        assert hashes == block_hashes(lead + rest, BLOCK)
        hashes.append(0)  # the caller's list is its own
    assert len(hasher._leads) == 3


def test_a_chain_continues_after_a_given_hash():
    rng = random.Random(5)
    whole = text(rng, 10 * BLOCK + 7)
    head = block_hashes(whole[: 4 * BLOCK], BLOCK)
    assert head + block_hashes(whole[4 * BLOCK :], BLOCK, head[-1]) == block_hashes(whole, BLOCK)


# -- the table ----------------------------------------------------------------------


def test_tables_stay_bounded_prefix_closed_and_list_each_block_once():
    """Prompts that share prefixes of any length, some recorded again and again, on a
    small table: after every record the table is within its bound, each prompt recorded
    so far is held as a prefix, and every block is in exactly one segment."""
    rng = random.Random(6)
    index = PrefixIndex(capacity_blocks=300)
    table = BlockTable()
    trunks = [chain(rng, rng.randrange(1, 120)) for _ in range(8)]
    prompts: list[list[int]] = []
    for step in range(1500):
        if prompts and rng.random() < 0.3:
            hashes = rng.choice(prompts)  # the same prompt again
        else:
            trunk = rng.choice(trunks)
            hashes = trunk[: rng.randrange(0, len(trunk) + 1)] + chain(rng, rng.randrange(0, 60))
            prompts.append(hashes)
        held = held_prefix(table, hashes) if step % 2 else None
        index.record(table, hashes, held)
        assert len(table) <= 300
        assert num_listed(table) == len(table)
        places = recency(table, hashes)
        assert places == sorted(places, reverse=True)  # the head no older than the tail
    for hashes in prompts:
        held = held_prefix(table, hashes)
        assert all(h in table for h in hashes[:held])
        assert not any(h in table for h in hashes[held:])


def test_the_least_recently_used_blocks_go_first_a_segment_at_a_time():
    rng = random.Random(7)
    index = PrefixIndex(capacity_blocks=1024)  # segments of 64 blocks
    table = BlockTable()
    hot, old = chain(rng, 100), chain(rng, 300)
    index.record(table, old)
    index.record(table, hot)
    held = [held_prefix(table, old)]
    for _ in range(30):
        index.record(table, chain(rng, 50))  # 50 new blocks a time
        index.record(table, hot)
        assert held_prefix(table, hot) == len(hot)  # kept by its use
        held.append(held_prefix(table, old))
    steps = [a - b for a, b in itertools.pairwise(held)]
    assert held[-1] == 0 and all(0 <= step <= 64 for step in steps)  # the tail first


def test_recording_the_same_prompt_again_adds_nothing_to_keep():
    rng = random.Random(8)
    index = PrefixIndex(capacity_blocks=16384)
    table = BlockTable()
    hashes = chain(rng, 500)
    for _ in range(2000):
        index.record(table, hashes)
    assert len(table) == num_listed(table) == 500
    assert len(table.segments) <= 500 // 64 + 1


def test_a_prompt_longer_than_the_table_keeps_its_head():
    rng = random.Random(9)
    index = PrefixIndex(capacity_blocks=100)
    table = BlockTable()
    index.record(table, chain(rng, 80))
    long = chain(rng, 250)
    index.record(table, long)
    assert held_prefix(table, long) == 100 and len(table) == 100


# -- membership ---------------------------------------------------------------------


def test_the_same_candidates_again_reuse_their_tables_and_count_as_seen():
    index = PrefixIndex(capacity_blocks=100)
    fleet = [Replica(f"r{i}", "m", f"http://127.0.0.1:{9000 + i}", pid=i) for i in range(3)]
    tables = index.tables_of(fleet, 0.0)
    for step in range(1, 130):  # a fresh list of the same replicas each time, for 2 minutes
        assert index.tables_of(list(fleet), float(step)) is tables
        index.sweep(float(step))
    assert index.num_replicas == 3
    restarted = Replica("r1", "m", fleet[1].url, pid=999)
    index.record(tables[1], [1, 2, 3])
    again = index.tables_of([fleet[0], restarted, fleet[2]], 130.0)
    assert again[0] is tables[0] and again[1] is not tables[1] and not again[1]
    index.forget("r0")
    assert index.tables_of([fleet[0], restarted, fleet[2]], 131.0)[0] is not tables[0]


def test_a_replica_sized_from_its_kv_cache_keeps_no_more_than_it_holds():
    rng = random.Random(12)
    index = PrefixIndex(capacity_blocks=1000)
    small, large, late = (Replica(f"r{i}", "m", f"http://h:{i}", pid=i) for i in range(3))
    index.size("r2", 50)  # told before the replica is first named: kept for it
    t_small, t_large, t_late = index.tables_of([small, large, late], now=0.0)
    for table in (t_small, t_large, t_late):
        index.record(table, chain(rng, 300))
    assert [len(t) for t in (t_small, t_large, t_late)] == [300, 300, 50]

    index.size("r0", 120)  # learnt later: over the bound goes now, least recent first
    assert len(t_small) == num_listed(t_small) <= 120
    head = chain(rng, 100)
    index.record(t_small, head)
    assert held_prefix(t_small, head) == 100 and len(t_small) <= 120
    index.size("r1", 10**9)  # never above the index's own bound
    index.record(t_large, chain(rng, 2000))
    assert len(t_large) == 1000


def test_a_table_over_its_bound_loses_the_oldest_segment_s_last_blocks_only():
    """As vLLM frees a sequence's tail first, a shared prefix the cache has started to
    evict still hits for its head: the index keeps that head instead of the whole
    segment going (which sent the prefix's next request to a replica holding none of it)."""
    rng = random.Random(9)
    index = PrefixIndex(capacity_blocks=100)
    table = BlockTable()
    system = chain(rng, 50)
    index.record(table, system)
    index.record(table, chain(rng, 45))  # 95 blocks: under the bound
    assert held_prefix(table, system) == 50
    index.record(table, chain(rng, 8))  # 3 over: the system prompt is the oldest
    assert len(table) == 100 and num_listed(table) == 100
    assert held_prefix(table, system) == 47
    index.record(table, chain(rng, 60))  # more than it has left: gone whole, then the next
    assert held_prefix(table, system) == 0 and len(table) == 100 == num_listed(table)


def test_eviction_order_prefers_room_then_the_oldest_least_recently_used_segment():
    rng = random.Random(10)
    index = PrefixIndex(capacity_blocks=100)
    roomy, idle, busy = BlockTable(), BlockTable(), BlockTable()
    index.record(roomy, chain(rng, 40))
    index.record(idle, chain(rng, 100))  # full, its oldest used long ago
    for _ in range(5):
        index.record(busy, chain(rng, 30))  # full, and always evicting: its oldest is recent
    order = [index.eviction_order(t, 20) for t in (roomy, idle, busy)]
    assert order[0] < order[1] < order[2]
    assert index.eviction_order(roomy, 70) > index.eviction_order(BlockTable(), 70)
