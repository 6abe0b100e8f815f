"""The prefix policy's self-check: the cached tokens a replica reports in ``usage`` reach the
policy and /metrics, streamed (the usage chunk before [DONE]) and whole, checked against
the simulator's own prefix cache counters."""

from __future__ import annotations

import asyncio
import json
import random
from typing import Any

import aiohttp
import openai
import pytest
from aiohttp import web

from rayfleet.config import RoutingConfig
from rayfleet.gateway import policy_feedback
from rayfleet.gateway.app import Gateway
from rayfleet.gateway.policies import Policies
from rayfleet.gateway.prefix_routing import PrefixRouting
from rayfleet.gateway.prompt_key import assistant_turn, prompt_text
from rayfleet.gateway.response_end import answer_text, usage_tokens
from rayfleet.gateway.routing import TimedPolicy
from rayfleet.gateway.server import start_gateway
from rayfleet.sim import EngineSpec, SimFleet
from rayfleet.sim.spec import CHARS_PER_TOKEN
from tests.unit.hostile import until

CHAT = "/v1/chat/completions"
BLOCK = 64  # the prefix policy's block_chars by default


def test_usage_is_read_from_the_end_of_a_body_or_a_stream():
    usage = {"prompt_tokens": 70, "total_tokens": 74, "completion_tokens": 4,
             "prompt_tokens_details": {"cached_tokens": 64}}  # fmt: skip
    chunk = b"data: " + json.dumps({"choices": [], "usage": usage}).encode() + b"\n\n"
    assert usage_tokens(chunk + b"data: [DONE]\n\n") == (70, 64, 4)
    compact = json.dumps({"choices": [{"text": "x"}], "usage": usage}, separators=(",", ":"))
    assert usage_tokens(compact.encode()) == (70, 64, 4)
    bare = b'{"usage":{"prompt_tokens":5,"prompt_tokens_details":null}}'
    assert usage_tokens(bare) == (5, None, 0)
    assert usage_tokens(b'data: {"choices":[{"text":" tok"}]}\n\ndata: [DONE]\n\n') is None
    assert usage_tokens(b"") is None


def sse(*events: dict) -> bytes:
    return b"".join(b"data: " + json.dumps(e).encode() + b"\n\n" for e in events)


def test_the_answers_text_is_read_from_a_whole_body_or_a_streams_pieces():
    chat = {"choices": [{"index": 0, "message": {"role": "assistant", "content": 'a "b"\n'}}]}
    assert answer_text(json.dumps(chat).encode(), streamed=False, chat=True) == 'a "b"\n'
    text = {"choices": [{"index": 0, "text": "once \u00e9"}], "usage": {"prompt_tokens": 3}}
    assert answer_text(json.dumps(text, ensure_ascii=False).encode(), False, False) == "once \u00e9"
    role = {"choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}}]}
    pieces = [{"choices": [{"index": 0, "delta": {"content": c}, "logprobs": None}]}
              for c in ("Hel", 'lo "x"', " \\ end")]  # fmt: skip
    usage = {"choices": [], "usage": {"prompt_tokens": 9, "completion_tokens": 3}}
    stream = sse(role, *pieces, usage) + b"data: [DONE]\n\n"
    assert answer_text(stream, streamed=True, chat=True) == 'Hello "x" \\ end'
    compact = b'data: {"choices":[{"index":0,"text":"a\\u00e9","logprobs":null}]}\n\n'
    assert answer_text(compact + compact, streamed=True, chat=False) == "a\u00e9a\u00e9"
    assert answer_text(b"data: [DONE]\n\n", streamed=True, chat=True) is None
    assert answer_text(b"{not json", streamed=False, chat=True) is None
    assert answer_text(b'{"choices": []}', streamed=False, chat=False) is None


def body(system: str, i: int, stream: bool, include_usage: bool) -> dict:
    request: dict = {"model": "m", "prompt": f"{system} question {i}", "max_tokens": 3}
    if stream:
        request["stream"] = True
        if include_usage:
            request["stream_options"] = {"include_usage": True}
    return request


async def prefix_gateway(
    entries: list[dict], **options: Any
) -> tuple[Gateway, web.AppRunner, str, PrefixRouting]:
    """A gateway serving model "m" from ``entries`` with the prefix policy, started: the
    gateway, its runner, its base URL and the policy."""

    async def source():
        return entries

    policies = Policies.plain(["m"])
    policies.routing = {"m": RoutingConfig(policy="prefix")}
    gateway = Gateway(["m"], source, policies=policies, **options)
    runner = await start_gateway(gateway, "127.0.0.1", 0)
    host, port = runner.addresses[0][:2]
    timed = gateway.dispatcher.replica_policies["m"]
    assert isinstance(timed, TimedPolicy) and isinstance(timed.policy, PrefixRouting)
    return gateway, runner, f"http://{host}:{port}", timed.policy


async def send_all(urls: list[str], system: str) -> tuple[PrefixRouting, str]:
    entries = [{"replica_id": f"r{i}", "model": "m", "url": u} for i, u in enumerate(urls)]
    gateway, runner, base, policy = await prefix_gateway(entries)
    url = f"{base}/v1/completions"
    try:
        async with aiohttp.ClientSession() as session:
            # Streamed without usage (nothing to read), streamed with usage, and whole.
            kinds = [(True, False)] * 2 + [(True, True)] * 3 + [(False, False)] * 3
            for i, (stream, usage) in enumerate(kinds):
                async with session.post(url, json=body(system, i, stream, usage)) as response:
                    assert response.status == 200
                    await response.read()
        metrics = gateway.metrics.render().decode()
    finally:
        await runner.cleanup()
    return policy, metrics


def test_realised_hits_reach_the_prefix_policy_and_metrics_as_the_replica_counted_them():
    rng = random.Random(3)
    system = " ".join(f"rule {rng.randrange(10**6)}" for _ in range(200))
    spec = EngineSpec(step_s=0.0005, prefill_token_s=0.0, decode_seq_s=0.0)
    with SimFleet(spec, num_replicas=2) as fleet:
        policy, metrics = asyncio.run(send_all(fleet.urls, system))
        stats = fleet.stats()
    hits = sum(s["prefix_cache_hits"] for s in stats)
    assert hits > 0
    # The last six of eight responses carried a usage. The first request found the cache
    # cold; the seven after it hit the same shared prompt (same length, same replica).
    assert policy.num_realised_hit_tokens * 7 == hits * 6
    assert policy.num_realised_prompt_tokens * 8 == sum(s["prompt_tokens"] for s in stats) * 6
    predicted, realised = policy.hit_rates()
    assert 0.5 < realised <= 1.0 and 0.5 < predicted <= 1.0
    served = [s for s in stats if s["prefix_cache_queries"]]
    assert len(served) == 1  # one shared prefix, one replica
    replica = f"r{served[0]['replica']}"
    line = f'rayfleet_prefix_realised_hit_tokens_total{{model="m",replica="{replica}"}}'
    assert f"{line} {float(policy.num_realised_hit_tokens)}" in metrics
    prompt_line = f'rayfleet_prefix_usage_prompt_tokens_total{{model="m",replica="{replica}"}}'
    assert f"{prompt_line} {float(policy.num_realised_prompt_tokens)}" in metrics


def test_a_replica_restarted_under_the_same_pid_is_forgotten_by_its_start_time():
    """The simulator's restart keeps its url (and the source its pid) but moves its
    ``process_start_time_seconds``: the gateway reads it with the replica's /metrics, and
    the prefix index of that replica starts empty."""

    async def main(urls: list[str]) -> tuple[dict[str, int], dict[str, int]]:
        entries = [{"replica_id": "r0", "model": "m", "url": urls[0], "pid": 7}]
        gateway, runner, base, policy = await prefix_gateway(entries, replica_metrics_period_s=0.05)
        index = policy.index
        gauges = gateway.replica_gauges
        assert gauges is not None
        try:
            async with aiohttp.ClientSession() as session:
                for i in range(3):
                    url = f"{base}/v1/completions"
                    async with session.post(url, json=body("shared " * 80, i, False, False)) as r:
                        assert r.status == 200
                held = index.num_blocks()
                # Once the gateway has read the start time, the replica restarts.
                await until(lambda: any(s and s.start_time for s in gauges.readings.values()))
                async with session.post(urls[0] + "/simulator/restart") as r:
                    assert r.status == 200
                await until(lambda: index.num_blocks().get("r0", 0) == 0)
                return held, index.num_blocks()
        finally:
            await runner.cleanup()

    spec = EngineSpec(step_s=0.0005, prefill_token_s=0.0, decode_seq_s=0.0)
    with SimFleet(spec, num_replicas=1) as fleet:
        held, after = asyncio.run(main(fleet.urls))
    assert held["r0"] > 0 and after.get("r0", 0) == 0


def test_a_chats_next_turn_is_predicted_to_hit_through_the_answer_as_the_replica_hits():
    """Turn 1 of a chat, whole and then streamed, through the gateway with the official
    client; turn 2 repeats turn 1's answer as the assistant's message. The prefix index
    predicts turn 2 to hit through that answer (the gateway read its text), and the
    simulator, which caches an answer's blocks as vLLM does, reports the hit there too."""
    rng = random.Random(5)
    system = " ".join(f"rule {rng.randrange(10**6)}" for _ in range(60))

    async def main(urls: list[str]) -> list[tuple[int, int, int, int]]:
        entries = [{"replica_id": "r0", "model": "m", "url": urls[0]}]
        _, runner, base, policy = await prefix_gateway(entries)
        client = openai.AsyncOpenAI(base_url=f"{base}/v1", api_key="unused")
        seen = []
        try:
            for n, stream in enumerate((False, True)):
                messages = [
                    {"role": "system", "content": system},
                    {"role": "user", "content": f"question {n} " * 20},
                ]
                first_key = prompt_text(CHAT, {"messages": messages})
                if stream:
                    chunks = await client.chat.completions.create(
                        model="m", messages=messages, max_tokens=40, stream=True,
                        stream_options={"include_usage": True},
                    )  # fmt: skip
                    answer = "".join(
                        [c.choices[0].delta.content or "" async for c in chunks if c.choices]
                    )
                else:
                    whole = await client.chat.completions.create(
                        model="m", messages=messages, max_tokens=40
                    )
                    answer = whole.choices[0].message.content or ""
                messages += [
                    {"role": "assistant", "content": answer},
                    {"role": "user", "content": "and then?"},
                ]
                before = policy.num_predicted_hit_blocks
                second = await client.chat.completions.create(
                    model="m", messages=messages, max_tokens=1
                )
                predicted = policy.num_predicted_hit_blocks - before
                through = len(first_key + assistant_turn(answer)) // BLOCK
                assert second.usage is not None and second.usage.prompt_tokens_details
                cached = second.usage.prompt_tokens_details.cached_tokens or 0
                seen.append((predicted, through, len(first_key) // BLOCK, cached))
        finally:
            await client.close()
            await runner.cleanup()
        return seen

    spec = EngineSpec(step_s=0.0005, prefill_token_s=0.0, decode_seq_s=0.0)
    with SimFleet(spec, num_replicas=1) as fleet:
        seen = asyncio.run(main(fleet.urls))
    for predicted, through, first_turn, cached in seen:
        assert predicted == through > first_turn, seen  # past turn 1, through its answer
        # 40 answer tokens of 4 characters: the simulator's hit goes past turn 1's prompt
        # (its own rendering; 16-token blocks) by at least one whole block of the answer.
        assert cached * CHARS_PER_TOKEN >= first_turn * BLOCK + BLOCK, seen


class RecordingPolicy:
    """A replica policy (one replica) that asks for answers and records what it is told."""

    def __init__(self) -> None:
        self.answers: list[str | None] = []

    def pick(self, request, replicas):
        return replicas[0] if replicas else None

    def wants_answer(self, request) -> bool:
        return True

    def observe_usage(self, replica, request, prompt, cached, completion, answer) -> None:
        self.answers.append(answer)


@pytest.mark.parametrize("relay", [True, False], ids=["relay", "aiohttp"])
def test_a_long_streams_answer_is_kept_up_to_the_limit_and_relayed_whole(monkeypatch, relay):
    monkeypatch.setattr(policy_feedback, "MAX_KEPT_BYTES", 2_000)
    words = [f"w{n:03d} " for n in range(100)]
    head = {"object": "chat.completion.chunk", "model": "m"}

    async def replica(request: web.Request) -> web.StreamResponse:
        await request.read()
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        for word in words:  # one event a write: the relay reads them piece by piece
            choice = {"index": 0, "delta": {"content": word}, "finish_reason": None}
            await response.write(sse({**head, "choices": [choice]}))
        usage = {"prompt_tokens": 5, "completion_tokens": 100}
        await response.write(sse({**head, "choices": [], "usage": usage}) + b"data: [DONE]\n\n")
        await response.write_eof()
        return response

    async def main() -> tuple[str, list[str | None]]:
        app = web.Application()
        app.router.add_post("/v1/chat/completions", replica)
        up = web.AppRunner(app, access_log=None)
        await up.setup()
        await web.TCPSite(up, "127.0.0.1", 0).start()
        host, port = up.addresses[0][:2]
        entries = [{"replica_id": "r0", "model": "m", "url": f"http://{host}:{port}"}]
        gateway, runner, base, _ = await prefix_gateway(entries, relay=relay)
        policy = RecordingPolicy()
        gateway.dispatcher.replica_policies["m"] = policy
        gateway.dispatcher.attempts.feedback.policies = {"m": policy}
        client = openai.AsyncOpenAI(base_url=f"{base}/v1", api_key="unused")
        try:
            chunks = await client.chat.completions.create(
                model="m", messages=[{"role": "user", "content": "count"}], stream=True
            )
            text = "".join([c.choices[0].delta.content or "" async for c in chunks if c.choices])
            await until(lambda: bool(policy.answers))
        finally:
            await client.close()
            await runner.cleanup()
            await up.cleanup()
        return text, policy.answers

    text, answers = asyncio.run(main())
    assert text == "".join(words)  # the client gets it all
    (answer,) = answers
    # The policy gets the answer's beginning: what fit in 2,000 bytes of events (about
    # 80 bytes each), not all 100 words, and nothing out of order.
    assert answer is not None and 10 < len(answer) < len(text) and text.startswith(answer)
