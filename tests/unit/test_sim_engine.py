"""The simulator's engine without HTTP: cache, scheduling caps, and the latency model."""

from __future__ import annotations

import asyncio
import time

import pytest

from rayfleet.errors import RayfleetError
from rayfleet.sim.cache import KVCache
from rayfleet.sim.engine import Engine, SimRequest
from rayfleet.sim.spec import EngineSpec, spec_from_dict
from rayfleet.sim.tokens import (
    OUTPUT_TOKEN_TEXT,
    block_hashes,
    num_tokens,
    partial_block,
    render_chat,
)


def make_spec(**overrides: object) -> EngineSpec:
    values: dict[str, object] = {
        "step_s": 0.001,
        "prefill_token_s": 1e-4,
        "decode_seq_s": 1e-4,
        "max_num_batched_tokens": 2048,
        "max_num_seqs": 16,
        "num_gpu_blocks": 1024,
    }
    values.update(overrides)
    return EngineSpec(**values)  # type: ignore[arg-type]


def make_request(text: str, max_tokens: int = 4, block_size: int = 16) -> SimRequest:
    hashes = block_hashes(text, block_size)
    return SimRequest(num_tokens(text), max_tokens, hashes, partial_block(text, block_size))


def run_to_end(engine: Engine) -> None:
    while engine.running or engine.waiting:
        engine.finish(engine.schedule())


def test_tokens_are_four_characters_and_blocks_are_chained() -> None:
    assert num_tokens("a" * 64) == 16 and num_tokens("a" * 65) == 17
    a = block_hashes("x" * 64 + "y" * 64, 16)
    b = block_hashes("z" * 64 + "y" * 64, 16)
    assert len(a) == 2 and a[1] != b[1]  # same block, different prefix: different hash
    assert block_hashes("x" * 127, 16) == a[:1]  # a partial block is never hashed


def test_chat_turns_render_as_prefixes_of_the_next() -> None:
    turn1 = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi"}]
    turn2 = [*turn1, {"role": "assistant", "content": "hello"}, {"role": "user", "content": "q"}]
    assert render_chat(turn2).startswith(render_chat(turn1).removesuffix("<assistant>"))


def test_cache_evicts_least_recent_unreferenced_blocks_tail_first() -> None:
    cache = KVCache(num_blocks=4)
    first = cache.allocate([], 2)
    cache.commit(first, 11)
    cache.commit(first, 12)
    cache.free(first)
    assert cache.num_cached_blocks == 2 and cache.num_free_blocks == 2
    second = cache.allocate([], 3)  # one block more than is free: evicts the tail (12)
    assert cache.num_hit_blocks([11, 12]) == 1
    assert not cache.can_allocate([], 2)  # 3 held, 1 cached: only 1 more fits
    cache.free(second)
    assert cache.num_free_blocks == 3 and cache.num_used_blocks == 0


def test_a_held_block_is_never_evicted() -> None:
    cache = KVCache(num_blocks=2)
    held = cache.allocate([], 1)
    cache.commit(held, 7)
    assert cache.can_allocate([], 1) and not cache.can_allocate([], 2)
    shared = cache.allocate([7], 1)
    assert cache.refs[7] == 2 and cache.num_free_blocks == 0
    cache.free(held)
    cache.free(shared)
    assert cache.num_hit_blocks([7]) == 1


def test_admission_caps_running_requests_at_max_num_seqs() -> None:
    engine = Engine(make_spec(max_num_seqs=4))
    for i in range(10):
        engine.submit(make_request(f"{i:04d}" * 20))
    step = engine.schedule()
    assert len(step.chunks) == 4 and len(engine.waiting) == 6


def test_prefill_chunks_and_decodes_share_the_token_budget() -> None:
    engine = Engine(make_spec(max_num_batched_tokens=100, max_num_seqs=8))
    for i in range(3):
        engine.submit(make_request(f"{i:04d}" * 80))  # 80 tokens each
    step = engine.schedule()
    assert [n for _, n in step.chunks] == [80, 20] and len(engine.waiting) == 1
    engine.finish(step)
    step = engine.schedule()  # request 0 decodes (1 token), 1 goes on, 2 starts
    assert len(step.decodes) == 1 and [n for _, n in step.chunks] == [60, 39]
    assert step.num_prefill_tokens + len(step.decodes) == 100


def test_a_request_that_does_not_fit_waits_until_blocks_free() -> None:
    engine = Engine(make_spec(num_gpu_blocks=10))
    engine.submit(make_request("a" * 64 * 6, max_tokens=16))  # 7 blocks
    engine.submit(make_request("b" * 64 * 6, max_tokens=16))
    engine.schedule()
    assert len(engine.running) == 1 and len(engine.waiting) == 1
    while engine.running:
        engine.finish(engine.schedule())
    assert engine.waiting and engine.cache.num_used_blocks == 0
    engine.schedule()
    assert len(engine.running) == 1 and not engine.waiting  # in, now that blocks are free


def test_a_cached_prefix_is_not_prefilled_again() -> None:
    engine = Engine(make_spec())
    prompt = "s" * 64 * 10 + "question one"
    engine.submit(make_request(prompt))
    while engine.running or engine.waiting:
        engine.finish(engine.schedule())
    again = make_request(prompt[:-3] + "two")
    engine.submit(again)
    step = engine.schedule()
    assert (
        again.num_cached_tokens == 160 and step.num_prefill_tokens == again.num_prompt_tokens - 160
    )
    assert engine.stats.prefix_cache_hits == 160


def test_a_fully_cached_prompt_still_computes_its_last_block() -> None:
    engine = Engine(make_spec())
    prompt = "p" * 64 * 4
    for _ in range(2):
        request = make_request(prompt)
        engine.submit(request)
        while engine.running or engine.waiting:
            engine.finish(engine.schedule())
    assert request.num_cached_tokens == 48  # 3 of 4 blocks, as vLLM recomputes the last token


def test_an_answer_stays_cached_for_the_next_turn_and_takes_room_like_a_prompt() -> None:
    engine = Engine(make_spec(num_gpu_blocks=12))
    turn = render_chat([{"role": "user", "content": "q" * 150}])  # 2 full blocks, 40 chars on
    engine.submit(make_request(turn, max_tokens=40))  # 160 characters: 3 full blocks more
    run_to_end(engine)
    assert engine.cache.num_cached_blocks == 5
    answer = OUTPUT_TOKEN_TEXT * 40
    second = make_request(
        render_chat(
            [
                {"role": "user", "content": "q" * 150},
                {"role": "assistant", "content": answer},
                {"role": "user", "content": "and then?"},
            ]
        )
    )
    engine.submit(second)
    engine.schedule()
    assert second.num_cached_tokens == 5 * 16  # the first turn's prompt and answer
    run_to_end(engine)
    # A long answer to another prompt evicts the oldest blocks, as a prompt would.
    engine.submit(make_request("x" * 64, max_tokens=16 * 8))
    run_to_end(engine)
    assert engine.cache.num_hit_blocks(second.hashes) == 3  # 12 blocks: 2 of 5 went, last first


def test_step_cost_is_the_latency_model() -> None:
    spec = make_spec(step_s=0.002, prefill_token_s=1e-5, decode_seq_s=3e-4)
    assert spec.step_cost_s(1000, 4) == pytest.approx(0.002 + 0.01 + 0.0012)


async def _ttft_s(engine: Engine, text: str) -> tuple[float, SimRequest]:
    request = make_request(text, max_tokens=1)
    start = time.monotonic()
    engine.submit(request)
    await request.events.get()
    ttft_s = time.monotonic() - start
    assert await request.events.get() is None
    return ttft_s, request


def test_ttft_grows_with_uncached_tokens_and_a_cached_prefix_cuts_it() -> None:
    async def main() -> tuple[float, float, float, SimRequest]:
        engine = Engine(make_spec(step_s=0.001, prefill_token_s=1e-4))
        task = asyncio.get_running_loop().create_task(engine.run())
        short_s, _ = await _ttft_s(engine, "a" * 400)  # 100 tokens: 11 ms
        long_s, _ = await _ttft_s(engine, "b" * 4000)  # 1000 tokens: 101 ms
        cached_s, cached = await _ttft_s(engine, "b" * 3990 + "c" * 10)  # 8 tokens computed
        task.cancel()
        return short_s, long_s, cached_s, cached

    short_s, long_s, cached_s, cached = asyncio.run(main())
    assert long_s >= 0.1 and short_s < long_s  # a sleep is never early
    assert cached.num_cached_tokens == 992 and cached_s < long_s / 2


def test_spec_refuses_unknown_keys_and_inconsistent_limits() -> None:
    with pytest.raises(RayfleetError, match=r"unknown key.*step_ms"):
        spec_from_dict({"step_ms": 4})
    with pytest.raises(RayfleetError, match=r"max_num_batched_tokens \(8\).*max_num_seqs \(16\)"):
        make_spec(max_num_batched_tokens=8)
    assert (
        spec_from_dict({"step_s": 0.01, "calibration": {"mean_abs_rel_error": 0.1}}).step_s == 0.01
    )
