"""The prefix policy: its routing key, chained block hashes, the bounded index, the cost
trade-off, load spreading under one dominant prefix, and forgetting restarted replicas."""

from __future__ import annotations

import math
import random

import pytest

from rayfleet.config.routing import RoutingConfig
from rayfleet.gateway.prefix_index import (
    BlockTable,
    PrefixIndex,
    block_hashes,
    held_prefix,
)
from rayfleet.gateway.prefix_routing import PrefixRouting
from rayfleet.gateway.prompt_key import prompt_text
from rayfleet.gateway.replica_policy import RequestInfo
from rayfleet.gateway.replicas import Replica, ReplicaSet

CHAT = "/v1/chat/completions"
BLOCK = 64


def words(seed: int, num_chars: int) -> str:
    rng = random.Random(seed)
    return " ".join(f"w{rng.randrange(10**6)}" for _ in range(num_chars // 4))[:num_chars]


def chat(messages: list[dict], **extra) -> RequestInfo:
    return RequestInfo(CHAT, "m", {"model": "m", "messages": messages, **extra}, {})


def replicas(n: int) -> list[Replica]:
    return [Replica(f"r{i}", "m", f"http://127.0.0.1:{9000 + i}", pid=100 + i) for i in range(n)]


def prefix_policy(**options) -> PrefixRouting:
    return PrefixRouting(RoutingConfig(policy="prefix", **options), rng=random.Random(0))


# -- the key ------------------------------------------------------------------------


def test_each_chat_turn_extends_the_blocks_of_the_turn_before():
    tools = [{"type": "function", "function": {"name": "lookup", "parameters": {}}}]
    messages = [{"role": "system", "content": words(0, 700)}]
    previous: list[int] = []
    for turn in range(6):
        messages.append({"role": "user", "content": words(10 + turn, 150 + 37 * turn)})
        hashes = block_hashes(prompt_text(CHAT, chat(messages, tools=tools).body), BLOCK)
        assert hashes[: len(previous)] == previous
        assert len(hashes) > len(previous)
        previous = hashes
        reply = [{"type": "text", "text": words(20 + turn, 90)}]  # content as parts
        messages.append({"role": "assistant", "content": reply})


def test_tools_come_first_and_roles_count():
    tools = [{"type": "function", "function": {"name": "f"}}]
    plain = prompt_text(CHAT, {"messages": [{"role": "user", "content": "hi"}]})
    with_tools = prompt_text(
        CHAT, {"messages": [{"role": "user", "content": "hi"}], "tools": tools}
    )
    as_system = prompt_text(CHAT, {"messages": [{"role": "system", "content": "hi"}]})
    assert with_tools.startswith('[{"function"') and with_tools.endswith(plain)
    assert as_system != plain


def test_a_completion_is_keyed_on_its_prompt():
    assert prompt_text("/v1/completions", {"prompt": "abc"}) == "abc"
    assert prompt_text("/v1/completions", {"prompt": [1, 2, 3]}) == "[1,2,3]"


def test_block_hashes_are_chained_over_whole_blocks_only():
    a, b, c = "a" * BLOCK, "b" * BLOCK, "c" * BLOCK
    assert len(block_hashes(a + b + "tail", BLOCK)) == 2  # a partial block is not cached
    assert block_hashes(a + b, BLOCK)[:1] == block_hashes(a + c, BLOCK)[:1]
    # The same block after another prefix is another hash: each covers all before it.
    assert block_hashes(a + b, BLOCK)[1] != block_hashes(c + b, BLOCK)[1]
    assert block_hashes(b, BLOCK)[0] != block_hashes(a + b, BLOCK)[1]


# -- the index ----------------------------------------------------------------------


def test_index_stays_bounded_and_evicts_a_prompt_tail_first():
    index = PrefixIndex(capacity_blocks=160)
    (table,) = index.tables_of(replicas(1), now=0.0)
    first = block_hashes(words(1, 100 * BLOCK), BLOCK)
    index.record(table, first)
    for seed in range(2, 30):
        index.record(table, block_hashes(words(seed, 20 * BLOCK), BLOCK))
        assert len(table) <= 160 + 160 // 16
        held = held_prefix(table, first)
        assert all(h in table for h in first[:held])
        assert not any(h in table for h in first[held:])  # what is left is a prefix
    assert held_prefix(table, first) == 0  # the old prompt is gone by now


def test_held_prefix_agrees_with_a_scan_whatever_the_guess():
    rng = random.Random(3)
    for _ in range(300):
        hashes = [rng.getrandbits(60) for _ in range(rng.randrange(0, 40))]
        length = rng.randrange(0, len(hashes) + 1)
        table = dict.fromkeys(hashes[:length])
        table.update(dict.fromkeys(rng.getrandbits(60) for _ in range(5)))
        assert held_prefix(table, hashes, rng.randrange(-2, 45)) == length
    hashes = [rng.getrandbits(60) for _ in range(40)]
    tables = [dict.fromkeys(hashes[:n]) for n in (0, 5, 5, 40, 1)]
    assert [held_prefix(t, hashes) for t in tables] == [0, 5, 5, 40, 1]


# -- the pick -----------------------------------------------------------------------


def test_a_cached_replica_wins_until_its_extra_load_outweighs_the_saved_prefill():
    policy = prefix_policy(request_cost_blocks=10.0, load_factor=10.0)  # the cost alone
    fleet = replicas(2)
    system = {"role": "system", "content": words(5, 100 * BLOCK)}
    policy.pick(chat([system, {"role": "user", "content": "q0"}]), fleet[:1])  # r0 learns it
    request = chat([system, {"role": "user", "content": "q1"}])
    fleet[0].num_inflight = 9  # 9 x 10 = 90 blocks of queued work < 100 blocks saved
    assert policy.pick(request, fleet) is fleet[0]
    fleet[0].num_inflight = 11  # 110 > 100: the prefill elsewhere is cheaper
    assert policy.pick(request, fleet) is fleet[1]
    fleet[0].num_inflight = fleet[1].num_inflight = 11  # both hold it now: load decides
    fleet[1].num_inflight = 12
    assert policy.pick(request, fleet) is fleet[0]


def holding(hashes: list[int]) -> BlockTable:
    """A table holding ``hashes``, far under its capacity."""
    table = BlockTable()
    table.update(dict.fromkeys(hashes))  # type: ignore[arg-type]
    return table


def test_replicas_whose_queue_outweighs_the_best_are_skipped_without_changing_the_pick():
    """The pick skips looking up a replica whose queue alone costs more than the best so
    far; its choice, ties and random draws included, is that of comparing the cost of
    every replica under the load bound."""
    rng = random.Random(10)
    for trial in range(400):
        alpha = rng.choice((0.0, 0.5, 1.0, 2.5))
        cost_each = rng.choice((None, 0.5, 1.0, 3.0, 10.0))
        policy = PrefixRouting(
            RoutingConfig(policy="prefix", alpha=alpha, request_cost_blocks=cost_each),
            rng=random.Random(trial),
        )
        fleet = replicas(rng.randrange(1, 12))
        hashes = [rng.getrandbits(60) for _ in range(rng.randrange(0, 20))]
        tables = [holding(hashes[: rng.randrange(0, len(hashes) + 1)]) for _ in fleet]
        for r in fleet:
            r.num_inflight = rng.randrange(4)
        # Some replica is always under the bound (load_bound's promise).
        bound = max(rng.randrange(1, 6), min(r.num_inflight for r in fleet) + 1)
        held = [held_prefix(t, hashes) for t in tables]
        costs = [
            alpha * (len(hashes) - h) + r.num_inflight * policy.request_cost
            if r.num_inflight < bound
            else math.inf
            for r, h in zip(fleet, held, strict=True)
        ]
        tied = [i for i, cost in enumerate(costs) if cost == min(costs)]
        fewest = min(len(tables[i]) for i in tied)
        roomiest = [i for i in tied if len(tables[i]) == fewest]
        chosen = tied[0] if len(tied) == 1 else random.Random(trial).choice(roomiest)
        assert policy._cheapest(fleet, tables, hashes, bound) == (chosen, held[chosen])


def test_ties_are_broken_at_random_and_replicas_over_the_hard_limit_skipped():
    policy = prefix_policy(max_inflight=3)
    fleet = replicas(4)
    chosen = {
        policy.pick(chat([{"role": "user", "content": f"q{i}"}]), fleet).replica_id
        for i in range(40)
    }
    assert len(chosen) == 4
    system = {"role": "system", "content": words(6, 50 * BLOCK)}
    policy.pick(chat([system]), fleet[:1])
    fleet[0].num_inflight = 3
    assert policy.pick(chat([system, {"role": "user", "content": "x"}]), fleet) is not fleet[0]
    for r in fleet:
        r.num_inflight = 3  # all at the limit: the cost decides again
    assert policy.pick(chat([system, {"role": "user", "content": "y"}]), fleet) is fleet[0]


def test_prefixes_no_replica_holds_split_evenly_over_idle_replicas():
    """Eight groups' system prompts, each new to the fleet, reach two idle replicas: each
    goes where the index holds fewer blocks, so each replica gets four (by chance alone,
    5 and 3 or worse in most orders)."""
    for seed in range(20):
        policy = PrefixRouting(RoutingConfig(policy="prefix"), rng=random.Random(seed))
        fleet = replicas(2)
        systems = [
            {"role": "system", "content": words(seed * 10 + g, 30 * BLOCK)} for g in range(8)
        ]
        placed = [policy.pick(chat([s]), fleet) for s in systems]
        assert sorted(sum(r is f for r in placed) for f in fleet) == [4, 4]
        again = [policy.pick(chat([s, {"role": "user", "content": "and"}]), fleet) for s in systems]
        assert again == placed  # and each group stays where it went


def test_a_cached_replica_over_the_load_bound_is_passed_over_however_cheap():
    """Its prompt cached, a request costs about a block: by cost alone the holder of a
    hot prefix would take five requests more than any other. The load bound stops it."""
    system = {"role": "system", "content": words(9, 100 * BLOCK)}
    request = chat([system, {"role": "user", "content": "again"}])
    for load_factor, expected in ((0.25, "elsewhere"), (10.0, "r0")):
        policy = prefix_policy(request_cost_blocks=1.0, load_factor=load_factor)
        fleet = replicas(8)
        policy.pick(chat([system]), fleet[:1])  # r0 holds the prompt's 100 blocks
        fleet[0].num_inflight = 5  # bound: max(2, ceil(1.25 x 6 / 8)) = 2
        chosen = policy.pick(request, fleet)
        assert chosen is not None
        assert (chosen.replica_id if chosen is fleet[0] else "elsewhere") == expected


def test_one_dominant_prefix_spreads_without_a_hot_spot_and_keeps_its_hits():
    """8 replicas, each finishing one request per tick if it has any; about 7 arrivals
    per tick, all sharing one system prompt. Routing that held the prefix on one replica
    too long would pile up there; picks must stay within 1.25x of the mean."""
    rng = random.Random(7)
    policy = prefix_policy()
    fleet = replicas(8)
    system = {"role": "system", "content": words(8, 64 * BLOCK)}
    picks = {r.replica_id: 0 for r in fleet}
    hits = blocks = 0
    for tick in range(3000):
        for _ in range(rng.choice((6, 7, 8))):
            question = {"role": "user", "content": words(rng.randrange(10**9), 4 * BLOCK)}
            request = chat([system, question])
            hashes = block_hashes(prompt_text(CHAT, request.body), BLOCK)
            before = {
                r.replica_id: held_prefix(t, hashes)
                for r, t in zip(fleet, policy.index.tables_of(fleet, 0.0), strict=True)
            }
            chosen = policy.pick(request, fleet)
            assert chosen is not None
            chosen.num_inflight += 1
            if tick >= 1000:
                picks[chosen.replica_id] += 1
                hits += before[chosen.replica_id]
                blocks += len(hashes)
        for r in fleet:
            r.num_inflight = max(0, r.num_inflight - 1)
    mean = sum(picks.values()) / len(picks)
    assert max(picks.values()) <= 1.25 * mean
    assert max(r.num_inflight for r in fleet) < 30  # no queue grew without bound
    assert hits / blocks > 0.9  # 64 of 68 blocks: affinity kept where it pays


def test_a_restarted_replica_is_forgotten_and_a_copy_of_the_same_is_not():
    policy = prefix_policy(load_factor=10.0)  # the cost alone
    fleet = replicas(2)
    request = chat([{"role": "system", "content": words(9, 40 * BLOCK)}])
    policy.pick(request, fleet[:1])
    fleet[1].num_inflight = 0
    fleet[0].num_inflight = 5
    assert policy.pick(request, fleet) is fleet[0]  # 40 blocks saved > 5 x 1 of load
    fleet[0].num_inflight = 0
    same = Replica("r0", "m", fleet[0].url, pid=fleet[0].pid)  # same server, new object
    assert policy.index.num_blocks()["r0"] == 40
    policy.index.tables_of([same], 0.0)
    assert policy.index.num_blocks()["r0"] == 40
    restarted = Replica("r0", "m", fleet[0].url, pid=999)
    policy.index.tables_of([restarted], 0.0)
    assert policy.index.num_blocks()["r0"] == 0


def test_replica_set_gives_a_restarted_server_a_new_replica():
    replica_set = ReplicaSet(["m"])
    entry = {"replica_id": "r0", "model": "m", "url": "http://127.0.0.1:9000", "pid": 1}
    replica_set.update([entry])
    (first,) = replica_set.replicas("m")
    replica_set.update([entry])
    assert replica_set.replicas("m")[0] is first
    replica_set.update([{**entry, "pid": 2}])
    assert replica_set.replicas("m")[0] is not first


def test_replicas_gone_for_a_minute_are_forgotten():
    now = [0.0]
    policy = PrefixRouting(RoutingConfig(policy="prefix"), clock=lambda: now[0])
    fleet = replicas(2)
    policy.pick(chat([{"role": "user", "content": words(1, 10 * BLOCK)}]), fleet)
    assert policy.index.num_replicas == 2
    for step in range(1, 70):
        now[0] = float(step)
        policy.pick(chat([{"role": "user", "content": "q"}]), fleet[1:])
    assert set(policy.index.num_blocks()) == {"r1"}


@pytest.mark.parametrize("n", [0, 1])
def test_no_candidates_declines_and_short_prompts_still_pick(n):
    policy = prefix_policy()
    fleet = replicas(n)
    picked = policy.pick(chat([{"role": "user", "content": "hi"}]), fleet)
    assert picked is (fleet[0] if fleet else None)


def test_the_index_is_sized_from_the_kv_cache_tokens_vllm_reports():
    policy = prefix_policy(block_chars=64, index_blocks=4096)
    (replica,) = replicas(1)
    policy.size_index(replica, 1600)  # 1,600 tokens at 4 characters: 100 blocks of 64
    (table,) = policy.index.tables_of([replica], now=0.0)
    assert table.capacity == 100
    policy.size_index(replica, 10**7)
    assert table.capacity == 4096


def test_the_index_follows_the_characters_a_token_that_usage_reports():
    policy = prefix_policy(block_chars=64, index_blocks=4096)
    (replica,) = replicas(1)
    request = RequestInfo("/v1/completions", "m", {"model": "m", "prompt": "x" * 5000}, {})
    policy.observe_usage(replica, request, prompt_tokens=1000, cached_tokens=0)  # 5 a token
    assert policy.chars_per_token == 5.0
    policy.size_index(replica, 1600)  # 1,600 tokens at 5 characters: 125 blocks of 64
    (table,) = policy.index.tables_of([replica], now=0.0)
    assert table.capacity == 125
    policy.observe_usage(replica, request, prompt_tokens=0, cached_tokens=0)  # no usage: skip
    assert policy.chars_per_token == 5.0

    fixed = prefix_policy(block_chars=64, chars_per_token=4)
    fixed.observe_usage(replica, request, prompt_tokens=1000, cached_tokens=0)
    assert fixed.chars_per_token == 4


def test_usage_without_cached_tokens_still_sizes_the_index_but_counts_no_hit():
    policy = prefix_policy()
    (replica,) = replicas(1)
    request = RequestInfo("/v1/completions", "m", {"model": "m", "prompt": "x" * 600}, {})
    policy.observe_usage(replica, request, prompt_tokens=100, cached_tokens=None)
    assert policy.chars_per_token == 6.0
    assert policy.hit_rates() == (0.0, 0.0) and policy.num_realised_prompt_tokens == 0


def test_an_answer_takes_its_blocks_in_the_index_and_evicts_the_oldest_prefix():
    policy = prefix_policy(block_chars=64, index_blocks=16, chars_per_token=4)
    a, b = replicas(2)
    old = RequestInfo("/v1/completions", "m", {"model": "m", "prompt": words(1, 64 * 6)}, {})
    new = RequestInfo("/v1/completions", "m", {"model": "m", "prompt": words(2, 64 * 6 + 10)}, {})
    old_hashes = block_hashes(words(1, 64 * 6), BLOCK)
    for request in (old, new):
        assert policy.pick(request, [a]) is a
    (table,) = policy.index.tables_of([a], now=0.0)
    assert len(table) == 12 and held_prefix(table, old_hashes) == 6
    # 10 characters of the prompt's last block and 60 tokens of answer: 250 characters,
    # 3 whole blocks more; the oldest prompt's tail makes room for them.
    policy.observe_usage(a, new, prompt_tokens=100, cached_tokens=0, completion_tokens=60)
    assert len(table) == 15 and held_prefix(table, old_hashes) == 6
    policy.observe_usage(a, new, prompt_tokens=100, cached_tokens=0, completion_tokens=60)
    assert len(table) <= 16 and held_prefix(table, old_hashes) < 6
    new_hashes = block_hashes(words(2, 64 * 6 + 10), BLOCK)
    assert held_prefix(table, new_hashes) == 6  # the answered prompt stays, the newest
    assert policy.index.num_blocks().get(b.replica_id, 0) == 0  # b was never charged


def test_the_end_of_a_response_reuses_what_the_pick_worked_out_of_the_prompt():
    policy = prefix_policy(block_chars=64, chars_per_token=4)
    hashed: list[str] = []
    hashes = policy.hasher.hashes
    policy.hasher.hashes = lambda lead, rest: hashed.append(rest) or hashes(lead, rest)
    (a,) = replicas(1)
    request = RequestInfo("/v1/completions", "m", {"model": "m", "prompt": words(3, 64 * 5)}, {})
    assert policy.pick(request, [a]) is a
    policy.observe_usage(a, request, prompt_tokens=64, cached_tokens=0, completion_tokens=64)
    assert len(hashed) == 1  # the pick's hashes served the answer's charge
    (table,) = policy.index.tables_of([a], now=0.0)
    assert len(table) == 5 + 4  # the prompt's 5 blocks, the answer's 256 characters
    # A request the policy did not place (its memo empty) is worked out at the end.
    other = RequestInfo("/v1/completions", "m", {"model": "m", "prompt": words(4, 64 * 5)}, {})
    policy.observe_usage(a, other, prompt_tokens=64, cached_tokens=0, completion_tokens=64)
    assert len(hashed) == 2 and held_prefix(table, block_hashes(words(4, 64 * 5), BLOCK)) == 5


def test_an_answers_text_follows_the_prompt_and_takes_at_least_its_tokens_room():
    policy = prefix_policy(block_chars=64, chars_per_token=4)
    (a,) = replicas(1)
    prompt, answer = words(6, 64 * 3 + 10), words(7, 64 * 2)
    request = RequestInfo("/v1/completions", "m", {"model": "m", "prompt": prompt}, {})
    assert policy.wants_answer(request)
    assert policy.pick(request, [a]) is a
    # 100 tokens of 4 characters after the prompt's last 10: room for 6 blocks, of which
    # the text (10 + 128 characters) fills 2; placeholders take the other 4.
    policy.observe_usage(a, request, 20, 0, 100, answer)
    (table,) = policy.index.tables_of([a], now=0.0)
    assert len(table) == 3 + 6
    follow = block_hashes(prompt + answer + " and more", BLOCK)
    assert held_prefix(table, follow) == 5  # a request that repeats the answer hits it
    several = RequestInfo("/v1/completions", "m", {"model": "m", "prompt": "x", "n": 2}, {})
    embedding = RequestInfo("/v1/embeddings", "m", {"model": "m", "input": "x"}, {})
    assert not policy.wants_answer(several) and not policy.wants_answer(embedding)
    assert not prefix_policy(answer_text=False).wants_answer(request)  # the room alone
