"""What one pick of the prefix policy costs, beside least load's, at fleet scale.

    .venv/bin/python benchmarks/prefix_pick.py [--replicas 64] [--indexed-blocks 100000]
                                               [--prompt-chars 8192] [--picks 5000]

The index is filled with ``--indexed-blocks`` blocks spread over ``--replicas`` replicas
(distinct 8 KB conversations, a few of them sharing system prompts), each replica's LRU
sized to hold its share so that every pick's learning evicts as in steady state (the fill
stops there, or once the index stops growing: it evicts a 64-block segment at a time, so a
full replica holds its share less half a segment on average). Then each timed pick
places a chat request of ``--prompt-chars`` characters (a 2,048-token prompt is about
8 KB): a shared system prompt that some replicas hold and a fresh question, with random
counts in flight. Timed is ``PrefixRouting.pick`` whole: the key text, the chained block
hashes (the system prompt's remembered), matching, the choice and recording the blocks on
the chosen replica, evicting what no longer fits. Prints p50 and p99 in microseconds for
prefix and least load and their ratio, and the index's memory per block (tracemalloc while
filling). Goal: p99 < 100 us.

Then the end of each of those responses: ``observe_usage`` with a usage of 2,048 prompt
tokens and a 256-token answer (the answer's blocks charged to the replica that served it),
given the request the pick was given, whose ``memo`` holds the prompt's hashes, and by
turns a copy with an empty memo, which must render and hash the prompt again (as every
response end did before the memo). Prints both and their ratio, and what reading the
text of a streamed answer of ``--answer-tokens`` tokens costs (``answer_text``, which
the gateway runs at the end of each response the prefix policy placed, unless
``routing.answer_text`` is false).
"""

from __future__ import annotations

import argparse
import gc
import json
import random
import statistics
import time
import tracemalloc
from collections.abc import Callable, Sequence

from rayfleet.config.routing import RoutingConfig
from rayfleet.gateway.least_load import LeastLoad
from rayfleet.gateway.prefix_routing import PrefixRouting
from rayfleet.gateway.replica_policy import RequestInfo
from rayfleet.gateway.replicas import Replica
from rayfleet.gateway.response_end import answer_text

CHAT = "/v1/chat/completions"


def text_of(rng: random.Random, num_chars: int) -> str:
    words = [f"w{rng.randrange(100_000)}" for _ in range(num_chars // 6 + 1)]
    return " ".join(words)[:num_chars]


def chat(system: str, question: str) -> RequestInfo:
    body = {
        "model": "m",
        "messages": [
            {"role": "system", "content": system},
            {"role": "user", "content": question},
        ],
    }
    return RequestInfo(CHAT, "m", body, {})


def fill(policy: PrefixRouting, replicas: Sequence[Replica], systems: Sequence[str], args) -> None:
    """Send distinct conversations until the index holds about ``indexed_blocks``, or until
    it stops growing (every replica full, evicting as much as each pick records)."""
    rng = random.Random(1)
    half = args.prompt_chars // 2
    most = num_since_most = 0
    while most < args.indexed_blocks and num_since_most < 2 * len(replicas):
        replica = rng.choice(replicas)
        request = chat(rng.choice(systems), text_of(rng, half))
        policy.pick(request, [replica])
        total = sum(policy.index.num_blocks().values())
        most, num_since_most = (total, 0) if total > most else (most, num_since_most + 1)


def percentiles_us(samples_ns: list[int]) -> tuple[float, float]:
    cuts = statistics.quantiles(samples_ns, n=100)
    return cuts[49] / 1000, cuts[98] / 1000


def time_picks(
    pick: Callable[[RequestInfo, Sequence[Replica]], Replica | None],
    requests: Sequence[RequestInfo],
    replicas: Sequence[Replica],
    rng: random.Random,
) -> list[int]:
    samples = []
    for request in requests:
        for replica in replicas:
            replica.num_inflight = rng.randrange(8)
        # A request of its own, as the gateway's is: what the pick keeps in its memo
        # goes with it, not kept alive by the list for the collector to walk.
        placed = copied(request)
        started = time.perf_counter_ns()
        pick(placed, replicas)
        samples.append(time.perf_counter_ns() - started)
    return samples


def copied(request: RequestInfo) -> RequestInfo:
    """``request`` with an empty memo."""
    return RequestInfo(request.path, request.model, request.body, request.headers)


def time_usage_ends(
    policy: PrefixRouting, requests: Sequence[RequestInfo], replicas: Sequence[Replica]
) -> tuple[list[int], list[int]]:
    """The response end of each request, picked again, with the pick's memo and (by
    turns, in alternating order) without it."""
    with_memo, without = [], []
    for n, request in enumerate(requests):
        placed = copied(request)
        replica = policy.pick(placed, replicas) or replicas[0]
        order = ((placed, with_memo), (copied(request), without))
        for info, samples in order if n % 2 else order[::-1]:
            started = time.perf_counter_ns()
            policy.observe_usage(replica, info, 2048, 1024, 256)
            samples.append(time.perf_counter_ns() - started)
    return with_memo, without


def time_answer_text(num_tokens: int, num_times: int) -> list[int]:
    """``answer_text`` of a chat stream of ``num_tokens`` one-token events, as vLLM
    frames them (compact JSON), with a usage chunk and [DONE]."""
    head = {"id": "chatcmpl-0", "object": "chat.completion.chunk", "created": 0, "model": "m"}
    event = {**head, "choices": [{"index": 0, "delta": {"content": " tok"}, "logprobs": None,
                                  "finish_reason": None}]}  # fmt: skip
    usage = {**head, "choices": [], "usage": {"prompt_tokens": 2048, "completion_tokens": 1}}
    events = [event] * num_tokens + [usage]
    body = b"".join(b"data: " + json.dumps(e, separators=(",", ":")).encode() + b"\n\n"
                    for e in events) + b"data: [DONE]\n\n"  # fmt: skip
    samples = []
    for _ in range(num_times):
        started = time.perf_counter_ns()
        answer_text(body, streamed=True, chat=True)
        samples.append(time.perf_counter_ns() - started)
    return samples


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--replicas", type=int, default=64)
    parser.add_argument("--indexed-blocks", type=int, default=100_000)
    parser.add_argument("--prompt-chars", type=int, default=8192)
    parser.add_argument("--picks", type=int, default=5000)
    parser.add_argument("--answer-tokens", type=int, default=256)
    args = parser.parse_args()

    rng = random.Random(0)
    replicas = [Replica(f"r{i}", "m", f"http://10.0.0.{i}:8000", pid=i) for i in range(64)]
    replicas = replicas[: args.replicas]
    per_replica = args.indexed_blocks // args.replicas + 1
    config = RoutingConfig(policy="prefix", index_blocks=per_replica)
    policy = PrefixRouting(config, rng=random.Random(0))
    systems = [text_of(rng, args.prompt_chars // 2) for _ in range(16)]

    tracemalloc.start()
    before = tracemalloc.get_traced_memory()[0]
    fill(policy, replicas, systems, args)
    after = tracemalloc.get_traced_memory()[0]
    tracemalloc.stop()
    indexed = sum(policy.index.num_blocks().values())

    half = args.prompt_chars // 2
    requests = [chat(rng.choice(systems), text_of(rng, half)) for _ in range(args.picks)]
    gc.collect()
    prefix_ns = time_picks(policy.pick, requests, replicas, random.Random(2))
    least_ns = time_picks(LeastLoad().pick, requests, replicas, random.Random(2))
    p50, p99 = percentiles_us(prefix_ns)
    l50, l99 = percentiles_us(least_ns)
    blocks = (
        len(requests[0].body["messages"][0]["content"] + requests[0].body["messages"][1]["content"])
        // config.block_chars
    )
    print(
        f"{args.replicas} replicas, {indexed} blocks indexed "
        f"({(after - before) / indexed:.0f} bytes per block), "
        f"prompt {args.prompt_chars} chars = about {blocks} blocks, {args.picks} picks"
    )
    print(f"{'policy':<12}{'p50 us':>10}{'p99 us':>10}")
    print(f"{'prefix':<12}{p50:>10.1f}{p99:>10.1f}")
    print(f"{'least_load':<12}{l50:>10.1f}{l99:>10.1f}")
    print(f"{'ratio':<12}{p50 / l50:>10.1f}{p99 / l99:>10.1f}")
    print(f"goal p99 < 100 us: {'met' if p99 < 100 else 'NOT met'}")
    memo_ns, fresh_ns = time_usage_ends(policy, requests, replicas)
    m50, m99 = percentiles_us(memo_ns)
    f50, f99 = percentiles_us(fresh_ns)
    print(f"\n{'response end':<24}{'p50 us':>10}{'p99 us':>10}")
    print(f"{'with the pick memo':<24}{m50:>10.1f}{m99:>10.1f}")
    print(f"{'prompt worked out again':<24}{f50:>10.1f}{f99:>10.1f}")
    print(f"{'ratio':<24}{m50 / f50:>10.2f}{m99 / f99:>10.2f}")
    t50, t99 = percentiles_us(time_answer_text(args.answer_tokens, 2000))
    label = f"answer text, {args.answer_tokens} tok"
    print(f"{label:<24}{t50:>10.1f}{t99:>10.1f}")


if __name__ == "__main__":
    main()
